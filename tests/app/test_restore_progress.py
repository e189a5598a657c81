"""What a starting node says while it restores: a line only when something is new, and what moves or why not."""

from __future__ import annotations

from iqgraph.app.restore_progress import QUIET_S, RestoreProgress, done_line
from iqgraph.schema.types import PartitionInfo, PipelineInfo

STARTING = PipelineInfo("STARTING")
RUNNING = PipelineInfo("RUNNING")


def parts(applied: list[int], end: int = 1_000, states: str = "RESTORING") -> list[PartitionInfo]:
    return [PartitionInfo("orders", p, "active", states, a, end) for p, a in enumerate(applied)]


def test_while_spark_starts_the_wait_is_said_once_then_again_after_a_while_with_how_long() -> None:
    said = RestoreProgress()
    first = said.line(parts([0, 0]), STARTING, 0.0)
    assert first == (
        "restoring 2 of 2 partitions: 2,000 records to apply; Spark and the streaming queries are still starting (the "
        "restored stores serve meanwhile)"
    )
    # the ingest goes on (more to apply), nothing is applied: nothing new to say, however many times it is asked
    assert [said.line(parts([0, 0], end=1_000 + t), STARTING, t) for t in (2.0, 4.0, 6.0, 8.0)] == [None] * 4
    again = said.line(parts([0, 0], end=1_100), STARTING, QUIET_S + 0.5)
    assert again is not None and again.endswith("(nothing applied for 10 s)"), again


def test_records_applied_are_said_with_the_rate_and_the_time_left() -> None:
    said = RestoreProgress()
    said.line(parts([0, 0]), RUNNING, 0.0)
    line = said.line(parts([300, 100]), RUNNING, 2.0)
    assert line == (
        "restoring 2 of 2 partitions: 1,600 records to apply (400 applied in the last 2 s, 200/s, about 8 s to go)"
    )


def test_a_new_reason_is_said_at_once() -> None:
    said = RestoreProgress()
    said.line(parts([0]), STARTING, 0.0)
    line = said.line(parts([0]), RUNNING, 1.0)
    assert line is not None and line.endswith("the streaming queries run; waiting for their first batch"), line
    dead = PipelineInfo("DEAD", 1, 1, "KafkaException: broker down")
    line = said.line(parts([0]), dead, 2.0)
    assert line is not None and line.endswith("died 1× in a row: KafkaException: broker down"), line


def test_the_ready_line_says_what_the_partitions_are() -> None:
    partitions = [
        *parts([5, 5], states="RUNNING"),
        PartitionInfo("orders", 4, "standby", "RUNNING", 3, 3),
        *(PartitionInfo("regions", p, "active", "RUNNING", 1, 1) for p in range(3)),
    ]
    assert done_line(partitions, "ready 3.0 s after start", ["regions"]) == (
        "all 6 partitions are queryable: ready 3.0 s after start; hosted here: orders 2 active, 1 standby; "
        "regions 3 (a global table: whole on every node)"
    )
