"""The Strawberry ASGI app of a schema: /graphql over POST and GET, GraphiQL in a browser.

Each request gets a fresh Context (its own DataLoaders) from ``context_getter``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strawberry.asgi import GraphQL

from schema.context import Context, context_getter
from schema.limits import Limits

if TYPE_CHECKING:
    import strawberry

    from schema.types import StoreQueries


class GraphQLApp(GraphQL[Context, None]):
    """Serve schema over HTTP, answering from queries within limits (give build_schema the same Limits)."""

    def __init__(
        self, schema: strawberry.Schema, queries: StoreQueries, limits: Limits | None = None, **options: Any
    ) -> None:
        super().__init__(schema, **options)
        self._make_context = context_getter(queries, limits)

    async def get_context(self, request: Any, response: Any) -> Context:
        """Return the context of one request."""
        return self._make_context(request=request, response=response)
