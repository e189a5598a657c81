"""A bare Starlette endpoint doing the raw endpoint's RocksDB read without any of the node's layers: the ceiling that
bench/query.py measures the node's raw endpoint against (issue 31: the raw endpoint within 1.5× of a bare one).

``GET /bare/{store}/{key}`` does what ``GET /raw/{store}/{key}`` does for a key-value store of the shop example —
the key's partition by murmur2, one RocksDB get in the store's column family, the state decoded and finalized, a
JSON answer — and nothing else: no request guard, authentication, metrics, routing table, partition states or
staleness. It opens the node's partition databases READ-ONLY (RocksDB allows that beside the node's own handle), as
they are when it starts: start it once the node has applied what the benchmark reads.

Usage (bench/query.py starts it): ``python bench/bare_lookup.py STATE_DIR TOPIC PARTITIONS PORT``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import uvicorn
from rocksdict import AccessType, Options, Rdict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iqgraph.examples.shop import build_app  # noqa: E402
from iqgraph.stores.codecs import KeyCodec, decode_value  # noqa: E402
from iqgraph.streaming.partitioner import partition_for  # noqa: E402


def bare_app(state_dir: Path, topic: str, partitions: int) -> Starlette:
    """Return the bare app over the partition databases of topic in state_dir (opened read-only)."""
    app = build_app(topic, partitions)
    options = Options(raw_mode=True)
    databases = []
    for p in range(partitions):
        path = str(state_dir / f"{topic}-{p}")
        families = {name: Options(raw_mode=True) for name in Rdict.list_cf(path, options) if name != "default"}
        databases.append(Rdict(path, options, column_families=families, access_type=AccessType.read_only()))
    stores: dict[str, tuple[list[Any], KeyCodec, Any]] = {}
    for spec in app.specs(topic):
        if spec.kind.value == "key_value":
            families = [db.get_column_family(spec.name) for db in databases]
            stores[spec.name] = (families, KeyCodec(spec.key_type), spec.aggregation)

    async def lookup(request: Request) -> JSONResponse:
        store, key = request.path_params["store"], request.path_params["key"]
        found = stores.get(store)
        if found is None:
            return JSONResponse({"error": f"no store {store!r}"}, status_code=404)
        families, codec, aggregation = found
        raw = families[partition_for(key, partitions, "string", "murmur2")].get(codec.encode(key))
        value = None if raw is None else aggregation.finalize(decode_value(raw))
        return JSONResponse({"key": key, "value": value})

    return Starlette(routes=[Route("/bare/{store}/{key}", lookup, methods=["GET"])])


def main() -> None:
    """Serve the bare app (arguments: state dir, topic, partitions, port)."""
    state_dir, topic, partitions, port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    uvicorn.run(bare_app(state_dir, topic, partitions), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
