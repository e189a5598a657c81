"""The one read protocol every kind of store view answers (``StoreReads``), and what a point read asks.

quix-streams' store classes are the model: a kind of store is a class (``KeyValueStore``, ``WindowStore``,
``BloomStore``, ``RankingStore``; ``stores.kinds.store_class`` finds it by ``StoreKind``), and the query path asks
the view of a partition's store, whatever its kind, for states (``read_states``), a page of a typed scan
(``page``; ``stores.scans``) or a count (``read_count``) — and the class how its states combine over partitions
and become values (``combiner``, ``finalizer``). A new kind of store is a new class here and its GraphQL fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from iqgraph.stores.aggregations import Aggregation
    from iqgraph.stores.codecs import Key
    from iqgraph.stores.distinct import Distinct
    from iqgraph.stores.scan import Page
    from iqgraph.stores.scans import Scan
    from iqgraph.stores.spec import StoreKind

#: A point read: the key, and for a window store the range of window starts (None: open).
Lookup = tuple["Key", int | None, int | None]
#: What a followed key holds now: the key, its window's start (None: not a window), its state, and the position of
#: the record that last changed it (``stores.positions``; None: none kept; -1: a key-value key never written).
Followed = tuple["Key", int | None, Any, int | None]


class StoreReads(Protocol):
    """What the query path asks a store view of one partition, whatever its kind."""

    kind: ClassVar[StoreKind]
    #: a read's states are lists of windows (their wire form differs: ``schema.wire``)
    windowed: ClassVar[bool]
    #: the states are an aggregation's (the schema shows it); False for a bloom filter and a ranking
    aggregated: ClassVar[bool]
    #: its keys can be followed (a live watch: ``followed``); a ranking is followed by its store's changes instead
    followable: ClassVar[bool]
    #: it keeps only that it saw a key, no value (a bloom filter: its records need no value column, a key's answer
    #: is a boolean, sent once by a watch)
    keys_only: ClassVar[bool]
    #: it can keep a table topic (each key's latest value; a tombstone deletes the key)
    keeps_tables: ClassVar[bool]
    #: a ranking can rank its keys by their values (``StoreDefinition.ranks`` names it)
    rankable: ClassVar[bool]

    @staticmethod
    def combiner(agg: Aggregation) -> Callable[[Any, Any], Any]:
        """Return how two partitions' states of one point read combine."""
        ...

    @staticmethod
    def finalizer(agg: Aggregation) -> Callable[[Any], Any] | None:
        """Return how a point read's state becomes its value (None: the states are the values)."""
        ...

    def read_states(self, lookups: Sequence[Lookup]) -> list[Any]:
        """Return each point read's state, in order (mergeable across partitions)."""
        ...

    def contains_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return per key whether the store holds it (a bloom filter: probably)."""
        ...

    def followed(self, keys: Sequence[Key], time_from: int | None) -> list[Followed]:
        """Return what keys hold now, with positions: what a live watch's snapshot sends (a window store: the
        windows from time_from, None: all; a bloom filter: only the keys it contains, without a position)."""
        ...

    def page(self, scan: Scan, first: int, after: str | None) -> Page[Any]:
        """Return up to first items of scan (states), resumed after the cursor; TypeError for another kind's scan."""
        ...

    def read_count(self, exact: bool, distinct: bool) -> int | Distinct:
        """Return the entries: exact or an estimate; distinct: what counting a union over partitions needs."""
        ...
