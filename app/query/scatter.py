"""Merge pages from several sources (partitions, later nodes) into one page with one cursor.

Each source is read with its own stores cursor; the merged cursor records, per source, where to resume:
absent = from the start, null = exhausted, a string = the source's cursor. Items are merged in sort
order; items of different sources with the same sort key are combined (a store not keyed by the record
key holds partial states of one key in several partitions). No gaps and no duplicates across pages:
a source resumes right after the last of its items that made it into a page.
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from iqgraph.stores import InvalidCursorError, Page
from iqgraph.stores.scan import encode_cursor

T = TypeVar("T")
Position = str | None  # None: exhausted
_TAG = "m1:"


def encode_positions(positions: Mapping[str, Position]) -> str:
    """Return the merged cursor of per-source positions."""
    return base64.urlsafe_b64encode(_TAG.encode() + orjson.dumps(dict(positions))).decode("ascii")


def decode_positions(cursor: str | None) -> dict[str, Position]:
    """Return the per-source positions of a merged cursor (empty: start everywhere)."""
    if cursor is None:
        return {}
    try:
        raw = base64.urlsafe_b64decode(cursor.encode("ascii"))
        if not raw.startswith(_TAG.encode()):
            raise ValueError("not a merged cursor")
        positions = orjson.loads(raw[len(_TAG) :])
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise InvalidCursorError(f"cursor {cursor!r} is not a cursor this API issued") from exc
    if not isinstance(positions, dict) or not all(v is None or isinstance(v, str) for v in positions.values()):
        raise InvalidCursorError(f"cursor {cursor!r} is not a cursor this API issued")
    return positions


@dataclass(frozen=True)
class Merge(Generic[T]):
    """How to order, combine and locate the items of one kind of page."""

    sort_key: Callable[[T], Any]
    position_of: Callable[[T], bytes]  # the stores key bytes a source resumes after
    combine: Callable[[T, T], T] | None = None


def merge_pages(pages: Mapping[str, Page[T]], first: int, merge: Merge[T]) -> tuple[list[T], dict[str, Position]]:
    """Return up to first merged items and the positions after them; sources absent from pages are exhausted."""
    heap: list[tuple[Any, str, int]] = []
    for source, page in pages.items():
        if page.items:
            heap.append((merge.sort_key(page.items[0]), source, 0))
    heapq.heapify(heap)
    consumed: dict[str, int] = {}
    out: list[T] = []
    while heap and len(out) < first:
        key, source, index = heapq.heappop(heap)
        item = pages[source].items[index]
        _advance(heap, pages, source, index, merge)
        consumed[source] = index + 1
        while heap and heap[0][0] == key:
            _, other, other_index = heapq.heappop(heap)
            other_item = pages[other].items[other_index]
            item = merge.combine(item, other_item) if merge.combine else item
            _advance(heap, pages, other, other_index, merge)
            consumed[other] = other_index + 1
        out.append(item)
    return out, _positions(pages, consumed, merge)


def _advance(
    heap: list[tuple[Any, str, int]], pages: Mapping[str, Page[Any]], source: str, index: int, merge: Merge[Any]
) -> None:
    items = pages[source].items
    if index + 1 < len(items):
        heapq.heappush(heap, (merge.sort_key(items[index + 1]), source, index + 1))


def _positions(pages: Mapping[str, Page[T]], consumed: Mapping[str, int], merge: Merge[T]) -> dict[str, Position]:
    positions: dict[str, Position] = {}
    for source, page in pages.items():
        used = consumed.get(source, 0)
        if used == len(page.items):
            positions[source] = page.next_cursor
        else:
            positions[source] = encode_cursor(merge.position_of(page.items[used - 1])) if used else _unmoved
    return {s: p for s, p in positions.items() if p is not _unmoved}


_unmoved: Any = object()


def merged_page(items: list[T], positions: Mapping[str, Position], before: Mapping[str, Position]) -> Page[T]:
    """Return the page of merged items with the cursor to resume after it (None when all are exhausted)."""
    resume = {**before, **positions}
    if all(p is None for p in resume.values()):
        return Page(items, None)
    return Page(items, encode_positions(resume))
