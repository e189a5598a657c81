"""What one watch has read and sent, and how its stores' states become the values a subscriber gets.

A ``WatchedKeys`` belongs to one subscription (``app.live.watch``). It turns the snapshots and changes its sources
send (``app.live.follow.Rows``) into
``schema.types.LiveChange``: states are merged over the partitions a key lives in (a store keyed by a column,
producers mixing partitioners: ``app.query.merging``), then finalized. Per store kind:

- key-value: every watched key of a snapshot (null when absent), then each new state;
- window: the windows starting at or after ``window_from``, then each changed window;
- bloom: a key once, the first time a snapshot or a batch has it (false never becomes true twice).

Positions: a change's ``position`` is the offset of the record that produced its value (``stores.positions``:
-1 for a key never written). A snapshot sends only what changed since the subscriber's position in each partition
(``since``: a resume's, or where a replaced source left it), and sends a partition's values in position order, as
batches are: a subscriber that stops halfway has every value up to the last position it got, and a resume after it
is sent exactly the rest. A value whose position is not known (a state written before positions were kept, a bloom
key) is always sent, last, at the snapshot's last offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from iqgraph.app.query.merging import aggregation_of, finalize
from iqgraph.schema.types import LiveChange
from iqgraph.stores import Key, WindowedValue, store_class
from iqgraph.stores.aggregations import merge_state
from iqgraph.streaming.change_set import Change
from iqgraph.streaming.definitions import StoreDefinition
from iqgraph.streaming.snapshots import Snapshot

#: One state read or changed: (key, window start or None, state, position or None: not known).
Row = tuple[Key, int | None, Any, int | None]
_SKIP = object()  # nothing to send for a row (a bloom key sent already)


class WatchedKeys:
    """The keys one subscription follows, by partition, and what it has sent of them."""

    def __init__(
        self, definition: StoreDefinition, routed: Mapping[int, Sequence[Key]], window_from: int | None = None
    ) -> None:
        """Args:
        routed: per partition, the watched keys a read asks it for (a key may be in several).
        window_from: a window store's earliest window start (None: every window).
        """
        self.definition = definition
        self._store = store_class(definition.kind)  # how its states merge and become values
        self.routed = {p: list(keys) for p, keys in routed.items()}
        self.window_from = window_from
        self._partitions: dict[Key, list[int]] = {}
        for p in sorted(self.routed):
            for key in self.routed[p]:
                self._partitions.setdefault(key, []).append(p)
        self._shared: dict[tuple[Key, int | None], dict[int, Any]] = {}  # keys of several partitions: their states
        self._contained: set[Key] = set()  # bloom keys sent

    # -- what is sent --------------------------------------------------------------------------------

    def snapshot(self, snapshots: Mapping[int, Snapshot[list[Row]]], since: Mapping[int, int]) -> list[LiveChange]:
        """Return what the snapshots hold that changed since the subscriber's positions, partition by partition.

        since: per partition, the subscriber's position there (a next offset: it has every change before it); a
        partition not in it is sent whole. A key (window) held by several partitions is sent once, with the last
        partition that changed it since, merged over every partition's snapshot.
        """
        sender: dict[tuple[Key, int | None], int] = {}
        for p, found in snapshots.items():
            for key, start, state, position in found.value:
                if start is not None and self.window_from is not None and start < self.window_from:
                    continue  # a window before the subscriber's from (a relay reads every member's)
                self._remember(key, start, p, state)
                if found.newer and _changed_since(position, since.get(p)):
                    sender[(key, start)] = max(p, sender.get((key, start), p))
        changes: list[LiveChange] = []
        for p in sorted(p for p, s in snapshots.items() if s.newer):
            last = snapshots[p].position - 1
            rows = [row for row in snapshots[p].value if sender.get((row[0], row[1])) == p]
            made = [
                (last if position is None else position, key, start, value)
                for key, start, state, position in rows
                if (value := self._value(key, start, p, state)) is not _SKIP
            ]
            made.sort(key=_first)
            changes += [self._change(key, start, value, p, at, snapshot=True) for at, key, start, value in made]
        return changes

    def change(self, change: Change, position: int) -> LiveChange | None:
        """Return what a change of the feed sends (None: nothing); position: its own when it has none."""
        key, start, p = change.key, change.window_start, change.partition
        if p not in self._partitions.get(key, ()):
            return None  # a partition reads of the key do not ask (a misrouted record): not part of its value
        if start is not None and self.window_from is not None and start < self.window_from:
            return None
        self._remember(key, start, p, change.state)
        value = self._value(key, start, p, change.state)
        if value is _SKIP:
            return None
        at = position if change.position is None else change.position
        return self._change(key, start, value, p, at, dropped=change.dropped)

    def _remember(self, key: Key, start: int | None, partition: int, state: Any) -> None:
        if len(self._partitions.get(key, ())) > 1:
            self._shared.setdefault((key, start), {})[partition] = state

    def _value(self, key: Key, start: int | None, partition: int, state: Any) -> Any:
        """Return the value to send for key (window start) now that partition holds state; _SKIP for none."""
        if self._store.keys_only:  # a bloom filter's key: contained, sent once (false never becomes true twice)
            if key in self._contained or not state:
                return _SKIP
            self._contained.add(key)
            return True
        shared = self._shared.get((key, start))
        if shared is not None:
            state = _merged(self.definition, shared.values())
        if not self._store.windowed:
            return finalize(self.definition, state)
        finalized = finalize(self.definition, [WindowedValue(key, start or 0, 0, state)])  # only the value is used
        return finalized if isinstance(finalized, Exception) else finalized[0].value

    def _change(
        self,
        key: Key,
        start: int | None,
        value: Any,
        partition: int,
        position: int,
        dropped: int = 0,
        snapshot: bool = False,
    ) -> LiveChange:
        window = self.definition.window
        end = None if start is None or window is None else start + window.size_ms
        return LiveChange(key, value, partition, position, start, end, dropped, snapshot)


def _changed_since(position: int | None, since: int | None) -> bool:
    """Return whether a value at position is newer than a subscriber's position since (None: it has none)."""
    return since is None or position is None or position >= since


def _first(made: tuple[int, Key, int | None, Any]) -> int:
    return made[0]


def _merged(definition: StoreDefinition, states: Iterable[Any]) -> Any:
    """Return the states of one key's partitions merged into one (None: no partition holds it)."""
    aggregation = aggregation_of(definition)
    found = None
    for state in states:
        found = merge_state(aggregation, found, state)
    return found
