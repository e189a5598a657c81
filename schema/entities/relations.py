"""Relations: fields that follow a store's value column, or its key, to an entity.

``RelationInfo("customer", "Customer", column="customer")`` of store ``latest_order`` adds ``customer(maxLag):
Customer`` to the value type ``LatestOrder``, next to the column ``customer`` (here: instead of it, as the
relation is named like the column; the raw key stays readable as ``customer { key }``). Without a column,
the field goes to the store's entries (``<Base>Entry`` of key-value connections, ``<Base>Window``) and
follows the entry's key. The stored value is converted to the entity's key type (``KeyKind.target``): an
integer column to a String key, digits to a Long key, anything else an INVALID_KEY error on the field; a
null target is null without an error, and a target no store has is an entity whose fields are null (as
``customer(key)`` is). ``maxLag`` bounds the target's reads (none: the request's bound, as for a root
field; a relation does not take the bound of the field it is under). The relations of an entity's table
columns are fields of the entity too (schema.entities.object_type). Targets are read a depth at a time: see
schema.entities.batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter
from typing import Any

import strawberry
from pyspark.sql.types import StructType

from iqgraph.schema.dynamic import Arg, Field, Later, optional, resolved_field, resolver_with
from iqgraph.schema.entities.batches import Read, arriving
from iqgraph.schema.errors import SchemaDefinitionError, store_errors
from iqgraph.schema.keys import KeyKind
from iqgraph.schema.naming import camel_case
from iqgraph.schema.resolving import checked_bound, context
from iqgraph.schema.scalars import Long
from iqgraph.schema.selection import reads_ahead
from iqgraph.schema.types import RelationInfo, StoreInfo
from iqgraph.schema.value_types import Link

#: The description of a relation's maxLag argument.
MAX_LAG = (
    "Bounded staleness of the target's reads, in records, as a root field's maxLag; none: the request's "
    "extensions.maxLag, else the node's --max-lag (not the bound of the field it is under)."
)
#: The fields an entry type has before its relations, per store kind.
ENTRY_FIELDS = {
    "key_value": ("key", "value"),
    "window": ("key", "start", "end", "value"),
    "ranking": ("member", "value", "rank", "cursor"),
}


@dataclass(frozen=True)
class Target:
    """What relations lead to: an entity's name, key kind, and its type and fields' reads (set once made)."""

    name: str
    key: KeyKind
    type: Later
    reads: dict[str, Callable[[dict[str, Any]], Read]] = field(default_factory=dict)


def follow(info: strawberry.Info, target: Target, value: Any, max_lag: int | None) -> Any:
    """Return the target entity a stored value names (joining the request's open batch); None for a null value."""
    if value is None:
        return None
    bound = checked_bound(max_lag)
    with store_errors():
        key = target.key.target(value)
    return context(info).entities.join(target.name, bound, key)


def relation_field(name: str, target: Target, stored: Callable[[Any], Any], description: str) -> Field:
    """Return the field name that follows stored(object) — a stored value naming the key — to target."""

    @reads_ahead
    def resolve(root: Any, info: strawberry.Info, max_lag: Long | None = None) -> Any:
        ref = follow(info, target, stored(root), max_lag)
        return ref if ref is None else arriving(info, ref, target.reads)

    arg = Arg("max_lag", "maxLag", Long | None, MAX_LAG)
    return resolved_field(name, resolver_with(resolve, [arg], optional(target.type)), description)


def _column_relation(name: str, target: Target, description: str, attribute: str) -> Field:
    """Return the relation field of a value type whose objects keep the column's stored value in attribute."""
    return relation_field(name, target, attrgetter(attribute), description)


def _label(store: StoreInfo, relation: RelationInfo) -> str:
    where = f"column {relation.column!r}" if relation.column is not None else "its keys"
    return f"store {store.name!r} relation {relation.field!r} ({where})"


def _target(store: StoreInfo, relation: RelationInfo, targets: Mapping[str, Target]) -> Target:
    found = targets.get(relation.entity)
    if found is None:
        known = ", ".join(targets) or "none"
        raise SchemaDefinitionError(f"{_label(store, relation)}: no entity {relation.entity!r} (entities: {known})")
    return found


def value_links(store: StoreInfo, targets: Mapping[str, Target]) -> list[Link]:
    """Return the links the relations of store with a column add to its value type."""
    links: list[Link] = []
    for relation in store.relations:
        if relation.column is None:
            continue
        target = _target(store, relation, targets)
        if not isinstance(store.value_type, StructType):
            raise SchemaDefinitionError(
                f"{_label(store, relation)}: the store's value is a {store.value_type.simpleString()}, not a struct "
                "with columns: drop the column to relate the store's keys"
            )
        name = camel_case(relation.field)
        about = f"The {target.name} whose key is this value's {relation.column}; null if it has none."
        links.append(
            Link(
                relation.column,
                name,
                relation.replaces_column,
                partial(_column_relation, name, target, about),
                _label(store, relation),
            )
        )
    return links


def entry_fields(store: StoreInfo, targets: Mapping[str, Target]) -> tuple[Field, ...]:
    """Return the fields the relations of store without a column add to its entry (or window) type."""
    fields: list[Field] = []
    taken = set(ENTRY_FIELDS.get(store.kind, ()))
    for relation in store.relations:
        if relation.column is not None:
            continue
        target = _target(store, relation, targets)
        if store.kind not in ENTRY_FIELDS:
            raise SchemaDefinitionError(
                f"{_label(store, relation)}: a {store.kind} store has no entries to relate from"
            )
        name = camel_case(relation.field)
        if name in taken:
            raise SchemaDefinitionError(f"{_label(store, relation)}: its entries have a field {name!r} already")
        taken.add(name)
        about = f"The {target.name} whose key is this {'window' if store.kind == 'window' else 'entry'}'s key."
        fields.append(relation_field(name, target, attrgetter("f0"), about))
    return tuple(fields)
