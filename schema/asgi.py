"""The Strawberry ASGI app of a schema: /graphql over POST and GET, GraphiQL in a browser.

Each request gets a fresh Context (its own DataLoaders) from ``context_getter``. A request that is not
GraphQL over HTTP at all (a body that is not JSON, no query, a wrong method) is answered with its HTTP
status and a GraphQL-shaped JSON error, code BAD_REQUEST, rather than Strawberry's plain text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cross_web import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from strawberry.asgi import GraphQL

from iqgraph.schema.context import Context
from iqgraph.schema.errors import BAD_REQUEST
from iqgraph.schema.limits import Limits

if TYPE_CHECKING:
    import strawberry
    from starlette.types import Receive, Scope, Send

    from iqgraph.schema.types import PeerQueries, StoreQueries


#: The header that marks a peer's forwarded sub-request: it is answered from local partitions only.
FORWARDED_HEADER = "x-iqgraph-forwarded"


class GraphQLApp(GraphQL[Context, None]):
    """Serve schema over HTTP, answering from queries within limits (give build_schema the same Limits).

    With ``local`` (the node's own partitions) and ``queries_for`` (the cluster's queries, bound to one
    request's Authorization header), a request marked with FORWARDED_HEADER is answered from local
    partitions only — a forwarded request is never forwarded again, so two nodes cannot loop.
    """

    def __init__(
        self,
        schema: strawberry.Schema,
        queries: StoreQueries,
        limits: Limits | None = None,
        *,
        local: PeerQueries | None = None,
        queries_for: Callable[[Any], StoreQueries] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(schema, **options)
        self._limits = limits or Limits()
        self._queries = queries
        self._local = local
        self._queries_for = queries_for

    async def get_context(self, request: Any, response: Any) -> Context:
        """Return the context of one request."""
        forwarded = request is not None and FORWARDED_HEADER in request.headers
        if forwarded and self._local is not None:
            queries: StoreQueries = self._local  # type: ignore[assignment]
        elif self._queries_for is not None:
            queries = self._queries_for(request)
        else:
            queries = self._queries
        return Context(queries, self._limits, request=request, response=response, local=self._local)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection; HTTP requests that are not GraphQL get a JSON error."""
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        response: Response
        try:
            response = await self.run(Request(scope=scope, receive=receive))
        except HTTPException as exc:
            error = {"message": exc.reason, "extensions": {"code": BAD_REQUEST}}
            response = JSONResponse({"data": None, "errors": [error]}, status_code=exc.status_code)
        await response(scope, receive, send)
