"""The object type of an entity: ``key``, the table's columns (and their relations), then one field per store.

Each field but ``key`` reads one store for its entity's batch (schema.entities.batches) and says so in ``Reads``:
the name of the read and how to start it, given the field's arguments, so that a root field can start
every read its selection asks before it returns (``read_ahead``); the field then takes its result at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import strawberry
from pyspark.sql.types import StructType
from strawberry.federation.schema_directives import Key
from strawberry.federation.types import FieldSet

from iqgraph.schema.dynamic import Arg, Field, data_field, list_of, object_type, optional, resolved_field, resolver_with
from iqgraph.schema.entities.batches import EntityRef, Read, Reads, StartRead, arriving, read_one, take
from iqgraph.schema.entities.relations import MAX_LAG as RELATION_MAX_LAG
from iqgraph.schema.entities.relations import Target, follow
from iqgraph.schema.errors import SchemaDefinitionError
from iqgraph.schema.naming import camel_case
from iqgraph.schema.resolving import StorePlan, context
from iqgraph.schema.scalars import DateTime, Long
from iqgraph.schema.selection import reads_ahead
from iqgraph.schema.value_types import Column
from iqgraph.schema.window_fields import WindowNode, time_bounds

if TYPE_CHECKING:
    from iqgraph.schema.entities.fields import EntityPlan
    from iqgraph.schema.loaders import Loaders

_FROM = "The earliest window start (inclusive); none: unbounded."
_TO = "The latest window start (inclusive); none: unbounded."


def entity_type(
    plan: EntityPlan, windows: Mapping[str, WindowNode], targets: Mapping[str, Target], federated: bool = False
) -> tuple[type, Reads]:
    """Return the object type of an entity and its fields' reads (and point the relations to it at it).

    federated: the type is a federation entity, ``@key(fields: "key")`` (schema.federation)."""
    fields: list[Field] = [data_field("key", plan.key.annotation, "The key.")]
    reads: dict[str, Callable[[dict[str, Any]], Read]] = {}
    owners: dict[str, str] = {"key": "its key"}
    for owner, field, read_of in [*_table_fields(plan, targets), *_store_fields(plan, windows)]:
        other = owners.setdefault(field.name, owner)
        if other != owner:
            raise SchemaDefinitionError(
                f"entity {plan.name!r}: {other} and {owner} would both be the field {field.name!r}: rename one"
            )
        fields.append(field)
        reads[field.name] = read_of
    about = plan.info.description or f"The stores keyed by {plan.name} keys, composed: {', '.join(plan.info.stores)}."
    cls = object_type(plan.name, fields, about, directives=[Key(fields=FieldSet("key"))] if federated else ())
    cls.iqgraph_key = plan.key  # type: ignore[attr-defined] # how a federation representation's key is checked
    plan.target.type.set(cls)
    plan.target.reads.update(reads)
    return cls, reads


def _constant(read: Read) -> Callable[[dict[str, Any]], Read]:
    return lambda args: read


def _values(store: str) -> Read:
    return Read(store, lambda loaders, bound: loaders.values(store, bound).load)


def _membership(store: str) -> Read:
    return Read(store, lambda loaders, bound: loaders.membership(store, bound).load)


def _point_field(field: str, read: Read, convert: Callable[[Any], Any], annotation: Any, about: str | None) -> Field:
    """Return a field that takes its entity's result of read, converted."""
    name, start = read.name, read.start

    def resolve(root: EntityRef, info: strawberry.Info) -> Any:
        results = root.batch.done.get(name)
        if results is not None:
            return take(results, root.index, convert)
        return read_one(root, name, start(context(info).loaders, root.batch.max_lag), convert)

    return resolved_field(field, resolver_with(resolve, [], annotation), about)


# -- the table ---------------------------------------------------------------------------------------------


FieldRead = tuple[str, Field, Callable[[dict[str, Any]], Read]]  # (what owns the field, the field, its read)


def _table_fields(plan: EntityPlan, targets: Mapping[str, Target]) -> list[FieldRead]:
    table = plan.table
    if table is None:
        return []
    read = _values(table.name)
    found: list[FieldRead] = []
    relations = {r.field: r for r in table.info.relations}
    for column, relation in _table_columns(table):
        if relation is None:
            owner, field = f"column {column.name!r} of table {table.name!r}", _column_field(column, read)
        else:
            owner = f"relation {relation!r} of table {table.name!r}"
            field = _related_field(plan, column, targets[relations[relation].entity], read)
        found.append((owner, field, _constant(read)))
    return found


def _table_columns(table: StorePlan) -> list[tuple[Column, str | None]]:
    """Return each field of the table's value in order: (column, None), or (its column, relation field)."""
    kept = {c.name: c for c in table.value.columns}
    struct = table.info.value_type
    assert isinstance(struct, StructType)  # noqa: S101 - a table with columns is a struct
    found: list[tuple[Column, str | None]] = []
    width = len(struct.fields)
    for index, spark_column in enumerate(struct.fields):
        if spark_column.name in kept:
            found.append((kept[spark_column.name], None))
        for relation in table.info.relations:
            if relation.column == spark_column.name:
                raw = Column(spark_column.name, camel_case(relation.field), None, None, index, width, _same)
                found.append((raw, relation.field))
    return found


def _same(value: Any) -> Any:
    return value


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _column_field(column: Column, read: Read) -> Field:
    column_value = column.read

    def convert(row: Any) -> Any:
        return None if row is None else column_value(row)

    return _point_field(column.field, read, convert, column.annotation, column.description)


def _related_field(plan: EntityPlan, column: Column, target: Target, read: Read) -> Field:
    """Return the field a relation of the table's column adds to the entity (as to the table's value type)."""
    name, start, stored = read.name, read.start, column.stored

    def row_value(row: Any) -> Any:
        return None if row is None else stored(row)

    async def later(root: EntityRef, info: strawberry.Info, max_lag: int | None) -> Any:
        value = await read_one(root, name, start(context(info).loaders, root.batch.max_lag), row_value)
        ref = follow(info, target, value, max_lag)
        return ref if ref is None else await _awaited(arriving(info, ref, target.reads))

    @reads_ahead
    def resolve(root: EntityRef, info: strawberry.Info, max_lag: Long | None = None) -> Any:
        results = root.batch.done.get(name)
        if results is None:
            return later(root, info, max_lag)
        ref = follow(info, target, take(results, root.index, row_value), max_lag)
        return ref if ref is None else arriving(info, ref, target.reads)

    arg = Arg("max_lag", "maxLag", Long | None, RELATION_MAX_LAG)
    about = f"The {target.name} whose key is the {column.name} of this {plan.name}; null if it has none."
    return resolved_field(column.field, resolver_with(resolve, [arg], optional(target.type)), about)


# -- the other stores --------------------------------------------------------------------------------------


def _store_fields(plan: EntityPlan, windows: Mapping[str, WindowNode]) -> list[FieldRead]:
    found: list[FieldRead] = []
    for store in plan.stores:
        if store is plan.table:
            continue
        name, kind, owner = store.name, store.info.kind, f"store {store.name!r}"
        if kind == "window":
            found.append((owner, *_window_field(store, windows[name])))
        elif kind == "bloom":
            read = _membership(name)
            about = f"Whether bloom store {name} might contain the key: false if never added; true if it probably was."
            found.append((owner, _point_field(store.field, read, bool, bool | None, about), _constant(read)))
        else:
            read = _values(name)
            annotation, convert = store.value.nullable()
            about = f"The key's value in store {name}" + (
                f": {store.info.description}" if store.info.description else "."
            )
            found.append((owner, _point_field(store.field, read, convert, annotation, about), _constant(read)))
    return found


def _window_read(store: str, lower: int, upper: int) -> Read:
    def start(loaders: Loaders, bound: int | None) -> StartRead:
        load = loaders.windows(store, bound).load
        return lambda keys: load(tuple((key, lower, upper) for key in keys))

    return Read((store, lower, upper), start)


def _window_field(store: StorePlan, node: WindowNode) -> tuple[Field, Callable[[dict[str, Any]], Read]]:
    name, convert = store.name, node.convert_list

    def resolve(root: EntityRef, info: strawberry.Info, from_: Any = None, to: Any = None) -> Any:
        lower, upper = time_bounds(from_, to)
        results = root.batch.done.get((name, lower, upper))
        if results is not None:
            return take(results, root.index, convert)
        read = _window_read(name, lower, upper)
        return read_one(root, read.name, read.start(context(info).loaders, root.batch.max_lag), convert)

    def read_of(args: dict[str, Any]) -> Read:
        return _window_read(name, *time_bounds(args.get("from"), args.get("to")))

    args = [Arg("from_", "from", DateTime | None, _FROM), Arg("to", "to", DateTime | None, _TO)]
    about = f"The key's windows in store {name} with start in [from, to], oldest first."
    return resolved_field(store.field, resolver_with(resolve, args, optional(list_of(node.type))), about), read_of
