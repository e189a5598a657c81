"""The query supervisor: a streaming query that dies is restarted, with exponential backoff, and reported.

A query dies when a micro-batch fails (an executor that cannot import the user's module, a worker lost in
local mode, a transform that raises) or when it stops without being asked to. The supervisor checks the
runner every ``interval_s``; on a death it waits ``backoff(n)`` — 1 s, 2 s, 4 s, … up to ``max_backoff_s`` for
the n-th death in a row — then restarts every query over the partitions open now (their stores keep their
offsets: nothing is lost or applied twice). A restarted query that applies a batch, or stays up for
``healthy_after_s`` with nothing to apply, resets the count.

Kafka away is a pause, not a series of deaths: given ``kafka_reachable`` (``streaming.kafka_watch.KafkaWatch``), a
query that died while Kafka does not answer is not restarted into the outage (each attempt would die again and
grow the back-off to a minute); it is restarted as soon as Kafka answers again, whatever its back-off.

``status()`` is what /readyz, the node metadata and the metrics show: the pipeline's state (RUNNING, or
DEAD between a death and its restart), restarts so far, deaths in a row and the last error. A pipeline
that is DEAD, or that died ``keeps_dying_after`` times in a row, makes the node not ready.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from iqgraph.schema.types import PipelineInfo

log = logging.getLogger(__name__)


#: "SomeError: message", as Python prints an exception's last line (Java frames and wrappers are not).
_PYTHON_ERROR = re.compile(r"^(?!org\.|java\.|py4j\.|scala\.)([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
#: "some.package.SomeException: message" anywhere in a line: a Java exception, as Spark quotes a task's failure.
_JAVA_ERROR = re.compile(r"\b((?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Error|Exception)): [^\n]+")
#: Java exceptions that only wrap the cause (a failed job, a failed Py4J call, a dead query).
_WRAPPERS = frozenset(
    {
        "org.apache.spark.SparkException",
        "py4j.protocol.Py4JJavaError",
        "org.apache.spark.sql.streaming.StreamingQueryException",
    }
)


def error_summary(failure: BaseException) -> str:
    """Return the line that says why a query died: the first Python "SomeError: message" in its text.

    A query's exception wraps the real one in Spark's and Py4J's text (a Python worker's traceback inside
    a Java stack trace); the first Python error line names the cause (e.g. ``ModuleNotFoundError: No module
    named 'myapp'``). Without one, the first Java exception that is not a wrapper (e.g. a read task's
    ``org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before the position …``,
    quoted inside "Job aborted due to stage failure"); without that either, the text's first line.
    """
    text = str(failure).strip()
    for line in text.splitlines():
        if _PYTHON_ERROR.match(line.strip()):
            return line.strip()[:300]
    for line in text.splitlines():
        at = 0
        while match := _JAVA_ERROR.search(line, at):  # a wrapper's message may quote its cause: look inside it
            if match.group(1) not in _WRAPPERS:
                return match.group(0).strip()[:300]
            at = match.end(1)
    return (text.splitlines() or [type(failure).__name__])[0][:300]


class Supervised(Protocol):
    """What the supervisor watches and restarts: the node's StreamRunner."""

    def failure(self) -> BaseException | None:
        """Return why a query died, or None while every query runs."""

    def restart(self) -> None:
        """Restart every query over the partitions open now."""

    def last_applied(self) -> float:
        """Return the wall-clock time (time.time()) of the last batch applied to any partition."""


@dataclass(frozen=True)
class Backoff:
    """The wait before the n-th restart in a row: first_s × 2^(n-1), at most max_s."""

    first_s: float = 1.0
    max_s: float = 60.0

    def __call__(self, n: int) -> float:
        return min(self.first_s * 2 ** max(n - 1, 0), self.max_s)


class QuerySupervisor:
    """Watch a runner's streaming queries in a thread; restart the dead ones with backoff."""

    def __init__(
        self,
        runner: Supervised,
        interval_s: float = 1.0,
        backoff: Backoff | None = None,
        healthy_after_s: float = 30.0,
        keeps_dying_after: int = 3,
        clock: Callable[[], float] = time.time,
        kafka_reachable: Callable[[], bool] | None = None,
    ) -> None:
        self.runner = runner
        self.kafka_reachable = kafka_reachable
        self.interval_s = interval_s
        self.backoff = backoff or Backoff()
        self.healthy_after_s = healthy_after_s
        self.keeps_dying_after = keeps_dying_after
        self.clock = clock
        self._restarts = 0
        self._in_a_row = 0
        self._last_error: str | None = None
        self._dead_since: float | None = None
        self._restarted_at: float | None = None
        self._kafka_was_away = False  # Kafka did not answer since the last death: restart once it does
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="query-supervisor", daemon=True)

    def start(self) -> None:
        """Start supervising in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop supervising (before the runner stops its queries on purpose)."""
        self._stop.set()

    def status(self) -> PipelineInfo:
        """Return the pipeline's state as /readyz, the metadata and the metrics show it."""
        with self._lock:
            return PipelineInfo(
                "DEAD" if self._dead_since is not None else "RUNNING",
                self._restarts,
                self._in_a_row,
                self._last_error,
                self._in_a_row >= self.keeps_dying_after,
            )

    def check(self) -> None:
        """Look at the queries once: note a death, restart when its backoff is over, forgive a long run."""
        now = self.clock()
        with self._lock:
            dead = self._dead_since is not None
        if not dead:
            failure = self.runner.failure()
            if failure is None:
                self._forgive(now)
                return
            self._died(failure, now)
        if self._kafka_away():
            return
        with self._lock:
            since = self._dead_since
            due = since is not None and (self._kafka_was_away or now - since >= self.backoff(self._in_a_row))
        if due:
            self._restart(now)

    def _kafka_away(self) -> bool:
        """Return whether Kafka does not answer now (and remember it until the next restart)."""
        if self.kafka_reachable is None or self.kafka_reachable():
            return False
        with self._lock:
            self._kafka_was_away = True
        return True

    def _died(self, failure: BaseException, now: float, what: str = "a streaming query died") -> None:
        first_line = error_summary(failure)
        away = self._kafka_away()
        with self._lock:
            self._in_a_row += 1
            self._dead_since = now
            self._restarted_at = None
            self._last_error = first_line
            wait = self.backoff(self._in_a_row)
        when = "as soon as Kafka answers" if away else f"in {wait:.0f} s"
        log.warning("%s (%s); restarting %s (death %d in a row)", what, first_line, when, self._in_a_row)

    def _restart(self, now: float) -> None:
        with self._lock:
            self._kafka_was_away = False  # one restart at once after Kafka's return; a failed one waits its back-off
        try:
            self.runner.restart()
        except Exception as exc:  # noqa: BLE001 - a restart that fails counts as one more death
            log.debug("restarting the streaming queries failed", exc_info=True)
            self._died(exc, now, "restarting the streaming queries failed")
            return
        with self._lock:
            self._restarts += 1
            self._dead_since = None
            self._restarted_at = now
        log.warning("streaming queries restarted (restart %d)", self._restarts)

    def _forgive(self, now: float) -> None:
        with self._lock:
            restarted = self._restarted_at
        if restarted is None:
            return
        if now - restarted >= self.healthy_after_s or self.runner.last_applied() > restarted:
            with self._lock:
                self._in_a_row = 0
                self._restarted_at = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the supervisor itself must outlive any one round
                log.exception("query supervisor: a round failed")
