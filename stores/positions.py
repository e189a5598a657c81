"""Where each key's value was last changed: the offset of the record that changed it, per store and partition.

A live watch's resume (``app.live.watch``) sends exactly the keys whose value changed after the positions its
subscriber has: it reads these positions beside the states. Key-value stores (tables too: a tombstone's position
stays, so a resume learns the key was deleted) and window stores keep one in a column family of their own
(``<store>.positions``, keyed like the store's own family: a key, or a (key, window start)), written in the same
WriteBatch as the state it stands for and only when the state changed: a record that left a value as it was (a max
not exceeded, a late window) does not move it. A window's position is dropped with the window. A bloom filter keeps
no per-key record (that is its point): its keys have no position.

A state written before positions were kept has none (``None``: unknown); a key never written has none either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from iqgraph.stores.codecs import decode_int64, encode_int64
from iqgraph.stores.partition import PartitionDB, PartitionTransaction
from iqgraph.stores.spec import positions_family


def latest_positions(keys: Sequence[bytes], positions: Sequence[int]) -> dict[bytes, int]:
    """Return each key's largest position (a batch may hold several partials of one key)."""
    found: dict[bytes, int] = {}
    for key, position in zip(keys, positions, strict=True):
        if position > found.get(key, -1):
            found[key] = position
    return found


class KeyPositions:
    """The positions of one store's keys in one partition database."""

    def __init__(self, db: PartitionDB, store: str) -> None:
        self.db = db
        self.family = positions_family(store)

    def read(self, keys: Sequence[bytes]) -> list[int | None]:
        """Return the committed position of each key (encoded as the store encodes it); None: none kept."""
        return [None if raw is None else decode_int64(raw) for raw in self.db.multi_get(self.family, keys)]

    def record(self, tx: PartitionTransaction, positions: Mapping[bytes, int]) -> None:
        """Write each key's new position when tx commits."""
        if positions:
            tx.put_many(self.family, zip(positions, map(encode_int64, positions.values()), strict=True))

    def forget(self, tx: PartitionTransaction, keys: Iterable[bytes]) -> None:
        """Drop keys' positions when tx commits (their windows are dropped)."""
        tx.delete_many(self.family, keys)
