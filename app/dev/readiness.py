"""A dev run's node getting ready, seen from outside: its /readyz answers, told when they change, and timed.

`read_readiness` asks a node's /readyz (None while it does not answer HTTP: it serves once its stores are
restored, while Spark starts). `NodeStart` follows one node from its spawn: `observe` returns a line when its
partitions' restore moved on, `ready_line` says how long it took to be ready and, past the node's own
`SLOW_START_S`, where the time went: starting (Python, the stores restored), then starting Spark and applying the
records already in Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from iqgraph.app.restore_progress import SLOW_START_S
from iqgraph.schema.wire import READY_PATH, decode_partition
from iqgraph.stores import PartitionState

PROGRESS_EVERY_S = 2.0  # a restore that moves on is told at most this often


@dataclass(frozen=True)
class Readiness:
    """One /readyz answer: ready or not, the partitions still restoring and the records they have to apply."""

    ready: bool
    partitions: int
    restoring: int
    lag: int


def read_readiness(url: str) -> Readiness | None:
    """Return the node's /readyz answer, None while it does not answer HTTP."""
    try:
        response = httpx.get(f"{url}{READY_PATH}", timeout=2)
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    partitions = [decode_partition(p) for p in body.get("partitions") or []]
    restoring = [p for p in partitions if p.state != PartitionState.RUNNING.value]
    return Readiness(response.status_code == 200, len(partitions), len(restoring), sum(p.lag for p in restoring))


@dataclass
class NodeStart:
    """One node's start as the dev run sees it: spawned, first answering HTTP, restoring, ready (monotonic times)."""

    spawned: float
    serving: float | None = None
    to_apply: int = 0  # records the partitions had to apply, the most any answer reported
    said: tuple[int, int] | None = None
    said_at: float = 0.0

    def observe(self, seen: Readiness | None, now: float) -> str | None:
        """Note one answer (None: no answer yet); return a line when the restore moved on since the last one."""
        if seen is None:
            return None
        if self.serving is None:
            self.serving = now
        self.to_apply = max(self.to_apply, seen.lag)
        restore = (seen.restoring, seen.lag)
        if seen.ready or not seen.restoring or restore == self.said or now - self.said_at < PROGRESS_EVERY_S:
            return None
        line = f"restoring {seen.restoring} of {seen.partitions} partitions: {seen.lag:,} records to apply"
        if self.said is None:
            line = f"started in {now - self.spawned:.1f} s; {line}"
        self.said, self.said_at = restore, now
        return line

    def ready_line(self, node_id: str, now: float, log: str) -> str:
        """Return how long the node took to be ready and, when that was slow, where the time went."""
        total = now - self.spawned
        said = f"{node_id} is ready {total:.1f} s after it was started"
        if total <= SLOW_START_S:
            return said
        starting = (self.serving or now) - self.spawned
        records = f"the {self.to_apply:,} records" if self.to_apply else "the records"
        return (
            f"{said} (slow: {starting:.1f} s to start Python and restore the stores, then "
            f"{total - starting:.1f} s to start Spark and apply {records} already in Kafka; {log} says more)"
        )
