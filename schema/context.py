"""The request context: the request's StoreQueries, its reports, the limits, its own DataLoaders and entity batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.schema.batches import OpenBatches
from iqgraph.schema.limits import Limits
from iqgraph.schema.loaders import Loaders
from iqgraph.schema.reports import Reports

if TYPE_CHECKING:
    from iqgraph.schema.types import PeerQueries, StoreQueries


@dataclass
class Context:
    """What every resolver of one request reads from ``info.context``.

    ``queries`` is bound to this request's ``reports`` (staleness, positions, partial scans), which
    ``schema.reports.ClusterReports`` adds to the response.
    """

    queries: StoreQueries
    limits: Limits
    reports: Reports = field(default_factory=Reports)
    loaders: Loaders = field(init=False)
    entities: OpenBatches = field(init=False)  # relation targets gathered per entity and bound
    request: Any = None
    response: Any = None
    local: PeerQueries | None = None  # answers forwarded sub-requests (the internal _ fields)
    principal: Principal = ANONYMOUS  # the caller: every store read is checked against it (schema.access)

    def __post_init__(self) -> None:
        self.loaders = Loaders(self.queries, self.limits.max_keys, self.principal)
        self.entities = OpenBatches()


ContextGetter = Callable[..., Context]


def request_context(
    queries: StoreQueries,
    limits: Limits,
    request: Any = None,
    response: Any = None,
    local: PeerQueries | None = None,
    principal: Principal = ANONYMOUS,
) -> Context:
    """Return the context of one request: queries bound to its own reports and its caller."""
    reports = Reports()
    return Context(
        queries.bind(reports, principal),
        limits,
        reports,
        request=request,
        response=response,
        local=local,
        principal=principal,
    )


def context_getter(queries: StoreQueries, limits: Limits | None = None) -> ContextGetter:
    """Return a function that makes a fresh Context (new DataLoaders, new reports) for each request.

    Call it as ``get_context(request=None, response=None)``, e.g. from an ASGI ``GraphQL.get_context``
    or ``schema.execute(query, context_value=get_context())``. Pass the Limits given to build_schema. The
    caller may read every store (embedding code authenticates its callers itself).
    """
    settled = limits or Limits()

    def get_context(request: Any = None, response: Any = None) -> Context:
        return request_context(queries, settled, request, response)

    return get_context
