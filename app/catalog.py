"""The app's catalog: its stores and entities looked up by name, and the metadata the schema shows of them.

What every room asks of the app definition — ``definition_of`` (a store by name, a coded error otherwise),
``store_info`` and ``entity_infos`` (what the schema is built from) — in one place, below every room.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from iqgraph.schema.types import EntityInfo, RelationInfo, StoreInfo
from iqgraph.stores import FAR_FUTURE, FAR_PAST, StoreKind, UnknownStoreError, store_class
from iqgraph.streaming.definitions import App, StoreDefinition

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

__all__ = ["FAR_FUTURE", "FAR_PAST", "definition_of", "entity_infos", "store_info"]


def store_info(app: App, store: StoreDefinition, value_type: DataType) -> StoreInfo:
    """Return the metadata the schema shows for a store."""
    topic = app.topic(store.topic)
    return StoreInfo(
        name=store.name,
        kind=store.kind.value,
        key_type=store.resolved_key_type(topic),
        value_type=value_type,
        topic=topic.name,
        partitions=topic.partitions,
        co_partitioned=store.co_partitioned,
        description=store.description,
        aggregation=store.aggregate.kind if store_class(store.kind).aggregated else None,
        window_size_ms=store.window.size_ms if store.window else None,
        window_advance_ms=store.window.advance if store.window else None,
        false_positive_rate=store.bloom.error_rate if store.bloom else None,
        relations=tuple(RelationInfo(r.field, r.entity, r.column) for r in store.relations),
        table=topic.table,
        extra={"ranks": store.ranks, "group": store.group} if store.ranks is not None else {},
    )


def entity_infos(app: App) -> list[EntityInfo]:
    """Return the entities the schema shows: the app's, with their shared key type."""
    return [
        EntityInfo(e.name, app.entity_key_type(e), tuple(e.stores), e.plural_field, e.table, e.description)
        for e in app.entities
    ]


def definition_of(app: App, store: str, kind: StoreKind | None = None) -> StoreDefinition:
    """Return the definition of store (of kind, if given); raise UnknownStoreError otherwise."""
    try:
        definition = app.store(store)
    except KeyError:
        known = ", ".join(s.name for s in app.stores)
        raise UnknownStoreError(f"no store named {store!r} (stores: {known})") from None
    if kind is not None and definition.kind is not kind:
        raise UnknownStoreError(f"store {store!r} is a {definition.kind.value} store, not {kind.value}")
    return definition
