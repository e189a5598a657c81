"""Every store of every shipped example, over REST and over GraphQL: the same values in the same words, and each
store's ``count`` the number of distinct keys a full scan finds.

Each example is filled once per session (``filled_example``: ``tests.support.filled_examples``); one node's
production query path answers both REST (``app.http.rest``) and a GraphQL query written here from the schema's
own types (every field of every value, as a client would select; a relation in its column's place as ``{ key }``,
which REST renders as the key the column stores).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from iqgraph.schema.naming import camel_case
from iqgraph.stores import StoreKind
from tests.support.filled_examples import Example

KEYS_PER_STORE = 8


async def _all(filled_example: Example, field: str, kind: StoreKind) -> list[dict[str, Any]]:
    """Return every entry of a key-value (all) or window (fetchAll) store, page by page."""
    scan = "all" if kind is not StoreKind.WINDOW else "fetchAll"
    node = filled_example.selection(field, scan, "edges", "node")
    query = f"query($a: String) {{ {camel_case(field)} {{ {scan}(first: 1000, after: $a) {{ edges {{ node {node} }} "
    query += "pageInfo { hasNextPage endCursor } } } }"
    found: list[dict[str, Any]] = []
    after = None
    while True:
        page = (await filled_example.graphql(query, {"a": after}))[camel_case(field)][scan]
        found += [edge["node"] for edge in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]


async def test_every_store_answers_the_same_over_rest_and_graphql_and_counts_its_distinct_keys(
    filled_example: Example,
) -> None:
    walked = set()
    for info in filled_example.queries.stores():
        store, kind, root = info.name, StoreKind(info.kind), camel_case(info.name)
        rest_count = (await filled_example.rest.get(f"/stores/{store}/count")).json()
        if kind is StoreKind.BLOOM:
            graphql = (await filled_example.graphql(f"{{ {root} {{ approximateCount }} }}"))[root]["approximateCount"]
            assert rest_count == {"store": store, "approximateCount": graphql}
        else:
            graphql = (await filled_example.graphql(f"{{ {root} {{ count }} }}"))[root]["count"]
            assert rest_count == {"store": store, "count": graphql}
        if kind is StoreKind.KEY_VALUE:
            entries = await _all(filled_example, store, kind)
            assert graphql == len({e["key"] for e in entries}), f"{store}: count is not its distinct keys"
            for entry in entries[:KEYS_PER_STORE]:
                key = entry["key"]
                selection = filled_example.selection(store, "get")
                key_type = "String" if info.key_type == "string" else "Long"
                query = f"query($k: {key_type}!) {{ {root} {{ get(key: $k) {selection} }} }}"
                value = (await filled_example.graphql(query, {"k": key}))[root]["get"]
                got = await filled_example.rest.get(f"/stores/{store}/keys/{quote(str(key), safe='')}")
                assert got.status_code == 200, got.text
                stored = _stored(value, filled_example.keyed(store))
                assert got.json() == {"store": store, "key": key, "value": stored} and value == entry["value"]
        elif kind is StoreKind.WINDOW:
            entries = await _all(filled_example, store, kind)
            assert graphql == len({(e["key"], e["start"]) for e in entries}), f"{store}: count is not its pairs"
            for entry in entries[:KEYS_PER_STORE]:
                key, start = entry["key"], entry["start"]
                ms = int(dt.datetime.fromisoformat(start).timestamp() * 1000)
                selection = filled_example.selection(store, "fetch")
                query = f"query($k: String!, $f: DateTime) {{ {root} {{ fetch(key: $k, from: $f) {selection} }} }}"
                windows = (await filled_example.graphql(query, {"k": key, "f": start}))[root]["fetch"]
                windows = [{**w, "value": _stored(w["value"], filled_example.keyed(store))} for w in windows]
                for since in (quote(start), ms):  # ISO 8601 or epoch ms, as GraphQL's DateTime takes them
                    got = await filled_example.rest.get(f"/stores/{store}/keys/{quote(str(key), safe='')}?from={since}")
                    assert got.json() == {"store": store, "key": key, "windows": windows}
        elif kind is StoreKind.BLOOM:
            for key in ["nobody-at-all"]:
                query = f'{{ {root} {{ mightContain(key: "{key}") }} }}'
                value = (await filled_example.graphql(query))[root]["mightContain"]
                got = (await filled_example.rest.get(f"/stores/{store}/keys/{key}")).json()
                assert got == {"store": store, "key": key, "mightContain": value}
        elif kind is StoreKind.RANKING:
            selection = filled_example.selection(store, "top")
            top = (await filled_example.graphql(f"{{ {root} {{ top(first: 5) {selection} }} }}"))[root]["top"]
            assert top, f"{store}: an empty ranking proves nothing"
            got = (await filled_example.rest.get(f"/stores/{store}/top?first=5")).json()
            assert got == {"store": store, "group": None, "top": top}
        walked.add(kind)
    assert walked, "no store walked"


def _stored(value: Any, keyed: frozenset[str]) -> Any:
    """Return a GraphQL value with each relation in its column's place (``customer { key }``) as the key stored."""
    if not isinstance(value, dict):
        return value
    return {k: v["key"] if k in keyed and v is not None else v for k, v in value.items()}


README = Path(__file__).resolve().parents[3] / "README.md"


@pytest.mark.parametrize("filled_example", ["shop"], indirect=True)
async def test_the_readmes_rest_curls_answer_on_the_shop_with_the_fields_it_names(filled_example: Example) -> None:
    """README "Querying" → "REST": each curl line's path answers 200 on the shop, with the top-level fields its
    comment names first."""
    block = README.read_text().split("### REST", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("curl -s")]
    assert len(lines) >= 6
    for line in lines:
        path = re.search(r"localhost:8000(/[^' ]+)", line).group(1)  # type: ignore[union-attr]
        response = await filled_example.rest.get(path)
        assert response.status_code == 200, (path, response.text)
        comment = line.split("#", 1)[1]
        if "{" in comment:
            _has_named_fields(comment[comment.index("{") :], response.json(), path)


def _has_named_fields(shape: str, body: Any, path: str) -> None:
    """Check body has the fields a README comment's shape names: {"a", "b": {"c"}} (nested objects checked too)."""
    depth, items, current = 0, [], ""
    for char in shape[1:]:
        if char == "}" and depth == 0:
            break
        depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    for item in items:
        name, _, rest = item.partition(":")
        name = name.strip().strip('"')
        assert isinstance(body, dict) and name in body, (path, name, body)
        if rest.strip().startswith("{"):
            _has_named_fields(rest.strip(), body[name], path)
