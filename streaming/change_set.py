"""What a committed batch changed: the changes a subscriber receives, and the set the sink collects per batch.

The sink collects changes only for the watched stores and keys (``Interest``, from ``ChangeFeed.writing``).
What a change holds per store kind: key-value — the key's new state, ``None`` once a table's tombstone
deleted it; window — each changed (key, window start) and its new state; bloom — ``True`` for each key the
batch added (possibly already contained); ranking — a ``RankEntry`` for each member whose group or value
changed. Windows dropped by retention are not published. States are shared: consumers must not mutate them.
Each change carries its position: the offset of the record that changed it (``stores.positions``); a batch's
changes are handed out in position order (``ordered``), so a subscriber that has a prefix of them has every
change up to the position of the last it has.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from iqgraph.stores import KeyCodec, PartitionTransaction
from iqgraph.stores.codecs import decode_values
from iqgraph.stores.kv import Merged

#: Per watched store, the keys watched (a container), or None: every key.
Interest = Mapping[str, Container[Any] | None]
#: One changed key as the sink reports it: (key, window start or None, new state, position or None: not known).
KeyChange = tuple[Any, int | None, Any, int | None]


class RankEntry(NamedTuple):
    """A ranking member's new index entry, and the group it left (a top of that group may have lost it)."""

    group: str | None
    value: Any
    previous_group: str | None


class Change(NamedTuple):
    """One key's new state in one store after a committed batch of one partition.

    offset is the partition's position once the batch is applied (its next offset: last record + 1), as
    ``Subscription.positions()`` and the read path's positions report it. dropped counts the earlier states of
    this (store, key, window, partition) the subscription conflated away since it delivered the last one.
    position is the offset of the record that changed the key (None: not known).
    """

    store: str
    key: Any
    window_start: int | None
    state: Any  # None: the key was deleted
    topic: str
    partition: int
    offset: int
    dropped: int = 0
    position: int | None = None


class ChangeSet:
    """The watched changes of one partition's batch, as the sink merges it (publish them once committed)."""

    def __init__(self, interest: Interest) -> None:
        self.interest = interest
        self.by_store: dict[str, list[KeyChange]] = {}

    def watches(self, store: str) -> bool:
        """Return whether anyone watches store."""
        return store in self.interest

    def selected(self, store: str, keys: Iterable[Any]) -> list[Any]:
        """Return the distinct keys of keys that store's subscriptions watch, in order."""
        if store not in self.interest:
            return []
        watched = self.interest[store]
        return list(dict.fromkeys(keys if watched is None else (key for key in keys if key in watched)))

    def states(self, store: str, codec: KeyCodec, keys: Iterable[Any], merged: Merged) -> None:
        """Record the new states of the watched keys the merge changed (merged: as KeyValueStore.merge returns)."""
        chosen = self.selected(store, keys)
        if chosen:
            found = zip(chosen, codec.encode_many(chosen), strict=True)
            changed = merged.changed
            self._add(store, [(k, None, merged.states[e], changed[e]) for k, e in found if e in changed])

    def constant(self, store: str, keys: Iterable[Any], state: Any, positions: Mapping[Any, int]) -> None:
        """Record state for each watched key of keys (True for a bloom's adds, None for a table's deletes), at its
        position (positions: by key)."""
        self._add(store, [(key, None, state, positions.get(key)) for key in self.selected(store, keys)])

    def rows(
        self,
        store: str,
        tx: PartitionTransaction,
        family: str,
        rows: Sequence[tuple[Any, int | None, bytes]],
        state: Callable[[Any, Any], Any] | None = None,
    ) -> Callable[[Mapping[bytes, int]], None]:
        """Read rows (key, window start, stored key) of family now; return what records those changed, later,
        given the positions the merge gave them (by stored key).

        For stores whose merge does not return the new states (windows, rankings): the second read comes from
        the transaction's pending writes; a row left as it was (a late window) is not a change. state makes a
        change's state of the stored values before and after (default: the one after).
        """
        if not rows:
            return _nothing
        encoded = [row[2] for row in rows]
        before = tx.multi_get(family, encoded)

        def after(positions: Mapping[bytes, int]) -> None:
            now = tx.multi_get(family, encoded)
            changed = [(row, old, new) for row, old, new in zip(rows, before, now, strict=True) if old != new]
            states = decode_values(new for _, _, new in changed)
            if state is not None:
                olds = decode_values(old for _, old, _ in changed)
                states = [state(old, new) for old, new in zip(olds, states, strict=True)]
            found = zip(changed, states, strict=True)
            self._add(store, [(row[0], row[1], s, positions.get(row[2])) for (row, _, _), s in found])

        return after

    def ordered(self) -> dict[str, list[KeyChange]]:
        """Return each store's changes in position order (what is published)."""
        return {store: sorted(items, key=_position) for store, items in self.by_store.items()}

    def _add(self, store: str, items: list[KeyChange]) -> None:
        if items:
            self.by_store.setdefault(store, []).extend(items)


def _position(item: KeyChange) -> tuple[bool, int]:
    return (item[3] is None, item[3] or 0)  # not known: last


def _nothing(positions: Mapping[bytes, int]) -> None:
    return None


def rank_entry(old: Any, new: Any) -> RankEntry:
    """Return a ranking member's change from its stored entries ([group, value]) before and after the batch."""
    group, value = new
    return RankEntry(group, value, None if old is None else old[0])
