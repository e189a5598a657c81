"""Compiled execution of cached documents: a query over store fields runs without graphql-core's executor.

A document (cache key: its text and operation name, bounded LRU) is parsed and validated once with the
schema's own rules, then compiled into a ``CompiledQuery`` specialised to the schema: per selected field,
its response name, how it resolves (the store field's own resolver function, an attribute of a value
object, ``__typename``), how its arguments are read from literals and variables, and how its result is
completed (non-null checks, lists, scalar output coercion, the sub-selection). Executing a plan coerces
the variables, runs every field of a level at once (so the per-request DataLoaders batch every point read
of the request, per store, per partition, per peer), completes values and collects errors located as
graphql-core locates them (message, locations, path, extensions).

What a plan covers: a query operation whose root fields are store fields (``orderCount(maxLag:) {…}``),
entity fields (``customer(key:)``, ``customers(keys:)``, ``customersPage``) or metadata fields
(``stores``, ``node``, ``nodes``, ``keyMetadata``), everything under them (point reads, counts,
connections of scans, value objects, entities and relations), ``__typename``, aliases and variables. Anything else —
introspection, the internal fields peers call, fragments, directives, two fields under one response name,
a document that does not validate, variables that do not coerce — gets no plan, and ``IqGraphSchema``
runs it on Strawberry/graphql-core as before: a plan answers only what it can answer with the same
response (the schema tests run every query both ways and compare: tests/schema/conftest.py ``Api.run``).

The request-level rules are shared with the Strawberry path, not copied: request options and partial-scan
errors (``schema.reports``), error codes and masking (``schema.errors.with_codes``), error logging
(``log_errors``) and the request metrics (``schema.metrics.GraphQLMetrics.observe_request``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import GeneratorType
from typing import TYPE_CHECKING, Any

from graphql import (
    DocumentNode,
    FieldNode,
    GraphQLEnumType,
    GraphQLError,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLScalarType,
    GraphQLSchema,
    GraphQLString,
    OperationDefinitionNode,
    OperationType,
    get_named_type,
    located_error,
)
from graphql.error import GraphQLSyntaxError
from graphql.execution.values import VariableValues, get_argument_values, get_variable_values
from graphql.pyutils import inspect as graphql_inspect
from graphql.utilities import get_operation_ast, type_from_ast
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types import ExecutionResult

from iqgraph.schema.errors import log_errors, with_codes
from iqgraph.schema.limits import DocumentCache, DocumentChecks
from iqgraph.schema.metrics import request_labels
from iqgraph.schema.reports import apply_request_options, partial_errors

if TYPE_CHECKING:
    from iqgraph.schema.context import Context
    from iqgraph.schema.metrics import GraphQLMetrics

DEFINITION = GraphQLCoreConverter.DEFINITION_BACKREF  # where Strawberry keeps a field's definition
Path = tuple[str | int, ...]


class _Info:
    """What a resolver a plan calls gets as its info: the request context, and nothing else.

    Every resolver of the schema reads only ``info.context`` (schema.resolving.context), but those marked
    ``reads_ahead``, which get a _SelectionInfo; a resolver that needs more of graphql-core's info must keep
    its field out of plans (raise _Unsupported for it).
    """

    __slots__ = ("context",)

    def __init__(self, context: Context) -> None:
        self.context = context


class _SelectionInfo:
    """The info of a resolver that reads ahead (schema.selection.reads_ahead): the context and its selection.

    It has what ``schema.selection.subfields`` reads of graphql-core's info; a plan has no fragments.
    """

    __slots__ = ("context", "field_nodes", "return_type", "variable_values")
    fragments: Mapping[str, Any] = {}

    def __init__(self, context: Context, node: FieldNode, return_type: GraphQLOutputType, variables: Any) -> None:
        self.context = context
        self.field_nodes = [node]
        self.return_type = return_type
        self.variable_values = variables


class _Unsupported(Exception):
    """The document uses something a plan does not cover: it runs on graphql-core."""


class _Errors:
    """The field errors of one execution, in the order they happen; none under a position already nulled."""

    def __init__(self) -> None:
        self.errors: list[GraphQLError] = []
        self._nulled: set[Path] = set()

    def add(self, error: GraphQLError, path: Path) -> None:
        if any(path[:i] in self._nulled for i in range(len(path) + 1)):
            return
        self._nulled.add(path)
        self.errors.append(error)


Complete = Callable[[Any, Path, _Errors, "_Run"], Any]


@dataclass
class _Run:
    """One execution of a plan: its context, info and coerced variables."""

    info: _Info
    variables: VariableValues


@dataclass(frozen=True)
class _Field:
    """One selected field: how to resolve it and complete its result."""

    response_name: str
    node: FieldNode
    parent: GraphQLObjectType
    field_name: str
    return_type: GraphQLOutputType
    resolve: Callable[[Any, _Run], Any]  # source, run -> value or awaitable
    complete: Complete


class CompiledQuery:
    """A query operation compiled against a schema: execute(context, variables) -> (data, errors)."""

    def __init__(
        self,
        schema: GraphQLSchema,
        document: DocumentNode,
        operation: OperationDefinitionNode,
        roots: Collection[str],
    ) -> None:
        self.schema = schema
        self.document = document
        self.operation = operation
        query = schema.query_type
        assert query is not None  # noqa: S101 - every schema has a query type
        self.root_fields = _fields(query, operation.selection_set.selections, roots)
        self.one_read_at_a_time = _one_field_at_a_time(query, operation.selection_set.selections)
        self._string_lists = [
            definition.variable.name.value
            for definition in operation.variable_definitions or ()
            if _is_string_list(type_from_ast(schema, definition.type))
        ]

    def coerce_variables(self, inputs: dict[str, Any] | None) -> VariableValues | None:
        """Return the operation's variables coerced; None when they do not coerce (graphql-core reports it).

        A list of strings given for a ``[String!]`` variable (getMany's keys) is taken as it is: graphql-core
        would check and copy each of its items to the same list; the other variables coerce as usual.
        """
        inputs = inputs or {}
        taken = {
            name: value
            for name in self._string_lists
            if isinstance(value := inputs.get(name), list) and all(type(item) is str for item in value)
        }
        rest = {**inputs, **dict.fromkeys(taken, [])} if taken else inputs
        coerced = get_variable_values(self.schema, self.operation.variable_definitions or (), rest)
        if not isinstance(coerced, VariableValues):
            return None
        for name, value in taken.items():
            coerced.coerced[name] = list(value)
        return coerced

    async def execute(
        self, context: Context, variables: VariableValues
    ) -> tuple[dict[str, Any] | None, list[GraphQLError]]:
        """Return the data and the field errors of one execution."""
        errors = _Errors()
        run = _Run(_Info(context), variables)
        try:
            found = _execute_fields(self.root_fields, None, (), errors, run)
            data = await found if _is_awaitable(found) else found
        except GraphQLError as error:  # a non-null root field failed: no data
            errors.add(error, ())
            data = None
        return data, errors.errors


def _one_field_at_a_time(parent: GraphQLObjectType, selections: Any) -> bool:
    """Return whether at most one field of the selection resolves at a time, at every level: one field per level
    besides ``__typename``, and no list of objects above the last (each item's fields would resolve together).
    Such a plan never has two reads pending together: its loaders have nothing to batch (``Loaders.at_once``)."""
    fields = [s for s in selections if s.name.value != "__typename"]  # every one a FieldNode (``_fields``)
    if len(fields) != 1:
        return len(fields) == 0
    node = fields[0]
    kind = parent.fields[node.name.value].type
    if node.selection_set is None:
        return True
    if isinstance(kind, GraphQLNonNull):
        kind = kind.of_type
    named = get_named_type(kind)
    if isinstance(kind, GraphQLList) or not isinstance(named, GraphQLObjectType):
        return False
    return _one_field_at_a_time(named, node.selection_set.selections)


def _is_string_list(kind: Any) -> bool:
    kind = kind.of_type if isinstance(kind, GraphQLNonNull) else kind
    if not isinstance(kind, GraphQLList):
        return False
    item = kind.of_type.of_type if isinstance(kind.of_type, GraphQLNonNull) else kind.of_type
    return item is GraphQLString


# -- compiling ------------------------------------------------------------------------------------


def _fields(parent: GraphQLObjectType, selections: Any, roots: Collection[str] | None = None) -> list[_Field]:
    """Return the plans of a selection set's fields (roots: at the root, the fields a plan may select)."""
    fields: list[_Field] = []
    seen: set[str] = set()
    for selection in selections:
        if not isinstance(selection, FieldNode) or selection.directives:
            raise _Unsupported("fragments and directives run on graphql-core")
        name = selection.name.value
        response_name = selection.alias.value if selection.alias else name
        if response_name in seen:
            raise _Unsupported("fields merged under one response name run on graphql-core")
        seen.add(response_name)
        if name == "__typename":
            type_name = parent.name
            fields.append(_Field(response_name, selection, parent, name, _TYPENAME, _constant(type_name), _as_is))
            continue
        definition = parent.fields.get(name)
        if definition is None or name.startswith("__"):
            raise _Unsupported(f"field {name} runs on graphql-core")
        strawberry_field = (definition.extensions or {}).get(DEFINITION)
        if strawberry_field is None or strawberry_field.permission_classes or strawberry_field.extensions:
            raise _Unsupported(f"field {name} is not a plain Strawberry field")
        resolver = strawberry_field.base_resolver
        if roots is not None and (resolver is None or name not in roots):
            raise _Unsupported(f"root field {name} is not a store field")
        if resolver is None:
            resolve = _attribute(strawberry_field.python_name)
        else:
            resolve = _call(definition, selection, resolver.wrapped_func, strawberry_field.arguments)
        complete = _completer(definition.type, selection, parent, name)
        fields.append(_Field(response_name, selection, parent, name, definition.type, resolve, complete))
    return fields


def _constant(value: Any) -> Callable[[Any, _Run], Any]:
    return lambda _source, _run: value


def _attribute(name: str) -> Callable[[Any, _Run], Any]:
    return lambda source, _run: getattr(source, name)


def _call(definition: Any, node: FieldNode, fn: Callable[..., Any], arguments: Any) -> Callable[[Any, _Run], Any]:
    """Return how to call a field's resolver function: coerced arguments by their Python names."""
    python_names = {a.graphql_name or a.python_name: a.python_name for a in arguments}
    for name, argument in definition.args.items():
        if name not in python_names or not isinstance(get_named_type(argument.type), GraphQLScalarType):
            raise _Unsupported(f"argument {name} is not a scalar or a list of scalars")
    literal_only = not any(_has_variable(a.value) for a in node.arguments or ())
    fixed: dict[str, Any] | None = None
    if literal_only:
        fixed = {python_names[k]: v for k, v in get_argument_values(definition, node, None).items()}

    def resolve(source: Any, run: _Run) -> Any:
        kwargs = fixed
        if kwargs is None:
            kwargs = {python_names[k]: v for k, v in get_argument_values(definition, node, run.variables).items()}
        return fn(source, run.info, **kwargs)

    def resolve_without_arguments(source: Any, run: _Run) -> Any:  # most fields of value objects and entities
        return fn(source, run.info)

    if not getattr(fn, "reads_ahead", False):
        return resolve_without_arguments if fixed == {} else resolve

    def resolve_with_selection(source: Any, run: _Run) -> Any:
        kwargs = fixed
        if kwargs is None:
            kwargs = {python_names[k]: v for k, v in get_argument_values(definition, node, run.variables).items()}
        return fn(source, _SelectionInfo(run.info.context, node, definition.type, run.variables), **kwargs)

    return resolve_with_selection


def _has_variable(value: Any) -> bool:
    from graphql import ListValueNode, ObjectValueNode, VariableNode

    if isinstance(value, VariableNode):
        return True
    if isinstance(value, ListValueNode):
        return any(_has_variable(v) for v in value.values)
    if isinstance(value, ObjectValueNode):
        return any(_has_variable(f.value) for f in value.fields)
    return False


def _completer(kind: GraphQLOutputType, node: FieldNode, parent: GraphQLObjectType, field_name: str) -> Complete:
    """Return how to complete a resolved value of kind, as graphql-core's complete_value does."""
    if isinstance(kind, GraphQLNonNull):
        inner = _completer(kind.of_type, node, parent, field_name)
        message = f"Cannot return null for non-nullable field {parent}.{field_name}."

        def non_null(value: Any, path: Path, errors: _Errors, run: _Run) -> Any:
            completed = inner(value, path, errors, run)
            if _is_awaitable(completed):
                return _non_null_later(completed, message)
            if completed is None:
                raise TypeError(message)
            return completed

        return non_null
    if isinstance(kind, GraphQLList):
        item_type = kind.of_type
        item = _completer(item_type, node, parent, field_name)
        leaves = _leaf_items(item_type)

        def complete_list(value: Any, path: Path, errors: _Errors, run: _Run) -> Any:
            if isinstance(value, Exception):
                raise value
            if value is None:
                return None
            if leaves is not None and type(value) is list:
                done = leaves(value)
                if done is not None:
                    return done
            return _complete_items(value, item, item_type, node, path, errors, run)

        return complete_list
    if isinstance(kind, GraphQLScalarType | GraphQLEnumType):
        coerce = kind.coerce_output_value

        def leaf(value: Any, path: Path, errors: _Errors, run: _Run) -> Any:
            if isinstance(value, Exception):
                raise value
            if value is None:
                return None
            coerced = coerce(value)
            if coerced is None:
                raise TypeError(
                    f"Expected `{graphql_inspect(kind)}.coerce_output_value({graphql_inspect(value)})` to return "
                    f"non-nullable value, returned: {graphql_inspect(coerced)}"
                )
            return coerced

        return leaf
    if isinstance(kind, GraphQLObjectType):
        if kind.is_type_of is not None or node.selection_set is None:
            raise _Unsupported(f"type {kind.name} runs on graphql-core")
        fields = _fields(kind, node.selection_set.selections)

        def complete_object(value: Any, path: Path, errors: _Errors, run: _Run) -> Any:
            if isinstance(value, Exception):
                raise value
            if value is None:
                return None
            return _execute_fields(fields, value, path, errors, run)

        return complete_object
    raise _Unsupported(f"type {kind} runs on graphql-core")


def _leaf_items(item_type: GraphQLOutputType) -> Callable[[list[Any]], list[Any] | None] | None:
    """Return how a list of scalars completes in one pass (None: items of another kind).

    The pass answers None — and the item-by-item completion runs, errors and all — unless every item
    completes without an error: no exception in its place, no output coercion failing, no null where
    the items are non-null. Coercing a scalar has no side effect, so running both costs only time.
    """
    non_null = isinstance(item_type, GraphQLNonNull)
    leaf = item_type.of_type if isinstance(item_type, GraphQLNonNull) else item_type
    if not isinstance(leaf, GraphQLScalarType | GraphQLEnumType):
        return None
    coerce = leaf.coerce_output_value

    def complete(values: list[Any]) -> list[Any] | None:
        if any(isinstance(v, Exception) for v in values):
            return None
        try:
            done = [None if v is None else coerce(v) for v in values]
        except Exception:  # noqa: BLE001 - the item-by-item completion reports it where it happened
            return None
        if None in done and (non_null or done.count(None) != values.count(None)):
            return None
        return done

    return complete


_TYPENAME = GraphQLNonNull(GraphQLString)
_AWAITABLE_TYPES: dict[type, bool] = {}  # whether values of a type are awaitable: a property of the type


def _is_awaitable(value: Any) -> bool:
    """Return inspect.isawaitable(value), looked up by type (its Awaitable check costs on every field)."""
    kind = type(value)
    known = _AWAITABLE_TYPES.get(kind)
    if known is None:
        if kind is GeneratorType:  # a generator-based coroutine is awaitable by its flags, not its type
            return inspect.isawaitable(value)
        known = _AWAITABLE_TYPES[kind] = inspect.isawaitable(value)
    return known


def _as_is(value: Any, _path: Path, _errors: _Errors, _run: _Run) -> Any:
    return value


async def _non_null_later(completed: Awaitable[Any], message: str) -> Any:
    value = await completed
    if value is None:
        raise TypeError(message)
    return value


# -- executing ------------------------------------------------------------------------------------


def _execute_fields(fields: list[_Field], source: Any, path: Path, errors: _Errors, run: _Run) -> Any:
    """Return the fields' results as a dict, or an awaitable of it when a field is asynchronous."""
    results: dict[str, Any] = {}
    pending: list[tuple[str, Awaitable[Any]]] = []
    for field in fields:
        field_path = (*path, field.response_name)
        try:
            value = _execute_field(field, source, field_path, errors, run)
        except GraphQLError:  # a non-null field failed: this object is null, its other fields never run
            _settle_in_background(aw for _, aw in pending)
            raise
        if _is_awaitable(value):
            pending.append((field.response_name, value))
            results[field.response_name] = None
        else:
            results[field.response_name] = value
    if not pending:
        return results
    return _gather_at(results, pending)


_SETTLING: set[asyncio.Future[Any]] = set()


def _settle_in_background(awaitables: Iterable[Awaitable[Any]]) -> None:
    """Run to the end, unobserved, the fields a sibling's failure nulled (as graphql-core settles them)."""
    for awaitable in awaitables:
        future = asyncio.ensure_future(awaitable)
        _SETTLING.add(future)
        future.add_done_callback(_settled)


def _settled(future: asyncio.Future[Any]) -> None:
    _SETTLING.discard(future)
    if not future.cancelled():
        future.exception()  # retrieved: its error is under a nulled position


async def _gather_at(container: Any, pending: list[tuple[Any, Awaitable[Any]]]) -> Any:
    """Return container (a dict or list) with each pending (place, awaitable) awaited, concurrently, in place.

    A lone awaitable is awaited in place: nothing runs beside it, so a task of its own would only cost.
    """
    if len(pending) == 1:
        place, awaitable = pending[0]
        container[place] = await awaitable
        return container
    values = await asyncio.gather(*(value for _, value in pending))
    for (place, _), value in zip(pending, values, strict=True):
        container[place] = value
    return container


def _execute_field(field: _Field, source: Any, path: Path, errors: _Errors, run: _Run) -> Any:
    try:
        value = field.resolve(source, run)
        if _is_awaitable(value):
            return _complete_later(field, value, path, errors, run)
        completed = field.complete(value, path, errors, run)
        if _is_awaitable(completed):
            return _await_completed(field, completed, path, errors)
        return completed
    except Exception as raw:  # noqa: BLE001 - a field's failure is its error, as in graphql-core
        return _field_error(field.return_type, field.node, raw, path, errors)


async def _complete_later(field: _Field, value: Awaitable[Any], path: Path, errors: _Errors, run: _Run) -> Any:
    try:
        completed = field.complete(await value, path, errors, run)
        if _is_awaitable(completed):
            completed = await completed
        return completed
    except Exception as raw:  # noqa: BLE001 - a field's failure is its error, as in graphql-core
        return _field_error(field.return_type, field.node, raw, path, errors)


async def _await_completed(field: _Field, completed: Awaitable[Any], path: Path, errors: _Errors) -> Any:
    try:
        return await completed
    except Exception as raw:  # noqa: BLE001 - a field's failure is its error, as in graphql-core
        return _field_error(field.return_type, field.node, raw, path, errors)


def _field_error(return_type: GraphQLOutputType, node: FieldNode, raw: Exception, path: Path, errors: _Errors) -> Any:
    """Return None for a failed field and record its error, located; raise it if the field is non-null."""
    error = located_error(raw, [node], list(path))
    if isinstance(return_type, GraphQLNonNull):
        raise error
    errors.add(error, path)
    return None


def _complete_items(
    items: Any, item: Complete, item_type: GraphQLOutputType, node: FieldNode, path: Path, errors: _Errors, run: _Run
) -> Any:
    completed: list[Any] = []
    pending: list[tuple[int, Awaitable[Any]]] = []
    for index, value in enumerate(items):
        item_path = (*path, index)
        try:
            done = item(value, item_path, errors, run)
        except Exception as raw:  # noqa: BLE001 - an item's failure nulls the item, as in graphql-core
            try:
                done = _field_error(item_type, node, raw, item_path, errors)
            except GraphQLError:  # a non-null item failed: the list is null, its other items never complete
                _settle_in_background(aw for _, aw in pending)
                raise
        if _is_awaitable(done):
            pending.append((index, _item_later(done, item_type, node, item_path, errors)))
        completed.append(done)
    if not pending:
        return completed
    return _gather_at(completed, pending)


async def _item_later(
    done: Awaitable[Any], item_type: GraphQLOutputType, node: FieldNode, path: Path, errors: _Errors
) -> Any:
    try:
        return await done
    except Exception as raw:  # noqa: BLE001 - an item's failure nulls the item, as in graphql-core
        return _field_error(item_type, node, raw, path, errors)


# -- the cache and the request ----------------------------------------------------------------------


class CompiledQueries:
    """Plans of recent documents (schema.limits.DocumentCache): the compiled plan, or None where graphql-core must run.

    roots: the root fields a plan may select (the store fields and the metadata fields; never the
    internal fields, which answer peers). A document is parsed and validated by the schema's
    ``DocumentChecks`` (schema.limits: within max_tokens, with the schema's rules), in the caches the
    Strawberry path reads: a document that gets no plan is not parsed or validated again there. One that
    breaks a limit gets no plan, and the Strawberry path refuses it. A document too long to cache gets no
    plan either: it runs on graphql-core, parsed once.
    """

    def __init__(self, schema: GraphQLSchema, roots: Collection[str], checks: DocumentChecks, maxsize: int) -> None:
        self.schema = schema
        self.roots = frozenset(roots)
        self.checks = checks
        self._plans: DocumentCache[CompiledQuery | None] = DocumentCache(maxsize)
        self._pinned: dict[tuple[str, str | None], CompiledQuery | None] = {}  # trusted documents' (pin)

    def plan(self, query: str, operation_name: str | None) -> CompiledQuery | None:
        """Return the plan of a document's operation, or None when it must run on graphql-core."""
        key = (query, operation_name)
        if key in self._pinned:
            return self._pinned[key]
        if len(query) > self._plans.max_chars:
            return None
        return self._plans.get(key, len(query), lambda: self._compile(query, operation_name))

    def pin(self, query: str, operation_names: Collection[str | None]) -> None:
        """Compile the plans of a document's operations now, and keep them for the schema's life (a trusted
        document's: schema.persisted)."""
        for name in operation_names:
            self._pinned[(query, name)] = self._compile(query, name)

    def _compile(self, query: str, operation_name: str | None) -> CompiledQuery | None:
        try:
            document = self.checks.parse(query)
        except GraphQLSyntaxError:
            return None
        if self.checks.validate(self.schema, query, document):
            return None
        operation = get_operation_ast(document, operation_name)
        if operation is None or operation.operation is not OperationType.QUERY or operation.directives:
            return None
        if len([d for d in document.definitions if not isinstance(d, OperationDefinitionNode)]):
            return None  # fragments
        try:
            return CompiledQuery(self.schema, document, operation, self.roots)
        except _Unsupported:
            return None


async def run_compiled(
    plan: CompiledQuery,
    context: Context,
    inputs: dict[str, Any] | None,
    variables: VariableValues,
    extensions: Mapping[str, Any] | None,
    metrics: RequestMetrics | None,
) -> ExecutionResult:
    """Execute a plan as the Strawberry path executes a request: options, errors, reports and metrics alike.

    inputs: the request's variables as sent; variables: as coerce_variables coerced them.
    """
    started = time.perf_counter()
    apply_request_options(context, extensions)
    context.loaders.at_once = plan.one_read_at_a_time
    if metrics is not None:
        context.loaders.observe = metrics.metrics.observe_lookup
    data, errors = await plan.execute(context, variables)
    errors = [*errors, *partial_errors(context.reports)]
    if errors:
        log_errors(errors)
        errors = with_codes(errors)
    result = ExecutionResult(data=data, errors=errors or None, extensions=context.reports.extensions())
    if metrics is not None:
        metrics.observe(plan, inputs or {}, time.perf_counter() - started, errors)
    return result


@dataclass(frozen=True)
class RequestMetrics:
    """The request metrics of a schema, observed as the MetricsExtension observes them."""

    metrics: GraphQLMetrics
    store_fields: Mapping[str, str]
    stores: Collection[str]

    def observe(self, plan: CompiledQuery, variables: Mapping[str, Any], elapsed: float, errors: list[Any]) -> None:
        """Count and time one compiled request per root field and store, and its errors per code."""
        self.observe_fields([f.node for f in plan.root_fields], variables, elapsed, errors)

    def observe_fields(
        self, fields: Iterable[FieldNode], variables: Mapping[str, Any], elapsed: float, errors: list[Any]
    ) -> None:
        """Count and time one request of these root fields per root field and store, and its errors per code."""
        self.metrics.observe_request(request_labels(fields, variables, self.store_fields, self.stores), elapsed, errors)
