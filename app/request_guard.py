"""The limits every HTTP request meets before any GraphQL (stub: filled by the limits work)."""

from __future__ import annotations

from typing import Any

from iqgraph.app.settings import Settings


class RequestGuard:
    """ASGI wrapper bounding every request of the node's server."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one request within the limits."""
        await self.app(scope, receive, send)
