"""A node process for the crash test: run the shop (or, with --table, a table) pipeline until caught up, or
SIGKILL itself midway.

``--crash before-write --at N`` kills the process just before the N-th partition WriteBatch is written,
``after-write`` just after it. Every write is announced on stdout (``WROTE n``) so that the parent can
also kill the process at a moment of its own choosing.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from iqgraph.examples.shop import build_app
from iqgraph.stores import StateDirectory
from iqgraph.stores.partition import PartitionDB
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from iqgraph.streaming.session import build_spark_session
from tests.support.plays import plays_app
from tests.support.tables import table_app


def _arm(crash: str, at: int) -> None:
    original = PartitionDB.write
    writes = [0]

    def write(self: PartitionDB, batch: Any, *args: Any) -> None:
        writes[0] += 1
        if crash == "before-write" and writes[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, batch, *args)
        print(f"WROTE {writes[0]}", flush=True)
        if crash == "after-write" and writes[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)

    PartitionDB.write = write  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--crash", choices=["none", "before-write", "after-write"], default="none")
    parser.add_argument("--at", type=int, default=1)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--table", action="store_true", help="run the table app (tests.support.tables)")
    parser.add_argument("--plays", action="store_true", help="run the plays app (tests.support.plays)")
    args = parser.parse_args()
    _arm(args.crash, args.at)
    app = table_app(args.topic, args.partitions) if args.table else build_app(args.topic, args.partitions)
    if args.plays:
        app = plays_app(args.topic, args.partitions)
    spark = build_spark_session("local[2]", shuffle_partitions=2)
    settings = RunnerSettings(args.bootstrap, max_records_per_batch=args.batch)
    runner = StreamRunner(app, spark, StateDirectory(args.state, app.name), settings)
    runner.start({args.topic: range(args.partitions)})
    runner.wait_until_caught_up(timeout=300)
    runner.stop()
    print("CAUGHT UP", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
