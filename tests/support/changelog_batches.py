"""Batches of every store kind written through the changelog (the stores tests' specs), for the changelog tests and
for the crash child that kills itself at a chosen point of a batch (``python -m tests.support.changelog_batches``).

Batch i covers source offsets [i * SIZE, (i + 1) * SIZE) and its content depends on i only, so a run that crashed and
started again writes exactly what an uncrashed run writes.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from iqgraph.stores import PartitionStores, StateDirectory
from iqgraph.stores.changelog import CHANGELOG_NEXT_KEY
from iqgraph.stores.partition import META_CF, TOPIC_PARTITIONS_KEY, PartitionDB
from iqgraph.streaming.changelog import Changelogs, ChangelogWriter
from tests.stores.conftest import SPECS, TOPIC

SIZE = 40
#: Where the crash child can kill itself in a batch: before anything is sent, with half the records produced, with
#: all produced but the transaction not committed, committed but not written locally, written locally.
POINTS = ("before-send", "mid-send", "before-commit", "after-commit", "after-write")


def write_batch(stores: PartitionStores, changelogs: Changelogs | None, rng: random.Random, size: int = SIZE) -> None:
    """Apply one batch of size records of every store kind at the next offset, sent to the changelog first."""
    db = stores.db
    start = db.next_offset()
    tx = db.begin(start, start + size)
    assert tx is not None
    if changelogs is not None:
        writer = changelogs.writer(TOPIC)
        tx.publish = lambda t: writer.publish(db.partition, t)
    keys = [f"k{rng.randrange(60)}" for _ in range(size)]
    with tx:
        stores.kv("counts").merge(tx, [(k, 1) for k in keys], positions=list(range(start, start + size)))
        stores.kv("maxes").merge(tx, [(k, rng.randrange(1000)) for k in keys])
        times = [start * 3 + i for i in range(size)]
        windows = [(k, t - t % 10, 1) for k, t in zip(keys, times, strict=True)]
        stores.window("tumbling").merge(tx, windows, max(times), 0)
        stores.bloom("seen").add(tx, keys)


def batch_rng(index: int) -> random.Random:
    """Return the random source of batch index (the same in every run)."""
    return random.Random(index)


def contents(stores: PartitionStores) -> dict[str, dict[bytes, bytes]]:
    """Return every column family's items (meta without what is local to a copy: its changelog position, its
    partition count, its last commit's wall time)."""
    found: dict[str, dict[bytes, bytes]] = {}
    for family, key in stores.db.entries():
        found.setdefault(family, {})[key] = stores.db.family(family).get(key)
    for local in (CHANGELOG_NEXT_KEY, TOPIC_PARTITIONS_KEY, b"committed_at_ms"):
        found.get(META_CF, {}).pop(local, None)
    return found


class _DiesOnCommit:
    """A producer that kills the process when asked to commit its transaction."""

    def __init__(self, producer: object, die: Callable[[], None]) -> None:
        self._producer, self._die = producer, die

    def commit_transaction(self, *args: object) -> None:
        self._die()

    def __getattr__(self, name: str) -> object:
        return getattr(self._producer, name)


def _arm(point: str, batch: int) -> None:
    """Make the process SIGKILL itself at point of batch (0-based)."""

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    send, produce, write = ChangelogWriter._send, ChangelogWriter._produce, PartitionDB.write
    state = {"batch": -1, "produced": 0}

    def _send(self, partition, records, stop=lambda: False):  # type: ignore[no-untyped-def]
        state["batch"] += 1
        state["produced"] = 0
        if state["batch"] == batch and point == "before-send":
            die()
        if state["batch"] == batch and point == "before-commit":  # everything produced, the commit never sent
            self._producers[partition] = _DiesOnCommit(self._producers[partition], die)
        last = send(self, partition, records, stop)
        if state["batch"] == batch and point == "after-commit":
            die()
        return last

    def _produce(self, producer, partition, key, value, delivered):  # type: ignore[no-untyped-def]
        state["produced"] += 1
        if state["batch"] == batch and point == "mid-send" and state["produced"] > 30:
            producer.flush(30)
            die()
        produce(self, producer, partition, key, value, delivered)

    def _write(self, wb, start):  # type: ignore[no-untyped-def]
        write(self, wb, start)
        if state["batch"] == batch and point == "after-write":
            die()

    ChangelogWriter._send = _send  # type: ignore[method-assign]
    ChangelogWriter._produce = _produce  # type: ignore[method-assign]
    PartitionDB.write = _write  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app", required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--crash", choices=POINTS)
    parser.add_argument("--at", type=int, default=0, help="the batch (counted from this start) to crash in")
    args = parser.parse_args()
    changelogs = Changelogs({"bootstrap.servers": args.bootstrap}, args.app)
    stores = StateDirectory(args.state, "test-app").open(TOPIC, 0, SPECS)
    changelogs.writer(TOPIC).take_over(0)
    changelogs.restore(TOPIC, stores)
    if args.crash:
        _arm(args.crash, args.at)
    done = stores.db.next_offset() // SIZE
    print(f"START {done}", flush=True)
    for index in range(done, args.batches):
        write_batch(stores, changelogs, batch_rng(index))
    stores.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
