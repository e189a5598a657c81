"""A point read's compiled execution, in one process: its request's loaders reading at once (a plan with one field
per level: ``CompiledQuery.one_read_at_a_time``) beside batching (a DataLoader turn of the event loop), alternating.

Over the schema tests' shop stores (RocksDB, filled in a temporary directory), with the production
``ClusterStoreQueries`` on one node, on uvloop as a node runs: ``--executions`` executions of
``query Point($key: String!) { orderCount { get(key: $key) } }`` per run, ``--rounds`` runs of each mode
alternating; prints each run's process CPU per execution and the medians.

Usage: ``.venv/bin/python bench/point_execution.py [--executions N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iqgraph.schema import context_getter  # noqa: E402
from tests.schema.conftest import _filled_shop, api_factory, make_orders  # noqa: E402
from tests.support.apps import SHOP_TYPES, shop_app  # noqa: E402

QUERY = "query Point($key: String!) { orderCount { get(key: $key) } }"


async def measure(executions: int, rounds: int) -> dict[bool, list[float]]:
    """Return, per mode (reading at once or not), each run's µs of process CPU per execution."""
    with tempfile.TemporaryDirectory(prefix="iqgraph-bench-point-") as root:
        filled = _filled_shop(Path(root), make_orders())
        api = api_factory(shop_app(), SHOP_TYPES, next(filled))()
        schema = api.schema
        plan = schema.compiled.plan(QUERY, None)
        assert plan is not None and plan.one_read_at_a_time
        make = context_getter(api.queries, api.limits)
        variables = {"key": "customer-00"}
        expected = (await schema.execute_compiled(QUERY, variables, make(), None, None)).data
        runs: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for at_once in (True, False):
                plan.one_read_at_a_time = at_once
                started = time.process_time()
                for _ in range(executions):
                    result = await schema.execute_compiled(QUERY, variables, make(), None, None)
                    api.queries.calls.clear()
                runs[at_once].append((time.process_time() - started) / executions * 1e6)
                if result.data != expected or result.errors:
                    raise RuntimeError(f"the execution answered {result.data} {result.errors}, not {expected}")
                print(f"  at once {at_once!s:<5} {runs[at_once][-1]:6.1f} µs CPU/execution", flush=True)
        filled.close()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--executions", type=int, default=20_000, help="executions per run")
    parser.add_argument("--rounds", type=int, default=6, help="runs of each mode, alternating")
    args = parser.parse_args()
    runs = uvloop.run(measure(args.executions, args.rounds))
    now, before = statistics.median(runs[True]), statistics.median(runs[False])
    print(f"point read, compiled execution: at once {now:.1f} µs, batched {before:.1f} µs CPU per execution "
          f"(medians of {args.rounds}); at once / batched {now / before:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
