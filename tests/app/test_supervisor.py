"""The query supervisor's rule, on a runner whose queries die when told to and a clock the test moves."""

from __future__ import annotations

import time

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
