"""TLS: the node's HTTPS server options and how its clients verify peers (stub: filled by the TLS work)."""

from __future__ import annotations

import ssl
from typing import Any

from iqgraph.app.settings import Settings


def server_options(settings: Settings) -> dict[str, Any]:
    """Return uvicorn's options to serve HTTPS with the settings' certificate and key ({} for plain HTTP)."""
    return {}


def peer_verify(settings: Settings) -> ssl.SSLContext | bool:
    """Return how the node's HTTP clients verify peers' certificates (httpx's ``verify``)."""
    return True
