"""The cursor of a ranking's pages: the rank and index key of the last member a page gave.

Every partition orders a ranking's index the same way (value from the greatest down, then member), so
one index key says where every partition resumes, and the rank of the next member is the cursor's rank
plus one: a page of the merged ranking needs no per-partition positions. The cursor names its store and
group, so a cursor of another group or field is an INVALID_CURSOR, not a page from the wrong place.
"""

from __future__ import annotations

import base64
import binascii

import orjson

from iqgraph.app.query.scatter import encode_positions
from iqgraph.stores import InvalidCursorError
from iqgraph.stores.ranking import group_prefix
from iqgraph.stores.scan import encode_cursor

_TAG = b"r1:"


def encode_rank_cursor(store: str, rank: int, group: str | None, index_key: bytes) -> str:
    """Return the cursor that resumes ranking store after the member at rank, whose index key is index_key."""
    body = orjson.dumps([store, rank, group, base64.b64encode(index_key).decode("ascii")])
    return base64.urlsafe_b64encode(_TAG + body).decode("ascii")


def decode_rank_cursor(cursor: str | None, store: str, group: str | None) -> tuple[int, bytes | None]:
    """Return (rank, index key) of a cursor of ranking store's group ((0, None): from the top)."""
    if cursor is None:
        return 0, None
    try:
        raw = base64.urlsafe_b64decode(cursor.encode("ascii"))
        if not raw.startswith(_TAG):
            raise ValueError("not a ranking cursor")
        of_store, rank, of_group, key = orjson.loads(raw[len(_TAG) :])
        index_key = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError, TypeError, UnicodeEncodeError) as exc:
        raise InvalidCursorError(f"cursor {cursor!r} is not a cursor of a ranking") from exc
    if of_store != store or of_group != group:
        raise InvalidCursorError(f"cursor {cursor!r} is for {of_store!r} group {of_group!r}, not {store!r} {group!r}")
    if not isinstance(rank, int) or rank < 0 or not index_key.startswith(group_prefix(group)):
        raise InvalidCursorError(f"cursor {cursor!r} is not a cursor this API issued")
    return rank, index_key


def partition_positions(index_key: bytes | None, partitions: int) -> str | None:
    """Return the scan cursor that resumes every partition of a ranking just after index_key."""
    if index_key is None:
        return None
    return encode_positions({str(p): encode_cursor(index_key) for p in range(partitions)})
