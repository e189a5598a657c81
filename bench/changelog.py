"""What the changelog costs a batch and how fast a copy restores from it, on Apache Kafka and RocksDB, in one run.

A partition database with the stores tests' specs (key-value, windows, bloom filters) takes BATCHES batches of
RECORDS records over KEYS keys twice, side by side: written locally only, and sent to the changelog first (one Kafka
transaction per batch). Then a fresh copy restores from the changelog. Prints per batch the local write and the
changelog's added time, the records and bytes sent per batch, and the restore's records, bytes, seconds and rate;
the last line is one JSON object with the figures.

Usage: ``.venv/bin/python bench/changelog.py [--batches N] [--records N] [--keys N]`` (starts its own broker).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iqgraph.stores import StateDirectory  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.changelog import CHANGELOG_CONFIG, Changelogs, changelog_topic  # noqa: E402
from tests.stores.conftest import SPECS, TOPIC  # noqa: E402
from tests.support.changelog_batches import write_batch  # noqa: E402


def run(broker: KafkaBroker, root: Path, batches: int, records: int, keys: int) -> dict[str, float]:
    app = f"bench{random.randrange(1 << 30):x}"
    broker.create_topics({changelog_topic(app, TOPIC): 1}, CHANGELOG_CONFIG)
    changelogs = Changelogs({"bootstrap.servers": broker.bootstrap_servers}, app)
    local = StateDirectory(root / "local", "test-app").open(TOPIC, 0, SPECS)
    logged = StateDirectory(root / "logged", "test-app").open(TOPIC, 0, SPECS)
    changelogs.writer(TOPIC).take_over(0)
    plain, with_log = [], []
    for index in range(batches):  # alternate which goes first: the machine is shared
        for stores, log, times in ((local, None, plain), (logged, changelogs, with_log))[:: 1 if index % 2 else -1]:
            rng = random.Random(index)
            started = time.perf_counter()
            write_batch(stores, log, _Keys(rng, keys), records)
            times.append(time.perf_counter() - started)
    writer = changelogs.writer(TOPIC)
    fresh = StateDirectory(root / "fresh", "test-app").open(TOPIC, 0, SPECS)
    progress = Changelogs({"bootstrap.servers": broker.bootstrap_servers}, app).restore(TOPIC, fresh)
    seconds = time.monotonic() - progress.started
    return {
        "batches": batches,
        "records_per_batch": records,
        "local_ms_p50": statistics.median(plain) * 1000,
        "with_changelog_ms_p50": statistics.median(with_log) * 1000,
        "changelog_records_per_batch": writer.sent_records / batches,
        "changelog_bytes_per_batch": writer.sent_bytes / batches,
        "restore_records": progress.records,
        "restore_mb": progress.bytes / 1e6,
        "restore_s": seconds,
        "restore_records_per_s": progress.records / seconds,
    }


class _Keys(random.Random):
    """A random source whose randrange(60) (write_batch's key choice) draws from keys keys instead."""

    def __init__(self, rng: random.Random, keys: int) -> None:
        super().__init__(rng.random())
        self.keys = keys

    def randrange(self, start: int, *args: int, **kwargs: int) -> int:  # type: ignore[override]
        return super().randrange(self.keys) if start == 60 and not args else super().randrange(start, *args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--records", type=int, default=5_000)
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, KafkaBroker() as broker:
        figures = run(broker, Path(tmp), args.batches, args.records, args.keys)
    for name, value in figures.items():
        print(f"{name:32} {value:,.2f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
