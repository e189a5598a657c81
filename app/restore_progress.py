"""What a starting node says while its partitions restore: one true line, only when it has something new to say.

A node that restarts opens its partitions, restores them from their changelogs, serves, and then applies what the
input topics hold past the changelogs (RESTORING) once Spark has started. `RestoreProgress.line` is called every
couple of seconds with the node's partitions; it says how many partitions restore and the records they still
have to apply, and what moves: the records applied since the last line, the rate and the time left, or, while
nothing moves, why (Spark still starting, the queries' first batch not applied yet, a query that died). A line
that would repeat the last one is not said; a wait is said again every ``QUIET_S`` with how long it has lasted.
Once every partition is queryable, `done_line` says so with the count per topic and role.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from iqgraph.schema.types import NodeInfo, PartitionInfo, PipelineInfo
from iqgraph.stores import PartitionState

QUIET_S = 10.0  # a wait with nothing moving is said again after this long
SLOW_START_S = 10.0  # a node ready later than this says where the time went


@dataclass
class RestoreProgress:
    """The restore lines of one node's start (times from time.monotonic())."""

    _applied: int | None = None  # records applied over the restoring partitions at the last call
    _at: float = 0.0  # the last call
    _said: str = ""  # the last line said: a wait's reason, or a progress line
    _said_at: float = 0.0
    _still_since: float | None = None  # since when nothing moved

    def line(self, partitions: Sequence[PartitionInfo], pipeline: PipelineInfo | None, now: float) -> str | None:
        """Return the line to say now about the partitions still restoring (None: nothing new to say)."""
        restoring = [p for p in partitions if p.state != PartitionState.RUNNING.value]
        applied, lag = sum(p.applied_offset for p in restoring), sum(p.lag for p in restoring)
        head = f"restoring {len(restoring)} of {len(partitions)} partitions: {lag:,} records to apply"
        moved = 0 if self._applied is None else max(applied - self._applied, 0)
        seconds = max(now - self._at, 1e-3)
        self._applied, self._at = applied, now
        if moved:
            self._still_since = None
            rate = moved / seconds
            eta = f", about {lag / rate:.0f} s to go" if lag else ""
            self._said, self._said_at = "moving", now
            return f"{head} ({moved:,} applied in the last {seconds:.0f} s, {rate:,.0f}/s{eta})"
        self._still_since = now if self._still_since is None else self._still_since
        reason = _waiting_on(pipeline)
        if reason == self._said and now - self._said_at < QUIET_S:
            return None  # nothing new (the records to apply may grow): said again after a while, with how long
        tail = f" (nothing applied for {now - self._still_since:.0f} s)" if reason == self._said else ""
        self._said, self._said_at = reason, now
        return f"{head}; {reason}{tail}"


def _waiting_on(pipeline: PipelineInfo | None) -> str:
    """Return why nothing is being applied: what the pipeline is doing."""
    if pipeline is None or pipeline.state == "STARTING":
        return "Spark and the streaming queries are still starting (the restored stores serve meanwhile)"
    if pipeline.state == "DEAD" or pipeline.deaths_in_a_row:
        return f"the streaming query died {pipeline.deaths_in_a_row}× in a row: {pipeline.last_error}"
    return "the streaming queries run; waiting for their first batch"


def done_line(partitions: Iterable[PartitionInfo], ready_in: str, global_topics: Iterable[str] = ()) -> str:
    """Return "all N partitions are queryable: <ready_in>", then what they are: per topic, how many active and
    standby copies this node keeps (a global table's partitions are on every node, and said so)."""
    partitions = list(partitions)
    globals_ = set(global_topics)
    roles: dict[str, Counter[str]] = {}
    for p in partitions:
        roles.setdefault(p.topic, Counter())[p.role] += 1
    kept = []
    for topic, counts in sorted(roles.items()):
        if topic in globals_:
            kept.append(f"{topic} {sum(counts.values())} (a global table: whole on every node)")
        else:
            kept.append(f"{topic} " + ", ".join(f"{n} {role}" for role, n in sorted(counts.items())))
    return f"all {len(partitions)} partitions are queryable: {ready_in}; hosted here: {'; '.join(kept)}"


def ready_in(timings: Mapping[str, float], now: float) -> str:
    """Return how long the node took to be ready, and where the time went when it was slow (> SLOW_START_S).

    timings: the node's start-up steps (``Node.timings``): "started" (time.monotonic()), then seconds: "joined"
    (Kafka checked, cluster joined), "serving" (partitions restored, reads served), "spark" (its start, from the
    node's start on), "queries" (the streaming queries' start). Spark starts while the node checks Kafka, joins and
    restores; then the streaming queries start; then the partitions apply what Kafka holds (restoring).
    """
    total = now - timings["started"]
    said = f"ready {total:.1f} s after start"
    if total <= SLOW_START_S:
        return said
    joined, spark = timings.get("joined", 0.0), timings.get("spark", 0.0)
    queries = timings.get("queries", 0.0)
    steps = {
        "starting Spark (while joining)": max(spark, joined),
        "starting the streaming queries": queries,
        "applying the records Kafka holds (restoring)": max(total - max(spark, joined) - queries, 0.0),
    }
    shown = ", ".join(f"{what} {seconds:.1f} s" for what, seconds in steps.items())
    slowest = max(steps, key=lambda what: steps[what])
    serving = f"; serving reads after {timings['serving']:.1f} s" if "serving" in timings else ""
    return (
        f"{said} (slow: {shown}; most went to {slowest}; Kafka checked and cluster joined in {joined:.1f} s{serving})"
    )


def watch_restore(
    node: Callable[[], NodeInfo | None],
    starting_or_running: Callable[[], bool],
    ready_in: Callable[[], str],
    global_topics: Sequence[str],
    progress: Callable[[str], None],
    interval: float = 2.0,
) -> threading.Thread:
    """Say how the restore goes every interval, when there is something new to say, until every partition is
    queryable and the pipeline runs; then `done_line` (a thread, while the node starts or runs)."""
    said = RestoreProgress()

    def watch() -> None:
        while starting_or_running() and (info := node()) is not None:
            started = info.pipeline is None or info.pipeline.state != "STARTING"
            if started and all(p.state == PartitionState.RUNNING.value for p in info.partitions):
                progress(done_line(info.partitions, ready_in(), global_topics))
                return
            line = said.line(info.partitions, info.pipeline, time.monotonic())
            if line is not None:
                progress(line)
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="restore-progress", daemon=True)
    thread.start()
    return thread
