"""A peer marked down is logged once, "peers down: node-1", whichever path noticed it first (issue 42 part 5).

In the failover drills node-0 never logged "peers down: node-2" after node-2 was killed: a forwarded request to it
failed first and marked it down silently (``ClusterReplicas.mark_down``), and the poller then saw no change to log —
only "peers down: none" when it came back. Here the peer is a real HTTP server on loopback that answers /readyz, is
stopped, and is started again on the same port.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from iqgraph.app.cluster.health import PeerHealth
from iqgraph.app.cluster.membership import Member, StaticMembership
from iqgraph.app.cluster.replicas import PeerStates
from iqgraph.app.query.executor import ClusterReplicas
from iqgraph.streaming.broker import free_port

LOGGER = "iqgraph.app.cluster.membership"


class Ready(BaseHTTPRequestHandler):
    """A peer's /readyz: up, no partitions."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"ready": True, "partitions": []}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        """Keep the test's output quiet."""


class Peer:
    """A peer's listener on a fixed loopback port, stopped and started again at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Ready)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def peer() -> Iterator[Peer]:
    running = Peer()
    running.start()
    yield running
    running.stop()


def node_0(peer: Peer) -> tuple[StaticMembership, ClusterReplicas, PeerHealth]:
    """Return node-0's map of a cluster of two (node-1: peer), what its queries mark down, and its poller."""
    members = [Member("node-0", "http://127.0.0.1:1"), Member("node-1", f"http://127.0.0.1:{peer.port}")]
    membership = StaticMembership("node-0", members, {"orders": 2})
    states = PeerStates()
    replicas = ClusterReplicas(membership, "node-0", lambda topic, partition: None, states)
    return membership, replicas, PeerHealth(membership, states, interval_s=0.05, timeout_s=1.0)


def down_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and "peers down" in r.getMessage()]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.05)


def test_a_peer_a_failed_request_marks_down_is_logged_once_and_its_return_once(
    peer: Peer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    membership, replicas, health = node_0(peer)
    peer.stop()  # node-1 killed: a forwarded request to it fails before the poller's next round
    replicas.mark_down("node-1")  # what the executor does with a peer whose request failed
    health.start()
    try:
        time.sleep(0.5)  # ~10 rounds of the poller, each finding node-1 down too
        assert down_lines(caplog) == ["peers down: node-1"]
        assert membership.current().down == {"node-1"}
        peer.start()
        wait_for(lambda: not membership.current().down, "node-1 back in the map")
        time.sleep(0.3)
        replicas.mark_down("node-0")  # this node is never down to itself: nothing changes, nothing is logged
    finally:
        health.stop()
    assert down_lines(caplog) == ["peers down: node-1", "peers down: none"]


def test_a_peer_the_poller_finds_down_first_is_logged_once_too(peer: Peer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    membership, replicas, health = node_0(peer)
    health.start()
    try:
        time.sleep(0.2)
        assert down_lines(caplog) == []  # up: nothing to say
        peer.stop()
        wait_for(lambda: membership.current().down == {"node-1"}, "node-1 down in the map")
        replicas.mark_down("node-1")  # a request failing after the poller noticed: no second line
        time.sleep(0.3)
    finally:
        health.stop()
    assert down_lines(caplog) == ["peers down: node-1"]
