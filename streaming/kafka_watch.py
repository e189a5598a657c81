"""Whether Kafka answers, and since when it does not: what the log says once, and what the query supervisor waits on.

A streaming query dies when its Kafka source cannot reach the brokers (a restart, a lost machine, the whole cluster
down). Restarting it on a fixed back-off either spins while Kafka is away or, once the back-off has grown, leaves the
node idle up to a minute after Kafka is back. ``KafkaWatch`` asks Kafka for its metadata every ``every_s`` (a thread;
one admin client kept open, so librdkafka's reconnects carry over; a request that fails is asked again once before
Kafka is called unreachable) and logs the two transitions once each: "Kafka at
… unreachable since HH:MM:SS, waiting" and "Kafka back after N s". Meanwhile every librdkafka client of the node
would log each failed reconnect (hundreds of lines a minute): ``ConnectionNoise`` drops those lines.

``status()`` is what /readyz and /metrics show of it (``KafkaStatus``: reachable, and since when not), read
without asking Kafka: a probe may take its whole timeout, a scrape or a readiness probe must not wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaStatus:
    """What the node's last probe learned of Kafka: whether it answered, and since when it has not (unix time:
    the probe that first failed)."""

    reachable: bool
    unreachable_since: float | None = None


class KafkaWatch:
    """Probe Kafka's metadata on demand; remember since when it has not answered."""

    def __init__(
        self,
        config: Mapping[str, str],
        timeout_s: float = 2.0,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        probe: Callable[[float], None] | None = None,
    ) -> None:
        self.bootstrap = config.get("bootstrap.servers", "?")
        self.timeout_s = timeout_s
        self.every_s = every_s
        self.clock = clock
        self._config: dict[str, str | int | float | bool] = dict(config)
        self._probe = probe or self._list_topics
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._checked_at: float | None = None
        self._up = True
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.unreachable_since: float | None = None
        self._status = KafkaStatus(True)  # one object, replaced whole: read without the probe's lock

    def start(self) -> None:
        """Probe every every_s in a thread, so that an outage is logged even when no query dies of it."""
        self._thread = threading.Thread(target=self._run, name="kafka-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop probing."""
        self._stopped.set()

    def status(self) -> KafkaStatus:
        """Return what the last probe learned (reachable until one failed), without asking Kafka."""
        return self._status

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s):
            self.reachable()

    def reachable(self) -> bool:
        """Return whether Kafka answered its last metadata request (asking again if the answer is older than
        every_s)."""
        with self._lock:
            now = self.clock()
            if self._checked_at is not None and now - self._checked_at < self.every_s:
                return self._up
            up = self._answers()
            self._checked_at = self.clock()
            self._transition(up, now)
            return up

    def _answers(self) -> bool:
        """Return whether Kafka answers a metadata request, asked twice before saying no: one request may wait out
        its timeout while the cluster answers (seen at a kill -9 of one broker of three, on busy cores: a false
        "unreachable" logged, then "back after 3 s", and answers marked as given while Kafka was away)."""
        for _ in range(2):
            try:
                self._probe(self.timeout_s)
                return True
            except KafkaException:
                continue
        return False

    def _transition(self, up: bool, now: float) -> None:
        if up and self.unreachable_since is not None:
            log.warning("Kafka back after %.0f s", now - self.unreachable_since)
            self.unreachable_since = None
        elif not up and self.unreachable_since is None:
            self.unreachable_since = now
            since = time.strftime("%H:%M:%S", time.localtime(now))
            log.warning("Kafka at %s unreachable since %s, waiting", self.bootstrap, since)
        self._up = up
        self._status = KafkaStatus(up, self.unreachable_since)

    def _list_topics(self, timeout_s: float) -> None:
        if self._admin is None:
            self._admin = AdminClient(dict(self._config), logger=log)
        self._admin.list_topics(timeout=timeout_s)


class ConnectionNoise(logging.Filter):
    """Drop librdkafka's lines about one connection failing (each client logs each reconnect while Kafka is away):
    ``KafkaWatch`` says once that Kafka is unreachable. Errors a call returns still reach its caller."""

    NOISE = ("Connect to ipv", "Connection refused", "all brokers are down", "brokers are down", "Disconnected")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("rdkafka" in message and any(noise in message for noise in self.NOISE))
