"""The ranking store view of one partition: an ordered index of another store's members by value, per group.

Two column families per ranking store:

- ``<name>``: member → ``[group, value]``, the member's entry as last indexed (what a change must delete);
- ``<name>.index``: one key per member and index — ``g<len><group>`` + rank bytes + member under its group,
  and ``a`` + rank bytes + member in the index of all groups — whose value is the member's value.

Rank bytes order values from the greatest down (the float64's order-preserving bits, inverted); equal
values then order by the member's key bytes (natural order, invariant 3): ties are deterministic, and the
same in every partition, so the top N of each partition merged by index key is the top N of all (a
member lives in one partition). ``update`` runs in the batch's transaction, beside the store it ranks:
a member's old index keys are deleted and its new ones put, so values may fall as well as rise. A member
whose value is not a finite number (None, NaN, ±inf: a stored JSON value cannot hold them) is kept out of
the index. Groups are strings (other values are indexed by ``str``); a member without a group (None) is
ranked only among all.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from iqgraph.stores.aggregations import AggregatedStates, Aggregation
from iqgraph.stores.codecs import Key, KeyCodec, decode_value, decode_values, encode_value
from iqgraph.stores.partition import PartitionDB, PartitionTransaction, entries_counter
from iqgraph.stores.scan import Page, paginate, prefix_stop
from iqgraph.stores.scans import Scan, TopScan, refused
from iqgraph.stores.spec import StoreKind
from iqgraph.stores.types import Followed, Lookup
from iqgraph.stores.writes import ChangeRecorder, StorePartials

log = logging.getLogger(__name__)

#: ``update``'s group for a member whose group did not change in the batch: keep the one indexed.
KEEP_GROUP: Any = object()
_ALL = b"a"
_GROUP = b"g"
_FLIP = 0xFFFF_FFFF_FFFF_FFFF
_DOUBLE, _BITS = struct.Struct(">d"), struct.Struct(">Q")


def index_family(name: str) -> str:
    """Return the column family of ranking store name's index."""
    return f"{name}.index"


def group_prefix(group: str | None) -> bytes:
    """Return the index prefix of group's members (None: the index of all groups)."""
    if group is None:
        return _ALL
    encoded = group.encode()
    if len(encoded) > 0xFFFF:
        raise ValueError(f"a ranking group is at most 65,535 bytes, got {len(encoded)}")
    return _GROUP + len(encoded).to_bytes(2, "big") + encoded


def rank_bytes(value: Any) -> bytes:
    """Return 8 bytes whose byte order is value's order from the greatest down."""
    bits: int = _BITS.unpack(_DOUBLE.pack(float(value) + 0.0))[0]  # + 0.0: -0.0 ties with 0.0
    return _BITS.pack(bits if bits >> 63 else bits ^ _FLIP >> 1)  # ascending order, inverted


def _prefix(cache: dict[str, bytes], group: str) -> bytes:
    prefix = cache.get(group)
    if prefix is None:
        prefix = cache[group] = group_prefix(group)
    return prefix


def rankable(value: Any) -> bool:
    """Return whether value has a place in an index: a finite number (what a stored JSON value can hold)."""
    kind = type(value)  # int or float exactly: not bool, not None; x - x is 0 only for finite x
    return (kind is int or kind is float) and value - value == 0


def group_of(value: Any) -> str | None:
    """Return the index group of a record's group column value (None: no group)."""
    return None if value is None else value if isinstance(value, str) else str(value)


class IndexEntry(NamedTuple):
    """One member of a ranking's index: its value and its index key (the order, and where a page resumes)."""

    member: Key
    value: Any
    index_key: bytes


class RankingStore(AggregatedStates):
    """The members of another store ranked by value, per group and among all, in one partition database."""

    kind: ClassVar[StoreKind] = StoreKind.RANKING
    windowed: ClassVar[bool] = False
    aggregated: ClassVar[bool] = False
    followable: ClassVar[bool] = False
    keys_only: ClassVar[bool] = False
    keeps_tables: ClassVar[bool] = False
    rankable: ClassVar[bool] = False

    def __init__(self, db: PartitionDB, name: str) -> None:
        self.db = db
        self.spec = db.spec(name)
        if self.spec.kind is not self.kind:
            raise TypeError(f"store {name!r} is a {self.spec.kind.value} store, not ranking")
        self.name = name
        self.index = index_family(name)
        self.codec = KeyCodec(self.spec.key_type)
        self._entries_counter = entries_counter(name)
        self._ranked: tuple[str, KeyCodec, Aggregation] | None = None  # the store it ranks, once a batch named it

    def apply(self, tx: PartitionTransaction, partials: StorePartials, changes: ChangeRecorder) -> Mapping[bytes, Any]:
        """Index the members whose value (partials.ranked: the new states of the store it ranks, applied before it
        in tx) or group (a partial: the member's latest {group column: value}) the batch changed; the write protocol
        (``stores.writes``). A watched member's change is partials.rank_change of its entries before and after."""
        name, codec, aggregation = self._ranked_store(str(partials.ranks))
        groups = dict(zip(partials.keys, [it[2] for it in partials.items], strict=True))
        states = {codec.decode(key): state for key, state in partials.ranked.items()}
        missing = [member for member in groups if member not in states]
        if missing:  # a member whose records' group came without a new value (a sum over nulls): its stored state
            states.update(zip(missing, decode_values(tx.multi_get(name, codec.encode_many(missing))), strict=True))
        members = list(states)
        column = partials.group
        new_groups = [
            (groups[m] or {}).get(column) if column is not None and m in groups else KEEP_GROUP for m in members
        ]
        recorded = None
        if watched := changes.selected(self.name, members):
            rows = [(m, None, raw) for m, raw in zip(watched, self.codec.encode_many(watched), strict=True)]
            recorded = changes.rows(self.name, tx, self.name, rows, partials.rank_change)
        self.update(tx, members, new_groups, [self._ranked_value(aggregation, m, states[m]) for m in members])
        if recorded is not None:
            recorded({})  # a ranking's entries have no position
        return {}

    def _ranked_store(self, ranks: str) -> tuple[str, KeyCodec, Aggregation]:
        """Return the name, key codec and aggregation of the store this ranking ranks."""
        if self._ranked is None or self._ranked[0] != ranks:
            spec = self.db.spec(ranks)
            self._ranked = (ranks, KeyCodec(spec.key_type), spec.aggregation)
        return self._ranked

    def _ranked_value(self, aggregation: Aggregation, member: Key, state: Any) -> Any:
        """Return the value this ranking indexes for member: its state finalized (None, out of the index, if that
        fails: a user's finalize that raises must not stop the partition; the store it ranks answers the error)."""
        if state is None:
            return None
        try:
            return aggregation.finalize(state)
        except Exception:  # the user's code: anything it raises leaves this member unranked, logged
            log.exception(
                "ranking %s: the value of %r could not be finalized; left out of the index", self.name, member
            )
            return None

    def update(
        self, tx: PartitionTransaction, members: Sequence[Key], groups: Sequence[Any], values: Sequence[Any]
    ) -> None:
        """Index each member under its group (or KEEP_GROUP: the one indexed) with its value, in tx.

        Every old index key is deleted before any new one is put (a member's new key may equal another's old).
        """
        encoded = self.codec.encode_many(members)
        olds = decode_values(tx.multi_get(self.name, encoded))
        prefixes: dict[str, bytes] = {}
        deletes: list[bytes] = []
        puts: list[tuple[bytes, bytes]] = []
        entries: list[tuple[bytes, bytes]] = []
        added = 0
        for member, old, group, value in zip(encoded, olds, groups, values, strict=True):
            old_group, old_value = old if old is not None else (None, None)
            new_group = old_group if group is KEEP_GROUP else group_of(group)
            if old is None:
                added += 1
            elif new_group == old_group and value == old_value and type(value) is type(old_value):
                continue
            if rankable(old_value):
                rank = rank_bytes(old_value)
                deletes.append(_ALL + rank + member)
                if old_group is not None:
                    deletes.append(_prefix(prefixes, old_group) + rank + member)
            raw = encode_value([new_group, value])
            entries.append((member, raw))
            if rankable(value):
                rank, raw = rank_bytes(value), encode_value(value)
                puts.append((_ALL + rank + member, raw))
                if new_group is not None:
                    puts.append((_prefix(prefixes, new_group) + rank + member, raw))
        tx.delete_many(self.index, deletes)
        tx.put_many(self.index, puts)
        tx.put_many(self.name, entries)
        if added:
            tx.increment(self._entries_counter, added)

    def top(self, group: str | None, limit: int, after: str | None = None) -> Page[IndexEntry]:
        """Return the index entries of group's members (None: all) from the greatest value down."""
        prefix = group_prefix(group)
        skip = len(prefix) + 8
        self.db.check_queryable()

        def entry(key: bytes, raw: bytes) -> IndexEntry:
            return IndexEntry(self.codec.decode(key[skip:]), decode_value(raw), key)

        return paginate(self.db.family(self.index), prefix, prefix_stop(prefix), limit, after, entry)

    def entry(self, member: Key) -> tuple[str | None, Any] | None:
        """Return member's indexed (group, value), or None if it has none."""
        self.db.check_queryable()
        raw = self.db.family(self.name).get(self.codec.encode(member))
        if raw is None:
            return None
        group, value = decode_value(raw)
        return group, value

    def count(self) -> int:
        """Return the number of members this partition ranks (indexed or not), as of the last batch."""
        self.db.check_queryable()
        return self.db.counter(self._entries_counter)

    # -- the read protocol (``stores.types.StoreReads``) --------------------------------------------

    def read_states(self, lookups: Sequence[Lookup]) -> list[Any]:
        """Refuse: a ranking keeps no value per key to read (its top is a scan)."""
        raise TypeError(f"store {self.name!r} is a ranking: it answers top scans, not point reads")

    def contains_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return per member whether this partition ranks it."""
        return [self.entry(k) is not None for k in keys]

    def followed(self, keys: Sequence[Key], time_from: int | None = None) -> list[Followed]:
        """Refuse: a ranking's members are followed by its store's changes (``watchTop``), not by key."""
        raise TypeError(f"store {self.name!r} is a ranking: follow its top, not its keys")

    def page(self, scan: Scan, first: int, after: str | None) -> Page[Any]:
        """Return a page of a top scan's index entries, resumed after the cursor."""
        if isinstance(scan, TopScan):
            return self.top(scan.group, first, after)
        raise refused(scan, self.name, self.kind)

    def read_count(self, exact: bool, distinct: bool) -> int:
        """Return the members this partition ranks (always exact: a member lives in one partition)."""
        return self.count()
