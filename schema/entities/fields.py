"""Entities: one GraphQL type per key space, composing the stores that share the key.

``EntityInfo("Customer", stores=("customers", "order_count", "latest_order", "orders_per_minute",
"items_bought"), table="customers", plural="customerList")`` makes::

    type Customer {
      key: String!
      name: String            # the columns of the table's struct value (null where the table lacks the key)
      city: String
      orderCount: Long        # one field per other store, named after it: key-value -> its value,
      latestOrder: LatestOrder
      ordersPerMinute(from: DateTime, to: DateTime): [OrdersPerMinuteWindow!]   # window -> fetch's windows
      itemsBought: Boolean    # bloom -> mightContain
    }

and the root fields ``customer(key, maxLag): Customer``, ``customerList(keys, maxLag): [Customer]`` and
``customerListPage(first, after, maxLag): CustomerConnection`` (the keys of the table, else of the first
store; a bloom store cannot list its keys). Relations of the table's columns are fields of the entity too.

``customer(key)`` returns the entity whether or not a store has the key (each field is null where its store
lacks it): telling "no store has it" apart would read every composed store, also those the query does not
ask for. It is null only with an error: INVALID_KEY (a key no store could hold: empty, out of range) or
INVALID_ARGUMENT. Every field reads through the request's loaders with the root field's ``maxLag``, all the
entities of one field together (schema.entities.batches).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import strawberry
from pyspark.sql.types import StructType

from iqgraph.schema.dynamic import Arg, Field, Later, list_of, optional, resolved_field, resolver_with
from iqgraph.schema.entities.batches import EntityBatch, EntityRef, Reads, read_ahead
from iqgraph.schema.entities.pages import page_field
from iqgraph.schema.entities.relations import Target
from iqgraph.schema.errors import SchemaDefinitionError, api_error, store_errors
from iqgraph.schema.keys import KeyKind, key_kind
from iqgraph.schema.naming import TypeNames, camel_case
from iqgraph.schema.resolving import MAX_LAG, StorePlan, checked_bound, context
from iqgraph.schema.scalars import Long
from iqgraph.schema.selection import reads_ahead
from iqgraph.schema.types import EntityInfo
from iqgraph.stores import InvalidKeyError

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")


@dataclass(frozen=True)
class EntityPlan:
    """One entity as the schema shows it: its stores, type and root field names."""

    info: EntityInfo
    key: KeyKind
    stores: tuple[StorePlan, ...]  # the composed stores, in order
    table: StorePlan | None  # the store whose struct columns are fields of the entity
    source: StorePlan  # the store whose keys the page lists
    target: Target
    field: str  # customer
    many: str  # customers (the plural)
    page: str  # customersPage
    edge_name: str
    connection_name: str

    @property
    def name(self) -> str:
        """Return the entity's name (its type's)."""
        return self.info.name


def entity_targets(entities: Sequence[EntityInfo]) -> dict[str, Target]:
    """Return what relations lead to, per entity name (each type made later, by entity_type)."""
    return {e.name: Target(e.name, key_kind(e.key_type), Later(e.name)) for e in entities}


def plan_entities(
    entities: Sequence[EntityInfo],
    plans: Mapping[str, StorePlan],
    targets: Mapping[str, Target],
    names: TypeNames,
    root_fields: Mapping[str, str],
) -> list[EntityPlan]:
    """Return the plan of each entity; SchemaDefinitionError (one line) for what cannot be built.

    root_fields: the root fields taken already, each with what has it ("store 'orders'", "metadata").
    """
    taken = dict(root_fields)
    found: list[EntityPlan] = []
    for entity in entities:
        if not _NAME.fullmatch(entity.name):
            raise SchemaDefinitionError(f"entity {entity.name!r}: a type name is a letter then letters or digits")
        stores = _stores(entity, plans)
        table = _table(entity, plans)
        source = table or stores[0]
        if source.info.kind == "bloom":
            raise SchemaDefinitionError(
                f"entity {entity.name!r} pages over its first store {source.name!r}, a bloom store, which cannot "
                "list its keys: put a key-value or window store first, or give it a table"
            )
        edge, connection = _reserve(entity.name, names)
        single, many, page = _root_fields(entity, taken)
        target = targets[entity.name]
        struct_table = table if table is not None and isinstance(table.info.value_type, StructType) else None
        found.append(
            EntityPlan(entity, target.key, stores, struct_table, source, target, single, many, page, edge, connection)
        )
    return found


def _table(entity: EntityInfo, plans: Mapping[str, StorePlan]) -> StorePlan | None:
    if entity.table is None:
        return None
    table = plans[entity.table]
    if table.info.kind != "key_value":
        raise SchemaDefinitionError(
            f"entity {entity.name!r}: its table {table.name!r} is a {table.info.kind} store: give a key-value "
            "store (a table_store) as the table, or none"
        )
    return table


def _stores(entity: EntityInfo, plans: Mapping[str, StorePlan]) -> tuple[StorePlan, ...]:
    if not entity.stores:
        raise SchemaDefinitionError(f"entity {entity.name!r} composes no stores: name at least one")
    if entity.table is not None and entity.table not in entity.stores:
        raise SchemaDefinitionError(f"entity {entity.name!r}: its table {entity.table!r} must be one of its stores")
    stores: list[StorePlan] = []
    for name in entity.stores:
        plan = plans.get(name)
        if plan is None:
            raise SchemaDefinitionError(f"entity {entity.name!r} composes {name!r}, which is not a store")
        if plan.info.key_type != entity.key_type:
            raise SchemaDefinitionError(
                f"entity {entity.name!r} has {entity.key_type} keys but its store {name!r} has "
                f"{plan.info.key_type} keys: compose stores of one key type"
            )
        stores.append(plan)
    return tuple(stores)


def _reserve(name: str, names: TypeNames) -> tuple[str, str]:
    for type_name in (name, f"{name}Edge", f"{name}Connection"):
        try:
            names.reserve(type_name)
        except ValueError:
            raise SchemaDefinitionError(
                f"entity {name!r} needs the type {type_name!r}, which a store's types or the built-in ones "
                "have already: rename the entity"
            ) from None
    return f"{name}Edge", f"{name}Connection"


def _root_fields(entity: EntityInfo, taken: dict[str, str]) -> tuple[str, str, str]:
    single, plural = camel_case(entity.name), camel_case(entity.plural)
    fields = (single, plural, f"{plural}Page")
    if len(set(fields)) < 3:
        raise SchemaDefinitionError(
            f"entity {entity.name!r}: its plural {entity.plural!r} is its name: give another plural (plural=...)"
        )
    for field in fields:
        owner = taken.get(field)
        if owner is None:
            continue
        hint = "rename the entity" if field == single else "give the entity another plural (plural=...)"
        raise SchemaDefinitionError(
            f"entity {entity.name!r} would add the root field {field!r}, which {owner} has already: {hint}"
        )
    for field in fields:
        taken[field] = f"entity {entity.name!r}"
    return fields


# -- root fields ------------------------------------------------------------------------------------------


def entity_root_fields(plan: EntityPlan, cls: type, reads: Reads) -> list[Field]:
    """Return the root fields of an entity: one key, many keys, a page."""
    kind, limits = plan.key, plan.source.limits
    max_lag = Arg("max_lag", "maxLag", Long | None, MAX_LAG)

    @reads_ahead
    async def one(root: Any, info: strawberry.Info, key: Any, max_lag: Long | None = None) -> Any:
        bound = checked_bound(max_lag)
        with store_errors():
            checked = kind.check(key)
        batch = EntityBatch((checked,), bound)
        await read_ahead(info, batch, reads)
        return EntityRef(checked, 0, batch)

    @reads_ahead
    async def many(root: Any, info: strawberry.Info, keys: list[Any], max_lag: Long | None = None) -> list[Any]:
        context(info).limits.check_keys(keys)
        batch, refs = _refs(kind, keys, checked_bound(max_lag))
        await read_ahead(info, batch, reads)
        return refs

    single = resolver_with(one, [Arg("key", "key", kind.annotation, "The key."), max_lag], optional(cls))
    several = resolver_with(
        many, [Arg("keys", "keys", list_of(kind.annotation), "The keys."), max_lag], optional(list_of(optional(cls)))
    )
    name = plan.name
    return [
        resolved_field(plan.field, single, f"The {name} of key (its fields null where a store lacks the key)."),
        resolved_field(
            plan.many,
            several,
            f"The {name} of each key, in the order given (at most {limits.max_keys}); null only for a key no store "
            "can hold (with an INVALID_KEY error).",
        ),
        page_field(plan, cls, reads, max_lag),
    ]


def _refs(kind: KeyKind, keys: list[Any], bound: int | None) -> tuple[EntityBatch, list[Any]]:
    """Return one batch of the keys, and the entity of each key in it (an invalid key's error in its place)."""
    batch = EntityBatch((), bound)
    refs: list[Any] = []
    check, batched = kind.check, batch.keys
    for key in keys:
        try:
            checked = check(key)
        except InvalidKeyError as exc:
            refs.append(api_error(exc))
            continue
        refs.append(EntityRef(checked, len(batched), batch))
        batched.append(checked)
    return batch, refs
