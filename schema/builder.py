"""Build an app's GraphQL schema from its stores.

Naming, for a store called ``order_count`` (key-value), ``orders_per_minute`` (window), ``items_sold``
(bloom):

==========================  ===============================================================
root field                  the store's name in camelCase: ``orderCount``; its type ``OrderCountStore``
store root field argument   ``maxLag`` (records): the staleness bound of every read under it
key-value store fields      ``get(key)``, ``getMany(keys)``, ``range(from, to, first, after)``,
                            ``prefix(prefix, first, after)`` (String keys only), ``all(first, after)``,
                            ``count`` (exact), ``approximateCount``
key-value connection        ``OrderCountEntryConnection { edges: [OrderCountEntryEdge!]!, pageInfo }``,
                            edge ``{ cursor, node: OrderCountEntry { key, value } }``
window store fields         ``fetch(key, from, to)`` → ``[OrdersPerMinuteWindow!]``,
                            ``fetchAll(from, to, first, after)``,
                            ``fetchRange(fromKey, toKey, from, to, first, after)``, ``count``
window                      ``OrdersPerMinuteWindow { key, start, end, value }`` (times: DateTime);
                            connections ``OrdersPerMinuteWindowConnection`` / ``…WindowEdge``
bloom store fields          ``mightContain(key)``, ``mightContainMany(keys)``, ``falsePositiveRate``,
                            ``approximateCount``
keys                        ``String`` (string keys) or ``Long`` (integer keys)
values                      see schema.value_types: a struct is the object type ``LatestOrder``
metadata                    ``stores``, ``node``, ``nodes``, ``keyMetadata(store, key)``
entity type                 the entity's name: ``Customer { key, <table columns>, <one field per
                            other store> }``; a store's field is its name in camelCase:
                            key-value → its value (``orderCount: Long``), window →
                            ``ordersPerMinute(from, to): [OrdersPerMinuteWindow!]``, bloom →
                            ``Boolean`` (mightContain) (schema.entities)
entity root fields          ``customer(key, maxLag)``, ``<plural>(keys, maxLag)`` (plural: the
                            entity's, default ``customers``), ``<plural>Page(first, after,
                            maxLag)`` → ``CustomerConnection`` / ``CustomerEdge``
relation fields             ``Relation("product", "Product", column="item")``: ``product(maxLag):
                            Product`` after ``item`` in the value type (instead of the column if
                            named like it); no column: on ``<Base>Entry`` / ``<Base>Window``,
                            following the key (schema.entities.relations)
owner-side fields           ``favourite_genre``: ``favouriteGenre(key, maxLag): <its type>`` and
                            ``favouriteGenreMany(keys, maxLag): [<its type>]``; a struct type is
                            named ``FavouriteGenre`` (schema.owner_fields)
subscriptions (asked for)   ``orderCountWatch(keys, after)``, ``ordersPerMinuteWatchWindows(keys,
                            from, after)``, ``itemsSoldWatchContains(keys)``, a ranking's
                            ``topCustomersWatchTop(group, first)``, an entity's ``customerWatch(keys)``;
                            their types are named last (schema.live.subscriptions)
==========================  ===============================================================

Fields that read stores are nullable, so a failure (an error in ``errors`` with its path) nulls only
that field, or that key's item in ``getMany`` / ``mightContainMany``; the rest of the answer stands.

Type names are unique within a schema: should two names meet, the later gets a numeric suffix (the
stores' own types are named first, in store order, then value types). Store names whose camelCase
collides with another store's or with a metadata field are refused with SchemaDefinitionError, and so
are an entity whose type names (``Customer``, ``CustomerEdge``, ``CustomerConnection``) a store's types
have already, an entity root field another root field is (the message suggests ``plural=``), and
relations to no entity or to no column (each error one line, naming what to rename). Without entities
the schema is exactly what it was before entities existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import strawberry
from graphql import (
    ASTValidationRule,
    GraphQLError,
    GraphQLSyntaxError,
    NoSchemaIntrospectionCustomRule,
    OperationDefinitionNode,
    parse,
    specified_rules,
    validate,
)
from strawberry.extensions import SchemaExtension
from strawberry.schema.config import StrawberryConfig
from strawberry.types import ExecutionContext, ExecutionResult

from iqgraph.schema import wire
from iqgraph.schema.bloom_fields import bloom_type
from iqgraph.schema.compiled import CompiledQueries, RequestMetrics, run_compiled
from iqgraph.schema.context import Context
from iqgraph.schema.dynamic import Arg, Field, object_type, optional, resolved_field, resolver_with
from iqgraph.schema.entities.batches import Reads
from iqgraph.schema.entities.fields import EntityPlan, entity_root_fields, entity_targets, plan_entities
from iqgraph.schema.entities.object_type import entity_type
from iqgraph.schema.entities.relations import Target, entry_fields, value_links
from iqgraph.schema.errors import (
    ErrorCodes,
    SchemaDefinitionError,
    in_document_order,
    log_errors,
    with_codes,
)
from iqgraph.schema.internal import internal_fields
from iqgraph.schema.keys import key_kind
from iqgraph.schema.kv_fields import key_value_type
from iqgraph.schema.limits import DocumentChecks, Limits
from iqgraph.schema.live.subscriptions import subscription_type
from iqgraph.schema.metadata import METADATA_FIELDS, METADATA_TYPES, metadata_fields
from iqgraph.schema.metrics import GraphQLMetrics, MetricsExtension
from iqgraph.schema.naming import TypeNames, camel_case, pascal_case
from iqgraph.schema.owner_fields import call_field, owner_root_fields
from iqgraph.schema.persisted import PersistedDocuments
from iqgraph.schema.ranking_fields import RankingEntry, ranking_entry, ranking_type
from iqgraph.schema.reports import ClusterReports
from iqgraph.schema.resolving import MAX_LAG, StorePlan, StoreScope, checked_bound
from iqgraph.schema.scalars import SCALARS, Long
from iqgraph.schema.types import EntityInfo, OwnerFieldInfo, StoreInfo
from iqgraph.schema.value_types import LinkError, ValueTypes
from iqgraph.schema.window_fields import WindowNode, window_node, window_type

DEFAULT_CACHE_SIZE = 1024
#: The internal endpoint's documents are few (``schema.wire``'s): a small cache holds them all.
INTERNAL_CACHE_SIZE = 128
RESERVED_TYPES = {
    "Query",
    "Mutation",
    "Subscription",
    "PageInfo",
    *METADATA_TYPES,
    *(definition.name for definition in SCALARS.values()),
    "Date",
    "Decimal",
    "JSON",
    "String",
    "Int",
    "Float",
    "Boolean",
    "ID",
}
_NODE_SUFFIX = {"key_value": "Entry", "window": "Window", "bloom": "", "ranking": "Entry"}
_BUILDERS: dict[str, Callable[[StorePlan], type]] = {
    "key_value": key_value_type,
    "window": window_type,
    "bloom": bloom_type,
    "ranking": ranking_type,
}


class IqGraphSchema(strawberry.Schema):
    """A Strawberry schema that logs unexpected errors with their traceback and expected ones briefly.

    With ``compiled`` set (build_schema does unless told not to), a query its plans cover runs compiled
    (schema.compiled); the rest on Strawberry and graphql-core.
    """

    compiled: CompiledQueries | None = None
    request_metrics: RequestMetrics | None = None

    async def execute(
        self,
        query: str | None,
        variable_values: dict[str, Any] | None = None,
        context_value: Any | None = None,
        root_value: Any | None = None,
        operation_name: str | None = None,
        allowed_operation_types: Any = None,
        operation_extensions: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ExecutionResult:
        """Execute a request; errors that bypass the extensions (e.g. syntax errors) get their code too."""
        result = await self.execute_compiled(
            query, variable_values, context_value, operation_name, operation_extensions
        )
        if result is not None:
            return result
        result = await super().execute(
            query,
            variable_values,
            context_value,
            root_value,
            operation_name,
            allowed_operation_types,
            operation_extensions=operation_extensions,
            **kwargs,
        )
        return _finished(result)

    async def stream(self, query: str | None, *args: Any, **kwargs: Any) -> Any:
        """Stream an operation (a websocket's, an SSE request's) with a context of its own (Context.for_operation)."""
        if len(args) > 1:  # the arguments of strawberry.Schema.stream: context_value is the third
            args = (args[0], _for_operation(args[1]), *args[2:])
        elif "context_value" in kwargs:
            kwargs["context_value"] = _for_operation(kwargs["context_value"])
        return await super().stream(query, *args, **kwargs)

    async def execute_compiled(
        self,
        query: str | None,
        variables: dict[str, Any] | None,
        context: Any,
        operation_name: str | None,
        extensions: dict[str, Any] | None,
    ) -> ExecutionResult | None:
        """Return the result of a query run by its compiled plan; None when no plan covers it."""
        if self.compiled is None or not isinstance(query, str) or not isinstance(context, Context):
            return None
        plan = self.compiled.plan(query, operation_name)
        if plan is None:
            return None
        coerced = plan.coerce_variables(variables)
        if coerced is None:
            return None
        return _finished(await run_compiled(plan, context, variables, coerced, extensions, self.request_metrics))

    def trust(self, documents: PersistedDocuments) -> None:
        """Validate the trusted documents against this schema, with its limits (ManifestError naming one that
        does not validate), and compile their plans once, kept for the schema's life."""
        rules = self.compiled.checks.validation_rules if self.compiled is not None else specified_rules
        documents.check(lambda document: self._errors_of(document, rules), self._pin)

    def _errors_of(self, document: str, rules: Any) -> list[str]:
        try:
            ast = parse(document)
        except GraphQLSyntaxError as exc:
            return [exc.message]
        return [error.message for error in validate(self._schema, ast, rules)]

    def _pin(self, document: str) -> None:
        if self.compiled is None:
            return
        operations = [d for d in parse(document).definitions if isinstance(d, OperationDefinitionNode)]
        names = [d.name.value if d.name else None for d in operations]
        self.compiled.pin(document, {None, *names} if len(names) == 1 else set(names))

    def process_errors(self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None) -> None:
        """Log the errors of one request (before ErrorCodes masks them)."""
        log_errors(errors)


def _for_operation(context: Any) -> Any:
    """Return the context one operation of a connection runs with: fresh reports and loaders (ours), else context."""
    return context.for_operation() if isinstance(context, Context) else context


def _finished(result: ExecutionResult) -> ExecutionResult:
    """Return result with every error coded (unexpected ones masked), in document order."""
    if result.errors:
        result.errors = in_document_order(result.data, with_codes(result.errors))
    return result


def _root_field(store: StoreInfo) -> str:
    field = camel_case(store.name)
    if field in METADATA_FIELDS:
        raise SchemaDefinitionError(f"store {store.name!r} would be the field {field!r}, which is metadata: rename it")
    if store.kind not in _BUILDERS:
        raise SchemaDefinitionError(f"store {store.name!r} has kind {store.kind!r}: expected {', '.join(_BUILDERS)}")
    return field


def plan_stores(
    stores: Sequence[StoreInfo],
    limits: Limits,
    targets: Mapping[str, Target] | None = None,
    names: TypeNames | None = None,
) -> dict[str, StorePlan]:
    """Return the plan of each store: root field, type names, key and value types, in store order.

    targets: the entities relations may lead to; names: the type names given out (a new registry if none).
    """
    names = names or TypeNames(RESERVED_TYPES)
    targets = targets or {}
    fields: dict[str, str] = {}
    reserved: dict[str, tuple[str, str, str, str]] = {}
    for store in stores:
        field = _root_field(store)
        if field in fields.values():
            other = next(n for n, f in fields.items() if f == field)
            raise SchemaDefinitionError(f"stores {other!r} and {store.name!r} would both be the field {field!r}")
        fields[store.name] = field
        base = pascal_case(store.name)
        node = names.new(base + _NODE_SUFFIX[store.kind]) if _NODE_SUFFIX[store.kind] else ""
        edge, connection = (names.new(f"{node}Edge"), names.new(f"{node}Connection")) if node else ("", "")
        reserved[store.name] = (names.new(f"{base}Store"), node, edge, connection)
    values = ValueTypes(names)
    plans: dict[str, StorePlan] = {}
    for store in stores:
        about = f"A value of store {store.name}" + (f": {store.description}" if store.description else ".")
        try:
            value = values.of(store.value_type, pascal_case(store.name), about, value_links(store, targets))
        except LinkError as exc:
            raise SchemaDefinitionError(str(exc)) from None
        plans[store.name] = StorePlan(
            store,
            fields[store.name],
            *reserved[store.name],
            key_kind(store.key_type),
            value,
            limits,
            entry_fields(store, targets),
        )
    return plans


def _store_field(plan: StorePlan, windows: Mapping[str, WindowNode], rankings: Mapping[str, RankingEntry]) -> Field:
    if plan.name in windows:
        store_type = window_type(plan, windows[plan.name])
    elif plan.name in rankings:
        store_type = ranking_type(plan, rankings[plan.name])
    else:
        store_type = _BUILDERS[plan.info.kind](plan)
    default = StoreScope()

    def resolve(root: Any, info: strawberry.Info, max_lag: Long | None = None) -> Any:
        bound = checked_bound(max_lag)
        return default if bound is None else StoreScope(bound)

    description = plan.info.description or f"The {plan.info.kind.replace('_', '-')} store {plan.name}."
    return resolved_field(  # nullable: a store's error nulls it alone, never its siblings (or the whole answer)
        plan.field,
        resolver_with(resolve, [Arg("max_lag", "maxLag", Long | None, MAX_LAG)], optional(store_type)),
        description,
    )


def _entity_fields(
    entities: Sequence[EntityInfo],
    plans: Mapping[str, StorePlan],
    targets: Mapping[str, Target],
    names: TypeNames,
    windows: Mapping[str, WindowNode],
    federated: bool = False,
) -> tuple[list[Field], list[tuple[EntityPlan, type, Reads]]]:
    """Return the root fields of every entity, and each entity's plan, type (which relations lead to) and reads."""
    taken = {p.field: f"store {name!r}" for name, p in plans.items()}
    taken.update({field: "the metadata" for field in METADATA_FIELDS})
    planned = plan_entities(entities, plans, targets, names, taken)
    made = [(plan, *entity_type(plan, windows, targets, federated)) for plan in planned]
    return [f for plan, cls, reads in made for f in entity_root_fields(plan, cls, reads)], made


def _owner_fields(
    owner_fields: Sequence[OwnerFieldInfo],
    limits: Limits,
    names: TypeNames,
    plans: Mapping[str, StorePlan],
    entity_fields: Sequence[Field],
) -> list[Field]:
    """Return the root fields of the owner-side fields."""
    if not owner_fields:
        return []
    taken = {p.field: f"store {name!r}" for name, p in plans.items()}
    taken.update({field: "the metadata" for field in METADATA_FIELDS})
    taken.update({f.name: "an entity" for f in entity_fields})
    return owner_root_fields(owner_fields, limits, names, taken)


def build_schema(
    stores: Sequence[StoreInfo],
    limits: Limits | None = None,
    *,
    entities: Sequence[EntityInfo] = (),
    owner_fields: Sequence[OwnerFieldInfo] = (),
    description: str | None = None,
    cache_size: int = DEFAULT_CACHE_SIZE,
    metrics: GraphQLMetrics | None = None,
    extensions: Sequence[Callable[[], SchemaExtension]] = (),
    compiled: bool = True,
    introspection: bool = True,
    subscriptions: bool = False,
    federation: bool = False,
) -> strawberry.Schema:
    """Return the schema in which every store and every entity is a typed root field, next to the metadata fields.

    entities: key spaces whose stores compose into one type each (schema.entities), and the targets of the
    stores' relations (schema.entities.relations). owner_fields: functions run on a key's owner (schema.owner_fields).

    limits sets the documented defaults (page size) and the document limits (tokens, aliases, depth:
    schema.limits.DocumentChecks); the request context (see context_getter) enforces the rest, so give
    both the same Limits. The parser and validation caches keep the last cache_size distinct documents
    (fewer when they are long: schema.limits.DocumentCache). With metrics, every request is counted and
    timed (schema.metrics); extensions (e.g. tracing) are added after the built-in ones. compiled: queries
    over store fields run as compiled plans (schema.compiled) unless extensions are given. Without
    introspection, a document asking for ``__schema`` or ``__type`` fails validation. subscriptions: add the
    Subscription type (schema.live.subscriptions), served from the context's ``live``. federation: a federation v2
    subgraph, its entities keyed by ``key`` (schema.federation).
    """
    settled = limits or Limits()
    names = TypeNames(RESERVED_TYPES)
    targets = entity_targets(entities)
    plans = plan_stores(stores, settled, targets, names)
    windows = {name: window_node(p) for name, p in plans.items() if p.info.kind == "window"}
    rankings = {name: ranking_entry(p) for name, p in plans.items() if p.info.kind == "ranking"}
    entity_fields, entity_types = _entity_fields(entities, plans, targets, names, windows, federation)
    fields = [
        *(_store_field(p, windows, rankings) for p in plans.values()),
        *entity_fields,
        *metadata_fields(plans),
        *_owner_fields(owner_fields, settled, names, plans, entity_fields),
    ]
    query = object_type("Query", fields, description)
    subscription = subscription_type(plans, names, rankings, entity_types) if subscriptions else None
    rules: list[type[ASTValidationRule]] = [] if introspection else [NoSchemaIntrospectionCustomRule]
    checks = DocumentChecks(settled, cache_size, rules)  # tokens, aliases, depth; caches bounded (schema.limits)
    installed: list[Callable[[], SchemaExtension]] = [ErrorCodes, ClusterReports, *checks.extensions(), *extensions]
    store_fields = {p.field: name for name, p in plans.items()}
    if metrics is not None:  # first: its operation hook ends last, timing and seeing the final errors
        installed.insert(0, lambda: MetricsExtension(metrics, store_fields, frozenset(plans)))
    config = StrawberryConfig(scalar_map=SCALARS)
    if federation:
        from iqgraph.schema.federation import FederatedSchema

        schema: IqGraphSchema = FederatedSchema(
            query=query, subscription=subscription, extensions=installed, config=config, federation_version="2.11"
        )
    else:
        schema = IqGraphSchema(query=query, subscription=subscription, extensions=installed, config=config)
    if compiled and not extensions:  # another extension would not see compiled requests
        roots = {*store_fields, *METADATA_FIELDS, *(f.name for f in entity_fields)}
        schema.compiled = CompiledQueries(schema._schema, roots, checks, cache_size)
        schema.request_metrics = None if metrics is None else RequestMetrics(metrics, store_fields, frozenset(plans))
    return schema


def build_internal_schema(
    limits: Limits, owner_fields: Sequence[OwnerFieldInfo] = (), request_metrics: RequestMetrics | None = None
) -> IqGraphSchema:
    """Return the schema of the internal endpoint peers call: ``_lookup``, ``_scan``, ``_count``, ``_call``, ``node``.

    Served only behind the peers' signature check (``app.security.peer_auth``); bounded by the public limits.
    request_metrics (the public schema's) times the point reads answered on the lean path.
    """
    settled = limits or Limits()
    node = [f for f in metadata_fields({}) if f.name == "node"]
    calls = [call_field(owner_fields, settled)] if owner_fields else []
    query = object_type("Query", [*internal_fields(settled), *calls, *node], "Internal: what peers ask each other.")
    # the public limits (tokens, depth, aliases), but a peer's batch of point reads is up to MAX_LOOKUPS aliases
    peers = dataclasses.replace(settled, max_aliases=max(settled.max_aliases, wire.MAX_LOOKUPS))
    checks = DocumentChecks(peers, INTERNAL_CACHE_SIZE)
    installed: list[Callable[[], SchemaExtension]] = [ErrorCodes, *checks.extensions()]
    schema = IqGraphSchema(query=query, extensions=installed, config=StrawberryConfig(scalar_map=SCALARS))
    schema.request_metrics = request_metrics
    return schema
