"""The request context: the node's StoreQueries, the limits, and the request's own DataLoaders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from iqgraph.schema.limits import Limits
from iqgraph.schema.loaders import Loaders

if TYPE_CHECKING:
    from iqgraph.schema.types import PeerQueries, StoreQueries


@dataclass
class Context:
    """What every resolver of one request reads from ``info.context``."""

    queries: StoreQueries
    limits: Limits
    loaders: Loaders = field(init=False)
    request: Any = None
    response: Any = None
    local: PeerQueries | None = None  # answers forwarded sub-requests (the internal _ fields)

    def __post_init__(self) -> None:
        self.loaders = Loaders(self.queries)


ContextGetter = Callable[..., Context]


def context_getter(queries: StoreQueries, limits: Limits | None = None) -> ContextGetter:
    """Return a function that makes a fresh Context (new DataLoaders) for each request.

    Call it as ``get_context(request=None, response=None)``, e.g. from an ASGI ``GraphQL.get_context``
    or ``schema.execute(query, context_value=get_context())``. Pass the Limits given to build_schema.
    """
    settled = limits or Limits()

    def get_context(request: Any = None, response: Any = None) -> Context:
        return Context(queries, settled, request=request, response=response)

    return get_context
