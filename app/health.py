"""Peer health checks for static membership: a peer whose /healthz fails is treated as down."""

from __future__ import annotations

import logging
import threading

import httpx

from iqgraph.app.membership import StaticMembership

log = logging.getLogger(__name__)


class PeerHealth:
    """Poll every peer's /healthz and tell the membership which are down."""

    def __init__(self, membership: StaticMembership, interval_s: float = 1.0, timeout_s: float = 0.5) -> None:
        self.membership = membership
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
        """Return the ids of the peers that fail their health check now."""
        down = set()
        for member in self.membership.current().members.values():
            if member.id == self.membership.node_id:
                continue
            try:
                client.get(f"{member.url}/healthz", timeout=self.timeout_s).raise_for_status()
            except httpx.HTTPError:
                down.add(member.id)
        return frozenset(down)

    def _run(self) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set():
                down = self.check(client)
                if down != self.membership.current().down:
                    log.warning("peers down: %s", ", ".join(sorted(down)) or "none")
                self.membership.set_down(down)
                self._stop.wait(self.interval_s)
