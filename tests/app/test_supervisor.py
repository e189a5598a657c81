"""The query supervisor's rule, on a runner whose queries die when told to and a clock the test moves."""

from __future__ import annotations

import time

import pytest

from iqgraph.app.supervisor import Backoff, QuerySupervisor, error_summary


class Runner:
    """A runner whose queries are dead while ``dead`` is set, and whose restarts fail while ``broken`` is."""

    def __init__(self) -> None:
        self.dead: BaseException | None = None
        self.broken = False
        self.restarts = 0
        self.applied_at = 0.0

    def failure(self) -> BaseException | None:
        return self.dead

    def last_applied(self) -> float:
        return self.applied_at

    def restart(self) -> None:
        if self.broken:
            raise RuntimeError("cannot start: executors cannot import app")
        self.restarts += 1
        self.dead = None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _supervisor(runner: Runner, clock: Clock) -> QuerySupervisor:
    return QuerySupervisor(runner, backoff=Backoff(1.0, 8.0), healthy_after_s=30.0, keeps_dying_after=3, clock=clock)


def test_a_dead_query_is_restarted_after_its_backoff_and_reported_meanwhile() -> None:
    runner, clock = Runner(), Clock()
    supervisor = _supervisor(runner, clock)
    supervisor.check()
    assert supervisor.status().state == "RUNNING" and supervisor.status().healthy
    runner.dead = RuntimeError("Job aborted: ModuleNotFoundError: No module named 'myapp'\nat ...")
    supervisor.check()
    status = supervisor.status()
    assert (status.state, status.deaths_in_a_row, status.healthy) == ("DEAD", 1, False)
    assert status.last_error == "Job aborted: ModuleNotFoundError: No module named 'myapp'"
    clock.now += 0.5
    supervisor.check()
    assert runner.restarts == 0, "restarted before its backoff"
    clock.now += 0.6
    supervisor.check()
    assert runner.restarts == 1
    assert supervisor.status().state == "RUNNING" and supervisor.status().restarts == 1


def test_backoff_doubles_with_each_death_in_a_row_and_a_long_run_forgives() -> None:
    runner, clock = Runner(), Clock()
    supervisor = _supervisor(runner, clock)
    waits = []
    for _ in range(5):
        runner.dead = RuntimeError("worker lost")
        supervisor.check()
        died_at = clock.now
        while runner.dead is not None:
            clock.now += 0.25
            supervisor.check()
        waits.append(clock.now - died_at)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert supervisor.status().deaths_in_a_row == 5
    assert supervisor.status().keeps_dying and not supervisor.status().healthy
    clock.now += 29
    supervisor.check()
    assert supervisor.status().keeps_dying
    clock.now += 2
    supervisor.check()
    assert supervisor.status().deaths_in_a_row == 0 and supervisor.status().healthy


def test_a_restart_that_fails_counts_as_one_more_death() -> None:
    runner, clock = Runner(), Clock()
    supervisor = _supervisor(runner, clock)
    runner.dead, runner.broken = RuntimeError("died"), True
    supervisor.check()
    clock.now += 1
    supervisor.check()
    status = supervisor.status()
    assert (status.state, status.deaths_in_a_row, status.restarts) == ("DEAD", 2, 0)
    assert status.last_error == "cannot start: executors cannot import app"
    runner.broken = False
    clock.now += 2
    supervisor.check()
    assert supervisor.status().state == "RUNNING" and runner.restarts == 1


def test_the_supervisor_thread_keeps_watching_until_stopped() -> None:
    runner = Runner()
    supervisor = QuerySupervisor(runner, interval_s=0.01, backoff=Backoff(0.01, 0.01))
    supervisor.start()
    try:
        for n in range(1, 4):
            runner.dead = RuntimeError(f"death {n}")
            deadline = time.monotonic() + 10
            while runner.restarts < n and time.monotonic() < deadline:
                time.sleep(0.01)
            assert runner.restarts == n, f"death {n} was not restarted: the supervisor stopped watching"
    finally:
        supervisor.stop()


def test_a_restarted_query_that_applies_a_batch_is_forgiven_at_once() -> None:
    runner, clock = Runner(), Clock()
    supervisor = _supervisor(runner, clock)
    for _ in range(3):
        runner.dead = RuntimeError("died")
        supervisor.check()
        while runner.dead is not None:
            clock.now += 0.5
            supervisor.check()
    assert supervisor.status().keeps_dying
    clock.now += 1
    supervisor.check()
    assert supervisor.status().keeps_dying, "forgiven with no batch applied and no long run"
    runner.applied_at = clock.now
    clock.now += 0.1
    supervisor.check()
    assert supervisor.status().deaths_in_a_row == 0 and supervisor.status().healthy


def test_the_reported_error_is_the_python_cause_inside_sparks_wrapping() -> None:
    wrapped = RuntimeError(
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "sink.py", line 9, in __call__\n'
        "py4j.protocol.Py4JJavaError: An error occurred while calling o81.toArrow.\n"
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 failed\n"
        "ModuleNotFoundError: No module named 'clusterapp'\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1097)\n"
    )
    assert error_summary(wrapped) == "ModuleNotFoundError: No module named 'clusterapp'"
    assert error_summary(RuntimeError("stopped\nmore")) == "stopped"


def test_without_a_python_cause_the_reported_error_is_the_java_one_spark_quotes() -> None:
    # a read task that timed out after a whole-cluster outage, as the drill's node logged it
    died = RuntimeError(
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "sink.py", line 243, in __call__\n'
        "py4j.protocol.Py4JJavaError: An error occurred while calling o2166.toArrow.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 30.0 failed 1 times, "
        "most recent failure: Lost task 1.0 in stage 30.0 (TID 58) (localhost executor driver): "
        "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before the position for "
        "partition orders-5 could be determined\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2935)\n"
    )
    assert error_summary(died) == (
        "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before the position for "
        "partition orders-5 could be determined"
    )


class Kafka:
    """Kafka as the supervisor's probe sees it: answering or not."""

    def __init__(self) -> None:
        self.up = True
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.up


def test_a_query_dead_while_kafka_is_away_waits_for_kafka_then_restarts_at_once_whatever_its_backoff() -> None:
    runner, clock, kafka = Runner(), Clock(), Kafka()
    supervisor = QuerySupervisor(
        runner, backoff=Backoff(1.0, 60.0), healthy_after_s=30.0, clock=clock, kafka_reachable=kafka
    )
    supervisor._in_a_row = 6  # earlier deaths in a row: the next back-off would be 60 s
    kafka.up = False
    runner.dead = RuntimeError("could not list offsets of 'orders' [0]: No leaders found")
    supervisor.check()
    assert supervisor.status().state == "DEAD"
    for _ in range(120):  # two minutes of Kafka away: no restart into the outage
        clock.now += 1.0
        supervisor.check()
    assert runner.restarts == 0
    kafka.up = True
    clock.now += 1.0
    supervisor.check()
    assert runner.restarts == 1, "not restarted as soon as Kafka answered"
    assert supervisor.status().state == "RUNNING"
    # Kafka up, the next death waits for its back-off as before
    runner.dead = RuntimeError("a batch failed")
    supervisor.check()
    clock.now += 1.0
    supervisor.check()
    assert runner.restarts == 1


def test_kafka_watch_logs_each_transition_once_and_asks_at_most_once_a_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from iqgraph.streaming.kafka_watch import KafkaWatch

    clock, state = Clock(), {"up": True, "asked": 0}

    def probe(timeout_s: float) -> None:
        state["asked"] += 1
        if not state["up"]:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))

    watch = KafkaWatch({"bootstrap.servers": "kafka-1:9092"}, every_s=1.0, clock=clock, probe=probe)
    caplog.set_level("WARNING", logger="iqgraph.streaming.kafka_watch")
    assert watch.reachable() and watch.reachable()
    assert state["asked"] == 1  # the second answer was the cached one
    state["up"] = False
    for _ in range(5):
        clock.now += 1.0
        assert not watch.reachable()
    assert watch.unreachable_since == 1001.0
    clock.now += 1.0
    state["up"] = True
    assert watch.reachable()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Kafka at kafka-1:9092 unreachable since ") and lines[0].endswith(", waiting")
    assert lines[1] == "Kafka back after 5 s"


def test_kafka_watch_asks_again_once_before_calling_kafka_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from iqgraph.streaming.kafka_watch import KafkaWatch

    answers = iter([False, True, False, False, True])  # one request timed out, then a real outage

    def probe(timeout_s: float) -> None:
        if not next(answers):
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))

    caplog.set_level("WARNING", logger="iqgraph.streaming.kafka_watch")
    watch = KafkaWatch({"bootstrap.servers": "kafka-1:9092"}, every_s=0.0, probe=probe)
    assert watch.reachable() and watch.status().reachable and not caplog.records
    assert not watch.reachable() and watch.status().unreachable_since is not None
    assert watch.reachable()
    assert [r.getMessage().split(" since ")[0] for r in caplog.records] == [
        "Kafka at kafka-1:9092 unreachable",
        "Kafka back after 0 s",
    ]


def test_librdkafkas_connection_failures_are_dropped_and_other_lines_kept() -> None:
    import logging

    from iqgraph.streaming.kafka_watch import ConnectionNoise

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("iqgraph.streaming.changelog", logging.ERROR, __file__, 1, message, None, None)

    noise = ConnectionNoise()
    refused = (
        "FAIL [rdkafka#producer-9] [thrd:k:9092/bootstrap]: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
    )
    assert not noise.filter(record(refused))
    assert noise.filter(record("FAIL [rdkafka#producer-9] [thrd:main]: Fatal error: Broker: Producer fenced"))
    assert noise.filter(record("a streaming query died (Connection refused); restarting as soon as Kafka answers"))


def test_a_restart_that_fails_after_kafkas_return_waits_its_backoff_again() -> None:
    runner, clock, kafka = Runner(), Clock(), Kafka()
    supervisor = QuerySupervisor(runner, backoff=Backoff(4.0, 60.0), clock=clock, kafka_reachable=kafka)
    kafka.up = False
    runner.dead = RuntimeError("could not list offsets")
    supervisor.check()
    kafka.up, runner.broken = True, True
    clock.now += 1.0
    supervisor.check()  # Kafka back: one restart at once, which fails
    assert supervisor.status().deaths_in_a_row == 2
    runner.broken = False
    for _ in range(3):  # then the back-off of a second death (8 s), not a restart every round
        clock.now += 1.0
        supervisor.check()
    assert runner.restarts == 0
    clock.now += 6.0
    supervisor.check()
    assert runner.restarts == 1
