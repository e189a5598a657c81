"""The ASGI gate of client authentication: every request to a protected path carries a Principal, or gets 401.

``AuthGate`` authenticates each request with an ``app.security.auth.Authenticator`` and puts the caller in the scope
(``PRINCIPAL_SCOPE_KEY``; ``principal_of`` reads it, schema.access); a request it refuses gets HTTP 401
with one GraphQL error ``UNAUTHENTICATED`` and no data (a websocket is closed with 4401 before it is
accepted). With ``websocket_init_auth``, a websocket whose handshake carries no credentials (a browser cannot
set its headers) passes without a principal: the GraphQL app authenticates its ``connection_init`` payload
or closes it (``schema.asgi``). Probes, ``/metrics``, GraphiQL's page and assets, the app's ``/dashboard`` page
and the peers' ``/internal/`` endpoint (app.security.peer_auth checks their signatures) are not protected; every other
path is, so an endpoint added later is protected unless it is named here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import parse_qsl

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from iqgraph.app.security.auth import Authenticator, Unauthenticated
from iqgraph.schema.access import ANONYMOUS, PRINCIPAL_SCOPE_KEY, Principal
from iqgraph.schema.asgi import ConnectionAuth
from iqgraph.schema.errors import UNAUTHENTICATED

#: Paths a request may reach without a principal: probes, metrics, GraphiQL's assets, the peers' endpoint, the
#: app's dashboard (a static page holding no data: its websocket authenticates by connection_init).
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/internal", "/dashboard"})
PUBLIC_PREFIXES = ("/graphql/static/", "/internal/")
#: The 401's body: one GraphQL error, no data, nothing about why.
REFUSAL_BODY = orjson.dumps(
    {
        "errors": [
            {
                "message": "authentication required: send a valid bearer token or API key",
                "extensions": {"code": UNAUTHENTICATED},
            }
        ]
    }
)
WEBSOCKET_UNAUTHORIZED = 4401  # graphql-transport-ws' close code for an unauthenticated socket
_CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")


def default_protected(method: str, path: str) -> bool:
    """Return whether a request needs a principal: all but probes, metrics, GraphiQL's assets and /internal/."""
    return path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIXES)


def _asks_for_graphiql(scope: Scope) -> bool:
    """Return whether an http scope is a GET for GraphiQL's page (Accept lists text/html, no query: no data)."""
    if scope.get("method") != "GET":
        return False
    if any(name == "query" for name, _ in parse_qsl(scope.get("query_string", b"").decode("latin-1"), True)):
        return False  # with a query, the GET is a GraphQL request whatever it accepts
    accept = _headers(scope, (b"accept",)).get("accept", "")
    for media_range in accept.split(","):
        kind, *params = (p.strip().lower() for p in media_range.split(";"))
        if kind == "text/html":
            return _weight(params) > 0
    return False


def _weight(params: list[str]) -> float:
    q = next((p[2:] for p in params if p.startswith("q=")), "1")
    try:
        return float(q)
    except ValueError:
        return 0.0


def _headers(scope: Scope, names: tuple[bytes, ...]) -> dict[str, str]:
    """Return the named headers of a scope; a repeated one is joined with ", " (so it never authenticates)."""
    found: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        if raw_name.lower() in names:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            found[name] = f"{found[name]}, {value}" if name in found else value
    return found


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None


class AuthGate:
    """ASGI middleware putting the caller's Principal in each http and websocket scope, or refusing the request.

    Args:
        authenticator: None when authentication is off: every request is ANONYMOUS.
        protected: (method, path) → whether the request needs a principal; the others pass without one.
        graphiql_path: where a browser's GET (no query) is GraphiQL's page, which passes without one.
        websocket_init_auth: a websocket without credential headers passes without one (see the module).
    """

    def __init__(
        self,
        app: ASGIApp,
        authenticator: Authenticator | None,
        protected: Callable[[str, str], bool] = default_protected,
        *,
        graphiql_path: str | None = "/graphql",
        websocket_init_auth: bool = False,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.protected = protected
        self.graphiql_path = graphiql_path
        self.websocket_init_auth = websocket_init_auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Authenticate one request, then serve it, or refuse it."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.authenticator is None:
            scope[PRINCIPAL_SCOPE_KEY] = ANONYMOUS
        elif self._needs_principal(scope):
            headers = _headers(scope, _CREDENTIAL_HEADERS)
            if not headers and scope["type"] == "websocket" and self.websocket_init_auth:
                await self.app(scope, receive, send)  # no principal: the app authenticates its connection_init
                return
            try:
                scope[PRINCIPAL_SCOPE_KEY] = await self.authenticator.authenticate(headers, _client(scope))
            except Unauthenticated:
                await self._refuse(scope, receive, send, self.authenticator.challenge)
                return
        await self.app(scope, receive, send)

    def _needs_principal(self, scope: Scope) -> bool:
        method, path = scope.get("method", "GET"), scope["path"]  # a websocket opens with a GET
        if not self.protected(method, path):
            return False
        return not (scope["type"] == "http" and path == self.graphiql_path and _asks_for_graphiql(scope))

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, challenge: str) -> None:
        if scope["type"] == "websocket":
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": WEBSOCKET_UNAUTHORIZED})
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(REFUSAL_BODY)).encode()),
            (b"www-authenticate", challenge.encode()),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": REFUSAL_BODY})


def init_authenticator(authenticator: Authenticator) -> ConnectionAuth:
    """Return how a websocket's connection_init credentials are checked: as headers, by authenticator."""

    async def authenticate(credentials: Mapping[str, str], client: str | None) -> Principal | None:
        try:
            return await authenticator.authenticate(credentials, client)
        except Unauthenticated:
            return None  # logged by the authenticator; the socket is closed

    return authenticate
