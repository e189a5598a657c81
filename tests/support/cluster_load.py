"""Load for cluster tests: an ingest that remembers what it produced, and answers checked against it."""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from confluent_kafka import KafkaError, Message, Producer

from iqgraph.streaming.broker import BATCHING, JAVA_PARTITIONER
from iqgraph.streaming.definitions import Event
from tests.support.nodes import NodeProcess

GET_MANY = "query($k: [String!]!) { orderCount { getMany(keys: $k) } }"
GET_ONE = "query($k: String!) { orderCount { get(key: $k) count } }"


class Ingest:
    """Produce shop orders, batched; remember the order in which each key was produced."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        events: Iterator[Event],
        rate: float = 150,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.rate = rate  # events per second while started
        self.producer = Producer({**JAVA_PARTITIONER, **BATCHING, **(config or {}), "bootstrap.servers": bootstrap})
        self.topic = topic
        self.events = events
        self.keys: list[str] = []  # every key produced, in produce order
        self.at: dict[str, list[int]] = defaultdict(list)  # key -> its indexes in keys
        self.failed: list[KafkaError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)

    @property
    def produced(self) -> int:
        """Return how many events were handed to the producer so far."""
        return len(self.keys)

    def produce(self, count: int) -> None:
        """Produce the next count events now and wait until the broker has them."""
        for _ in range(count):
            self._one()
        self.flush()

    def start(self) -> None:
        """Keep producing rate events per second in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop producing, wait until the broker has every event, and close the producer."""
        self.halt()
        self._thread.join(10)
        self.flush()
        del self.producer  # its connections close now, not when the session's broker goes away

    def halt(self) -> None:
        """Stop producing (the thread ends after its current event)."""
        self._stop.set()

    def flush(self) -> None:
        """Wait until every event is delivered; fail if one was not."""
        assert self.producer.flush(30) == 0, "events left undelivered"
        assert not self.failed, self.failed[:3]

    def count(self, key: str, before: int) -> int:
        """Return how many of the first `before` events have key."""
        return bisect.bisect_left(self.at.get(key, []), before)

    def distinct(self, before: int) -> int:
        """Return how many keys the first `before` events have."""
        return sum(1 for indexes in self.at.values() if indexes[0] < before)

    def _one(self) -> None:
        key, value = next(self.events)
        assert isinstance(key, str)
        # recorded before it is sent: an answer that counts it can never find it missing from the bound
        self.at[key].append(len(self.keys))
        self.keys.append(key)
        self.producer.produce(self.topic, key=key.encode(), value=orjson.dumps(value), on_delivery=self._delivered)
        self.producer.poll(0)

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.failed.append(error)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._one()
            next_at += 1 / self.rate
            self._stop.wait(max(next_at - time.monotonic(), 0))


@dataclass(frozen=True)
class Answered:
    """One response of the load: what was asked where, when, and what had been produced around it."""

    node: str
    keys: tuple[str, ...]
    many: bool  # getMany of keys, else get(key) and count
    sent: float
    received: float
    produced_before: int
    produced_after: int
    body: dict[str, Any]

    @property
    def errors(self) -> list[Any]:
        return list(self.body.get("errors") or [])

    @property
    def staleness(self) -> list[dict[str, Any]]:
        return list((self.body.get("extensions") or {}).get("staleness") or [])

    def values(self) -> list[Any]:
        """Return the order count answered per key (None when missing)."""
        found = (self.body.get("data") or {}).get("orderCount") or {}
        return list(found.get("getMany") or [None] * len(self.keys)) if self.many else [found.get("get")]

    def count(self) -> Any:
        return ((self.body.get("data") or {}).get("orderCount") or {}).get("count")


def ask(client: httpx.Client, node: NodeProcess, keys: Sequence[str], many: bool, ingest: Ingest) -> Answered:
    """POST one query to node; an HTTP failure is recorded as an error answer, never raised."""
    query, variables = (GET_MANY, {"k": list(keys)}) if many else (GET_ONE, {"k": keys[0]})
    before, sent = ingest.produced, time.monotonic()
    try:
        response = client.post(f"{node.url}/graphql", json={"query": query, "variables": variables}, timeout=30)
        if response.status_code == 200:
            body = response.json()
        else:  # an error answer, with what the node said (its errors' codes) when it said it in JSON
            said = response.json() if response.headers.get("content-type", "").find("json") >= 0 else {}
            body = {**said, "errors": [f"HTTP {response.status_code}", *(said.get("errors") or [])]}
    except (httpx.HTTPError, ValueError) as exc:
        body = {"errors": [f"{exc.__class__.__name__}: {exc}"]}
    return Answered(node.id, tuple(keys), many, sent, time.monotonic(), before, ingest.produced, body)


def readyz(client: httpx.Client, node: NodeProcess) -> tuple[int, dict[str, Any]] | None:
    """Return node's /readyz status and body, or None when it does not answer."""
    try:
        response = client.get(f"{node.url}/readyz", timeout=2)
        return response.status_code, response.json()
    except (httpx.HTTPError, ValueError):
        return None
