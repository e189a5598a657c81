"""A served node whose streaming query dies is restarted, and one that stalls is not called ready.

A real `iqgraph serve` process runs a user app whose transform calls a plain function of the user's module.
The function fails while a flag file `poison` exists (as a function that cannot run on the cluster would)
and blocks while `stall` exists (as a batch waiting on a lost worker would). The test flips the flags from
outside and reads /readyz, the node metadata and /metrics; at the end every value equals the ground truth.
"""

from __future__ import annotations

import itertools
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from iqgraph.examples.shop import build_app
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from tests.conftest import MakeTopic
from tests.support.nodes import scrape, start_node, wait_ready
from tests.support.pipeline import START_MS

PARTITIONS = 2
STALL_TIMEOUT_S = 4

USER_APP = """
import time
from dataclasses import replace
from pathlib import Path

from iqgraph.examples.shop import build_app
from iqgraph.streaming.definitions import App, KafkaSettings

FLAGS = Path({flags!r})


def checked(frame):
    '''The user's transform: fails while FLAGS/poison exists, blocks while FLAGS/stall does.'''
    if (FLAGS / "poison").exists():
        raise RuntimeError("the user's function failed: poisoned")
    while (FLAGS / "stall").exists():
        time.sleep(0.1)
    return frame


shop = build_app({topic!r}, {partitions}, KafkaSettings(bootstrap_servers={servers!r}))
app = App(
    "supervised",
    shop.topics,
    [replace(s, transform=checked) if s.name == "order_count" else s for s in shop.stores],
    kafka=shop.kafka,
)
"""


@dataclass
class Supervised:
    url: str
    flags: Path
    send: Callable[[int], None]
    events: list[tuple[str, dict[str, Any]]]
    log: Path

    def readyz(self) -> tuple[int, dict[str, Any]]:
        response = httpx.get(f"{self.url}/readyz", timeout=10)
        return response.status_code, response.json()

    def data(self, query: str) -> Any:
        body = httpx.post(f"{self.url}/graphql", json={"query": query}, timeout=30).json()
        assert "errors" not in body, body
        return body["data"]

    def until(self, what: str, check: Callable[[int, dict[str, Any]], bool], timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status, body = self.readyz()
        while not check(status, body):
            assert time.monotonic() < deadline, f"never {what}: last /readyz {status} {body}"
            time.sleep(0.25)
            status, body = self.readyz()
        return body

    def counts_reach_the_ground_truth(self, timeout: float = 60) -> None:
        """Wait until every count equals the produced events' (ready is not caught up: records may still wait)."""
        truth: dict[str, int] = {}
        for key, _ in self.events:
            truth[key] = truth.get(key, 0) + 1
        keys = sorted(truth)
        query = f"{{ orderCount {{ getMany(keys: {orjson.dumps(keys).decode()}) }} }}"
        deadline = time.monotonic() + timeout
        while (found := self.data(query)["orderCount"]["getMany"]) != [truth[k] for k in keys]:
            assert time.monotonic() < deadline, f"counts {found} never reached {[truth[k] for k in keys]}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def supervised(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervised]:
    topic = make_topic(PARTITIONS, prefix="supervised")
    generator = build_app(topic, PARTITIONS).generator
    assert generator is not None
    events = generator(53, START_MS)
    sent: list[tuple[str, dict[str, Any]]] = []

    def send(n: int) -> None:
        batch = list(itertools.islice(events, n))
        produce(broker.bootstrap_servers, topic, [(k.encode(), orjson.dumps(v), None) for k, v in batch])
        sent.extend(batch)

    home = tmp_path_factory.mktemp("supervised")
    flags = home / "flags"
    flags.mkdir()
    (home / "userapp.py").write_text(
        textwrap.dedent(
            USER_APP.format(flags=str(flags), topic=topic, partitions=PARTITIONS, servers=broker.bootstrap_servers)
        )
    )
    send(300)
    node = start_node(home, "userapp", "node-0", free_port(), ["--stall-timeout-s", str(STALL_TIMEOUT_S)])
    try:
        wait_ready([node])
        yield Supervised(node.url, flags, send, sent, node.log)
    finally:
        node.kill()


def test_a_query_that_keeps_dying_is_restarted_with_backoff_reported_and_recovers_exact(
    supervised: Supervised,
) -> None:
    status, body = supervised.readyz()
    assert status == 200 and body["pipeline"] == {
        "state": "RUNNING",
        "restarts": 0,
        "deathsInARow": 0,
        "keepsDying": False,
        "lastError": None,
    }
    supervised.counts_reach_the_ground_truth()

    (supervised.flags / "poison").touch()
    supervised.send(100)
    body = supervised.until("died", lambda s, b: s == 503 and b["pipeline"]["deathsInARow"] >= 1)
    assert body["ready"] is False and body["pipeline"]["lastError"]
    # restarted after 1 s, died again on the same records, restarted after 2 s, died again: keeps dying
    body = supervised.until(
        "reported as dying again and again",
        lambda s, b: b["pipeline"]["restarts"] >= 2 and b["pipeline"]["keepsDying"],
    )
    node = supervised.data("{ node { pipeline { state restarts deathsInARow keepsDying lastError } } }")["node"]
    assert node["pipeline"]["keepsDying"] and node["pipeline"]["restarts"] >= 2 and node["pipeline"]["lastError"]
    metrics = scrape(supervised.url)
    assert metrics.value("iqgraph_pipeline_restarts_total") >= 2
    # each death is one line: not Py4J's traceback of the batch's exception, nor Spark's ~70-line stack wrapping it
    log = supervised.log.read_text()
    assert log.count("a streaming query died (") >= 2, log[-3000:]
    assert "terminated with error" not in log and "Python Proxy" not in log, log[-5000:]
    assert metrics.value("iqgraph_pipeline_deaths_in_a_row") >= 3

    (supervised.flags / "poison").unlink()
    body = supervised.until("ready again", lambda s, b: s == 200, timeout=120)
    assert body["pipeline"]["state"] == "RUNNING" and body["pipeline"]["deathsInARow"] == 0
    supervised.counts_reach_the_ground_truth()


def test_a_pipeline_that_makes_no_progress_while_records_wait_is_not_ready(supervised: Supervised) -> None:
    supervised.until("ready", lambda s, b: s == 200, timeout=120)
    (supervised.flags / "stall").touch()
    supervised.send(50)
    body = supervised.until("stalled", lambda s, b: s == 503, timeout=60)
    stalled = [p for p in body["partitions"] if p["stalled"]]
    # secondsSinceApplied is rounded to ms in the body: a partition stalled at 4.0004 s reads 4.0
    assert stalled and all(p["lag"] > 0 and p["secondsSinceApplied"] >= STALL_TIMEOUT_S for p in stalled)
    assert body["pipeline"]["state"] == "RUNNING", "a stall is not a death"
    partitions = supervised.data("{ node { partitions { partition stalled lag secondsSinceApplied } } }")["node"]
    assert any(p["stalled"] for p in partitions["partitions"])

    (supervised.flags / "stall").unlink()
    body = supervised.until("ready after the stall", lambda s, b: s == 200, timeout=60)
    assert not any(p["stalled"] for p in body["partitions"])
    supervised.counts_reach_the_ground_truth()
