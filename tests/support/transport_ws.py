"""A graphql-transport-ws client over a sync websocket, for a node's /graphql websocket route."""

from __future__ import annotations

from typing import Any

import orjson
from websockets.sync.client import ClientConnection, connect


class TransportWS:
    """A graphql-transport-ws client over a sync websocket."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    def send(self, message: dict[str, Any]) -> None:
        self.ws.send(orjson.dumps(message).decode())

    def receive(self, timeout: float = 5.0) -> dict[str, Any]:
        found: dict[str, Any] = orjson.loads(self.ws.recv(timeout))
        return found

    def init(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send({"type": "connection_init", **({"payload": payload} if payload is not None else {})})
        return self.receive()

    def subscribe(self, id: str, query: str, variables: dict[str, Any]) -> None:
        self.send({"id": id, "type": "subscribe", "payload": {"query": query, "variables": variables}})


def websocket(address: str, **options: Any) -> ClientConnection:
    return connect(f"ws://{address}/graphql", subprotocols=["graphql-transport-ws"], open_timeout=5, **options)
