"""The peer poller: every second, each member's ``/readyz`` — is it up, and how are its partitions.

What it learns goes to ``PeerStates`` (the routing core reads the state and lag of each replica from it:
a restoring active is passed over for a caught-up standby) and, under static membership, to the map's
set of down peers. A peer that does not answer is down until it answers again.
"""

from __future__ import annotations

import ssl
import threading

import httpx

from iqgraph.app.cluster.membership import Membership, StaticMembership
from iqgraph.app.cluster.replicas import PeerStates
from iqgraph.schema.wire import READY_PATH, decode_partition


class PeerHealth:
    """Poll every peer's /readyz; tell PeerStates (and a static membership) what is up and how."""

    def __init__(
        self,
        membership: Membership,
        states: PeerStates,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.membership = membership
        self.verify = verify  # how peers' certificates are verified (app.security.tls.peer_verify)
        self.states = states
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-health", daemon=True)

    def start(self) -> None:
        """Start polling in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()

    def check(self, client: httpx.Client) -> frozenset[str]:
        """Poll every peer once; return the ids of those that did not answer."""
        down = set()
        for member in list(self.membership.current().members.values()):
            if member.id == self.membership.node_id:
                continue
            try:
                body = client.get(f"{member.url}{READY_PATH}", timeout=self.timeout_s).json()
                partitions = [decode_partition(p) for p in body.get("partitions") or []]
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
                down.add(member.id)
                self.states.mark_down(member.id)
                continue
            self.states.update(member.id, partitions)
        return frozenset(down)

    def _run(self) -> None:
        with httpx.Client(verify=self.verify) as client:
            while not self._stop.is_set():
                down = self.check(client)
                if isinstance(self.membership, StaticMembership):
                    self.membership.set_down(down)  # which logs a change ("peers down: …")
                self._stop.wait(self.interval_s)
