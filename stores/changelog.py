"""A partition database's changelog records: what a batch changed, as Kafka records, and how a replica applies them.

A batch's changes are the writes of its ``PartitionTransaction``, column family by column family: a put is a record
``<family> NUL <key> -> <stored bytes>``, a delete is a tombstone (``None``). Every store kind is covered alike,
because the records are the stored bytes themselves: key-value states with their positions, windows and their time
index (a dropped window: tombstones), bloom filters (their snapshot's changed pages: ``stores.bloom``), rankings and
their index, collections and user aggregations, and the meta family (entry counters, stream times, the next source
offset). The batch's last record is always its next source offset (``__meta NUL next_offset``): a reader that sees
it knows a whole batch is in. Records are absolute states, never deltas, so applying a batch twice is applying it
once — what lets a restore start at any batch boundary it has recorded and read on.

A replica records where it is in the changelog (``changelog_next``, the next changelog offset to read) in the same
WriteBatch as what it applied; that key is local and never sent.
``RestoreProgress``: how far a copy's restore is (records, bytes, rate, ETA), one per partition in ``RESTORES``,
which the metrics and the progress line read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from rocksdict import ColumnFamily, WriteBatch

from iqgraph.stores.codecs import decode_int64, encode_int64
from iqgraph.stores.partition import META_CF, NEXT_OFFSET_KEY, PartitionDB, PartitionTransaction

log = logging.getLogger(__name__)

CHANGELOG_NEXT_KEY = b"changelog_next"  # meta, local only: the next changelog offset this replica reads
SEPARATOR = b"\x00"  # column family names hold no NUL
BATCH_END_KEY = META_CF.encode() + SEPARATOR + NEXT_OFFSET_KEY

#: One changelog record: (key, value), value None for a tombstone.
Record = tuple[bytes, bytes | None]


def record_key(family: str, key: bytes) -> bytes:
    """Return the changelog key of key in family."""
    return family.encode() + SEPARATOR + key


def split_key(record: bytes) -> tuple[str, bytes]:
    """Return (family, key) of a changelog record's key; raise ValueError for a key that names no family."""
    family, sep, key = record.partition(SEPARATOR)
    if not sep or not family:
        raise ValueError(f"not a changelog key: {record[:40]!r}")
    return family.decode(), key


def batch_records(tx: PartitionTransaction) -> list[Record]:
    """Return what tx writes as changelog records, its next source offset last (the batch's end)."""
    records: list[Record] = []
    end: Record | None = None
    for family, writes in tx.changes().items():
        prefix = family.encode() + SEPARATOR
        for key, value in writes.items():
            if family == META_CF and key == CHANGELOG_NEXT_KEY:
                continue
            record = (prefix + key, value)
            if family == META_CF and key == NEXT_OFFSET_KEY:
                end = record
            else:
                records.append(record)
    if end is None:
        raise ValueError("a batch without its next offset cannot be sent to the changelog")
    records.append(end)
    return records


def is_batch_end(key: bytes | None) -> bool:
    """Return whether a changelog record with key ends a batch."""
    return key == BATCH_END_KEY


def changelog_next(db: PartitionDB) -> int:
    """Return the next changelog offset db reads (0: it read none)."""
    raw = db.meta(CHANGELOG_NEXT_KEY)
    return 0 if raw is None else decode_int64(raw)


def record_position(tx: PartitionTransaction, next_changelog_offset: int) -> None:
    """Write, with tx, where the database now is in the changelog (the writer's own batch was sent up to there)."""
    tx.put(META_CF, CHANGELOG_NEXT_KEY, encode_int64(next_changelog_offset))


def apply_records(db: PartitionDB, records: Iterable[Record], next_changelog_offset: int) -> int:
    """Write records into db in ONE WriteBatch with the changelog position after them; return how many were written.

    A record of a family this database does not have (a store the app no longer declares) is skipped.
    """
    batch = WriteBatch(raw_mode=True)
    written = 0
    handles: dict[str, ColumnFamily] = {}
    for key, value in records:
        family, inner = split_key(key)
        handle = handles.get(family)
        if handle is None:
            if not db.has_family(family):
                continue
            handle = handles[family] = db.handle(family)
        if value is None:
            batch.delete(inner, handle)
        else:
            batch.put(inner, value, handle)
        written += 1
    batch.put(CHANGELOG_NEXT_KEY, encode_int64(next_changelog_offset), db.handle(META_CF))
    db.write_restored(batch)
    return written


@dataclass
class RestoreProgress:
    """How far a copy's restore from its changelog is: records and bytes applied, of how many."""

    topic: str
    partition: int
    start: int  # the changelog offset it started at
    target: int  # the changelog's last stable offset when it started
    records: int = 0
    bytes: int = 0
    position: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        """Return the records applied per second so far."""
        return self.records / max(time.monotonic() - self.started, 1e-6)

    @property
    def eta_s(self) -> float | None:
        """Return the seconds left at the rate so far (None before any record)."""
        if not self.records:
            return None
        return max(self.target - self.position, 0) / max(self.rate, 1e-6)

    def line(self) -> str:
        """Return the progress as one log line."""
        eta = self.eta_s
        return (
            f"restoring {self.topic}-{self.partition} from its changelog: {self.records:,} records "
            f"({self.bytes / 1e6:.1f} MB) at {self.rate:,.0f}/s, offset {self.position:,} of {self.target:,}"
            + (f", ETA {eta:.0f} s" if eta is not None else "")
        )


#: Restores under way or done, per (changelog topic, partition): what the metrics and the progress line read.
RESTORES: dict[tuple[str, int], RestoreProgress] = {}
