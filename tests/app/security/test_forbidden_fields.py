"""One store's trouble never erases another store's answer: for every shipped example, every store and entity read
at once (the query ``iqgraph dev`` prints) by a caller who may read every store but one, in turn. The answer is the
full caller's with exactly the forbidden store's fields null, each with its own FORBIDDEN error at its path —
never ``data: null``, never a sibling blanked — on the compiled plans and on graphql-core alike.
"""

from __future__ import annotations

from typing import Any

import pytest

from iqgraph.schema.access import Principal
from tests.support.filled_examples import Example


def _nulled(data: Any, paths: list[list[Any]]) -> Any:
    """Return data with the value at each path set to null."""
    if not paths:
        return data
    if [] in paths:
        return None
    if isinstance(data, dict):
        return {k: _nulled(v, [p[1:] for p in paths if p[0] == k]) for k, v in data.items()}
    if isinstance(data, list):
        return [_nulled(v, [p[1:] for p in paths if p[0] == i]) for i, v in enumerate(data)]
    return data


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "graphql-core"])
async def test_a_forbidden_store_nulls_its_own_fields_and_nothing_else(filled_example: Example, compiled: bool) -> None:
    query = filled_example.every_root_query()
    full = await filled_example.response(query, compiled=compiled)
    assert not full.get("errors") and full["data"], (query, full)
    stores = sorted(s.name for s in filled_example.queries.stores())
    refused = 0
    for forbidden in stores:
        caller = Principal("tester", frozenset(stores) - {forbidden})
        got = await filled_example.response(query, caller=caller, compiled=compiled)
        errors = got.get("errors") or []
        assert all(e["extensions"]["code"] == "FORBIDDEN" and e["extensions"].get("store") == forbidden for e in errors)
        assert got.get("data") is not None, f"forbidding {forbidden} blanked the whole answer: {errors}"
        paths = [e["path"] for e in errors]
        assert got["data"] == _nulled(full["data"], paths), f"forbidding {forbidden} nulled more than its fields"
        refused += bool(errors)
    assert refused, "no store of the query was refused: the test proves nothing"
