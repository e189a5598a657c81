"""Where a GraphQL request's CPU goes, layer by layer, compiled and on graphql-core, in one process.

No Spark and no sockets: the shop's stores are real RocksDB partition databases filled in process (as the
sink would fill them), queried through the node's own production objects — ``ClusterStoreQueries`` over a
one-member map, the schema, the ASGI app. Each layer is timed alone, so the differences are the layers'
costs, per request, for the same document:

- ``rocksdb``   LocalPartitions.read_states (multi_get per partition + positions)
- ``routing``   ClusterStoreQueries.get_many (key → partition, plan, execute) minus rocksdb
- ``execute``   schema.execute (parse/validate cache, plan or graphql-core, loaders) minus get_many
- ``json``      encoding the response body
- ``http``      the ASGI app (GraphQL over HTTP, context, response) minus execute and json

Three documents: a point lookup, a getMany of 1,000 existing keys (as a variable), and a dashboard query
over five stores. The graphql-core figures use the same node with the document run through the Strawberry
path (the schema built with ``compiled=False``, the app with ``compiled=False``).

Then documents at first sight: each request sends a text the node has not seen (the same document with a
numbered comment), so nothing is cached: a point lookup (it gets a plan), a bad one (an unknown field: no plan,
refused by validation) and a bad one of 2,600 tokens (the shape of tests/app/http/test_bad_input's flood). The
whole request is timed, through the ASGI app.

Usage: ``.venv/bin/python bench/query_layers.py [--seconds S]``; prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iqgraph.app.query.partitions import definition_of  # noqa: E402
from iqgraph.app.query.routing import store_key_partitions  # noqa: E402
from iqgraph.schema import GraphQLApp, Limits, build_schema, context_getter  # noqa: E402
from tests.schema.conftest import close_hosted, open_hosted  # noqa: E402
from tests.support.apps import SHOP_TOPIC, SHOP_TYPES, START_MS, fill_shop, iso, shop_app  # noqa: E402
from tests.support.queries import single_node  # noqa: E402

KEYS = [f"customer-{i:04d}" for i in range(1000)]
POINT = '{ orderCount { get(key: "customer-0001") } }'
MANY = "query($k: [String!]!) { orderCount { getMany(keys: $k) } }"
DASHBOARD = """query($k: [String!]!) {
  orderCount { get(key: "customer-0001") top: getMany(keys: $k) }
  totalSpend { getMany(keys: $k) }
  latestOrder { get(key: "customer-0002") { orderId item amount ts } }
  ordersPerMinute { fetch(key: "customer-0001", from: 0) { start value } }
  itemsSold { mightContainMany(keys: ["widget", "gadget", "unicorn"]) }
}"""
DOCUMENTS = {
    "point": (POINT, None, ["customer-0001"]),
    "getMany 1,000": (MANY, {"k": KEYS}, KEYS),
    "dashboard": (DASHBOARD, {"k": KEYS[:20]}, KEYS[:20]),
}
NEW_DOCUMENTS = {
    "point": POINT,
    "bad": '{ orderCount { nope(key: "customer-0001") } }',
    "bad, 2,600 tokens": "{ orderCount { " + "count " * 2_600 + "} }",
}


def orders() -> list[dict[str, Any]]:
    """Return 3,000 orders of 1,000 customers (three each): every getMany key exists."""
    return [
        {
            "order_id": f"o-{i}",
            "customer": KEYS[i % 1000],
            "item": ["widget", "gadget", "gizmo"][i % 3],
            "quantity": 1 + i % 4,
            "amount": 2.5 + i % 7,
            "ts": iso(START_MS + i * 1000),
            "ms": START_MS + i * 1000,
        }
        for i in range(3000)
    ]


def per_call_us(run: Callable[[], Awaitable[Any]], seconds: float) -> float:
    """Return the mean µs of one awaited call, run for about seconds after a warm-up."""

    async def loop() -> float:
        for _ in range(20):
            await run()
        n, started = 0, time.process_time()
        while time.process_time() - started < seconds:
            await run()
            n += 1
        return (time.process_time() - started) / n * 1e6

    return asyncio.run(loop())


def asgi_call(app: Any, body: bytes) -> Callable[[], Awaitable[bytes]]:
    """Return a coroutine function POSTing body to app's /graphql in process (no socket); it returns the body."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/graphql", "raw_path": b"/graphql", "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"accept", b"application/graphql-response+json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip

    async def call() -> bytes:
        sent: list[bytes] = []

        async def receive() -> Any:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Any) -> None:
            if message["type"] == "http.response.body":
                sent.append(message.get("body", b""))

        await app(dict(scope), receive, send)
        return b"".join(sent)

    return call


def measure(seconds: float) -> dict[str, dict[str, dict[str, float]]]:
    """Return µs per request of each layer, per document, compiled and on graphql-core."""
    app_def = shop_app()
    with tempfile.TemporaryDirectory(prefix="iqgraph-layers-") as tmp:
        hosted = open_hosted(Path(tmp), app_def, SHOP_TOPIC)
        try:
            fill_shop(hosted[SHOP_TOPIC], orders())
            queries = single_node(app_def, SHOP_TYPES, hosted)
            store = definition_of(app_def, "order_count")
            limits = Limits()
            found: dict[str, dict[str, dict[str, float]]] = {}
            for mode, compiled in (("compiled", True), ("graphql-core", False)):
                schema = build_schema(queries.stores(), limits, compiled=compiled)
                app = GraphQLApp(schema, queries, limits, compiled=compiled)
                get_context = context_getter(queries, limits)
                for name, (document, variables, keys) in DOCUMENTS.items():
                    reads = [((k, None, None), store_key_partitions(app_def, store, k, "murmur2")) for k in keys]
                    timed = _layers(schema, app, get_context, queries, document, variables, keys, reads, seconds)
                    found.setdefault(name, {})[mode] = timed
                for name, document in NEW_DOCUMENTS.items():
                    found.setdefault(f"new {name}", {})[mode] = {"request": _first_sight(app, document, seconds)}
            return found
        finally:
            close_hosted(hosted)


def _layers(
    schema: Any,
    app: Any,
    get_context: Any,
    queries: Any,
    document: str,
    variables: Any,
    keys: list[str],
    reads: Any,
    seconds: float,
) -> dict[str, float]:
    """Return µs per call of each layer for one document (checked to answer without errors first)."""
    result = asyncio.run(schema.execute(document, variables, get_context()))
    assert not result.errors, result.errors
    body = orjson.dumps({"query": document, "variables": variables})
    answer = asyncio.run(asgi_call(app, body)())
    assert b'"errors"' not in answer, answer[:300]
    data = {"data": result.data}

    async def rocksdb() -> Any:
        return queries.local.read_states("order_count", reads)

    async def routing() -> Any:
        return await get_context().queries.get_many("order_count", keys)

    async def execute() -> Any:
        return await schema.execute(document, variables, get_context())

    async def encode() -> Any:
        return app.encode_json(data)

    return {
        "rocksdb": per_call_us(rocksdb, seconds),
        "get_many": per_call_us(routing, seconds),
        "execute": per_call_us(execute, seconds),
        "json": per_call_us(encode, seconds),
        "request": per_call_us(asgi_call(app, body), seconds),
    }


def _first_sight(app: Any, document: str, seconds: float) -> float:
    """Return µs per request of document sent each time as a text the app has not seen (a numbered comment)."""
    numbers = itertools.count()

    async def request() -> bytes:
        return await asgi_call(app, orjson.dumps({"query": f"{document} # {next(numbers)}"}))()

    return per_call_us(request, seconds)


def report(found: dict[str, dict[str, dict[str, float]]], seconds: float) -> None:
    """Print each document's layers, compiled beside graphql-core, and the JSON summary."""
    print(f"\nquery layers: CPU µs per request, in process, {seconds:g} s per figure (shop, 3 partitions)")
    for name, modes in found.items():
        if set(modes["compiled"]) == {"request"}:  # a document at first sight: the whole request only
            print(f"\n{name} document at first sight, whole request: compiled path {modes['compiled']['request']:,.0f}"
                  f", graphql-core {modes['graphql-core']['request']:,.0f}")  # fmt: skip
            continue
        print(f"\n{name}")
        print(f"  {'layer':<10}{'compiled':>12}{'graphql-core':>14}")
        for layer in ("rocksdb", "routing", "execute", "json", "http", "request"):
            row = []
            for mode in ("compiled", "graphql-core"):
                t = modes[mode]
                value = {
                    "rocksdb": t["rocksdb"] if name != "dashboard" else float("nan"),
                    "routing": t["get_many"] - t["rocksdb"] if name != "dashboard" else float("nan"),
                    "execute": t["execute"] - (t["get_many"] if name != "dashboard" else 0),
                    "json": t["json"],
                    "http": t["request"] - t["execute"] - t["json"],
                    "request": t["request"],
                }[layer]
                row.append(value)
            print(f"  {layer:<10}{row[0]:>12,.0f}{row[1]:>14,.0f}")
        ratio = modes["graphql-core"]["request"] / modes["compiled"]["request"]
        print(f"  whole request: compiled {ratio:.2f}× faster")
    print(json.dumps({"seconds": seconds, "layers_us": found}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per figure")
    args = parser.parse_args()
    report(measure(args.seconds), args.seconds)


if __name__ == "__main__":
    main()
