"""The one write protocol every kind of store view answers (``StoreWrites.apply``): a batch's partials, applied.

The twin of the read protocol (``stores.types.StoreReads``): the sink (``streaming.sink``) hands each store's view
of a partition its share of a micro-batch (``StorePartials``) inside the partition's transaction, and the view
applies it as its kind does — a key-value store merges each key's partial (a table topic's: a value replaces the
key's, a tombstone deletes it), a window store merges each window's and moves stream time, a bloom filter adds the
keys, a ranking re-indexes the members whose value (the store it ranks, applied before it in the same transaction)
or group changed — and records the watched keys' changes (``ChangeRecorder``: the sink's change set). The sink asks
the object, never the kind: a new kind of store is a new class with its ``apply``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from iqgraph.stores.codecs import Key, KeyCodec
    from iqgraph.stores.kv import Merged
    from iqgraph.stores.partition import PartitionTransaction

#: What a recorder is asked when a store records the rows it read before its merge: the changes, after it.
Recorded = Callable[[Mapping[bytes, int]], None]
#: A row a store reads before and after its merge: (key, window start or None, stored key).
Row = tuple[Any, int | None, bytes]
#: How a recorded change's state is made from the stored values before and after (default: the one after).
StateOf = Callable[[Any, Any], Any]


class ChangeRecorder(Protocol):
    """Where a batch's watched changes go (``streaming.change_set.ChangeSet`` is one): a store records only the
    keys someone watches."""

    def watches(self, store: str) -> bool:
        """Return whether anyone watches store."""
        ...

    def selected(self, store: str, keys: Iterable[Any]) -> list[Any]:
        """Return the distinct keys of keys that store's watchers watch, in order."""
        ...

    def states(self, store: str, codec: KeyCodec, keys: Iterable[Any], merged: Merged) -> None:
        """Record the new states of the watched keys a key-value merge changed."""
        ...

    def constant(self, store: str, keys: Iterable[Any], state: Any, positions: Mapping[Any, int]) -> None:
        """Record state for each watched key of keys, at its position (by key)."""
        ...

    def rows(
        self, store: str, tx: PartitionTransaction, family: str, rows: Sequence[Row], state: StateOf | None = None
    ) -> Recorded:
        """Read rows (key, window start, stored key) of family now; return what records those changed, later."""
        ...


@dataclass(frozen=True)
class StorePartials:
    """One store's share of one partition's micro-batch, as its view applies it.

    items: per key (a window store: per key and window), as Spark computed them — (key, window start, partial
    state, records[, position]); keys: their keys in the store's key type; positions: per item, the offset of its
    last record.
    """

    keys: Sequence[Key]
    items: Sequence[tuple[Any, ...]]
    positions: Sequence[int]
    #: a key-value store of a table topic: a partial is the key's last change (a value replaces, None deletes)
    table: bool = False
    #: a window store: the batch's largest event time, and the records already late when Spark saw them
    stream_time: int | None = None
    late: int = 0
    #: a ranking: the store it ranks and the column naming a member's group (a partial is {column: value})
    ranks: str | None = None
    group: str | None = None
    #: a ranking: the new states the batch gave the store it ranks (its ``apply``'s answer), by stored key
    ranked: Mapping[bytes, Any] = field(default_factory=dict)
    #: a ranking: the change a watcher gets, from a member's stored entries before and after the batch
    rank_change: Callable[[Any, Any], Any] | None = None


class StoreWrites(Protocol):
    """What the sink asks a store view of one partition to do with a batch, whatever its kind."""

    def apply(self, tx: PartitionTransaction, partials: StorePartials, changes: ChangeRecorder) -> Mapping[bytes, Any]:
        """Apply partials in tx, recording the watched keys' changes; return the new state of every key the batch
        touched, by stored key (a key-value store's: what a ranking of it indexes; other kinds: none)."""
        ...
