"""Ordered scans over a column family, cut into pages with resumable cursors."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rocksdict import Rdict

from iqgraph.stores.exceptions import InvalidCursorError

T = TypeVar("T")
_CURSOR_TAG = b"c1:"


def encode_cursor(last_key: bytes) -> str:
    """Return an opaque cursor that resumes a scan just after last_key."""
    return base64.urlsafe_b64encode(_CURSOR_TAG + last_key).decode("ascii")


def decode_cursor(cursor: str) -> bytes:
    """Return the key a cursor resumes after; raise InvalidCursorError if it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise InvalidCursorError(f"cursor {cursor!r} is not a cursor this API issued") from exc
    if not raw.startswith(_CURSOR_TAG):
        raise InvalidCursorError(f"cursor {cursor!r} is not a cursor this API issued")
    return raw[len(_CURSOR_TAG) :]


@dataclass
class Page(Generic[T]):
    """One page of an ordered scan; next_cursor is None when the scan is exhausted."""

    items: list[T] = field(default_factory=list)
    next_cursor: str | None = None


def scan(
    family: Rdict, start: bytes | None, stop: Callable[[bytes], bool] | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """Yield (key, value) from start (inclusive) in byte order until stop(key) is true."""
    it = family.iter()
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    while it.valid():
        key: bytes = it.key()
        if stop is not None and stop(key):
            return
        yield key, it.value()
        it.next()


def resume_point(start: bytes | None, after: str | None) -> tuple[bytes | None, bytes | None]:
    """Return (where to seek, key to skip) for a scan from start resumed after a cursor."""
    if after is None:
        return start, None
    last = decode_cursor(after)
    if start is not None and last < start:
        raise InvalidCursorError("cursor points before the start of this range")
    return last, last


def paginate(
    family: Rdict,
    start: bytes | None,
    stop: Callable[[bytes], bool] | None,
    limit: int,
    after: str | None,
    convert: Callable[[bytes, bytes], Any],
    keep: Callable[[bytes], bool] | None = None,
) -> Page[Any]:
    """Return up to limit converted entries from start (or after the cursor) until stop, skipping unkept keys."""
    if limit <= 0:
        raise ValueError(f"page size must be positive, got {limit}")
    seek, skip = resume_point(start, after)
    page: Page[Any] = Page()
    last: bytes | None = None
    for key, value in scan(family, seek, stop):
        if key == skip or (keep is not None and not keep(key)):
            continue
        if len(page.items) == limit:
            page.next_cursor = encode_cursor(last) if last is not None else None
            break
        page.items.append(convert(key, value))
        last = key
    return page


def prefix_stop(prefix: bytes) -> Callable[[bytes], bool]:
    """Return a stop predicate true for the first key past those starting with prefix."""
    return lambda key: not key.startswith(prefix)


def inclusive_stop(upper: bytes | None) -> Callable[[bytes], bool] | None:
    """Return a stop predicate true past upper (inclusive bound); None for no bound."""
    if upper is None:
        return None
    return lambda key: key > upper
