"""The request context: the request's StoreQueries, its reports, the limits, its own DataLoaders and entity batches.

A websocket connection has one context (Strawberry makes it at the handshake); each of its operations runs
with a fresh copy (``for_operation``: its own reports and DataLoaders), so no answer is served from another
operation's cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.schema.entities.batches import OpenBatches
from iqgraph.schema.limits import Limits
from iqgraph.schema.loaders import Loaders
from iqgraph.schema.reports import Reports

if TYPE_CHECKING:
    from iqgraph.schema.types import LiveQueries, PeerQueries, StoreQueries


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
    live: LiveQueries | None = None  # what subscriptions follow (None: this endpoint serves none)
    connection_params: dict[str, Any] | None = None  # a websocket's connection_init payload (Strawberry sets it)

    def __post_init__(self) -> None:
        self.loaders = Loaders(self.queries, self.limits.max_keys, self.principal)
        self.entities = OpenBatches()

    def authenticate(self, principal: Principal) -> None:
        """Make principal the caller (a websocket authenticated by its connection_init payload)."""
        self.principal = principal
        self.queries = self.queries.bind(self.reports, principal)
        self.loaders = Loaders(self.queries, self.limits.max_keys, principal)

    def for_operation(self) -> Context:
        """Return a context for one more operation of the same connection: same caller, new reports and loaders."""
        reports = Reports()
        fresh = Context(
            self.queries.bind(reports, self.principal),
            self.limits,
            reports,
            request=self.request,
            response=self.response,
            local=self.local,
            principal=self.principal,
            live=self.live,
        )
        fresh.connection_params = self.connection_params
        return fresh


ContextGetter = Callable[..., Context]


def request_context(
    queries: StoreQueries,
    limits: Limits,
    request: Any = None,
    response: Any = None,
    local: PeerQueries | None = None,
    principal: Principal = ANONYMOUS,
    live: LiveQueries | None = None,
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
        live=live,
    )


def context_getter(
    queries: StoreQueries, limits: Limits | None = None, live: LiveQueries | None = None
) -> ContextGetter:
    """Return a function that makes a fresh Context (new DataLoaders, new reports) for each request.

    Call it as ``get_context(request=None, response=None)``, e.g. from an ASGI ``GraphQL.get_context``
    or ``schema.execute(query, context_value=get_context())``. Pass the Limits given to build_schema. The
    caller may read every store (embedding code authenticates its callers itself). live: what the
    subscriptions follow, if the schema has them.
    """
    settled = limits or Limits()

    def get_context(request: Any = None, response: Any = None) -> Context:
        return request_context(queries, settled, request, response, live=live)

    return get_context
