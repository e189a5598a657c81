"""Relay-style connections over the pages StoreQueries returns, with a resumable cursor on every edge.

A StoreQueries page has one cursor, after its last item. Relay wants one per edge, so an edge cursor
records where its page was read from (the store cursor), how many items of that read come up to the
edge, and the edge's sort key (the key, or the window's (start, key) / (key, start)). Resuming reads
from the store cursor again and drops every item whose sort key is not past the edge's: pages neither
skip nor repeat items even if keys were added or removed meanwhile. The last edge of a page that used
up its read carries the store's own cursor. Cursors are opaque (base64url JSON) and bound to one store
and one order; anything else given as ``after`` is INVALID_CURSOR.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
import strawberry

from schema.dynamic import data_field, object_type
from schema.naming import TypeNames
from stores import InvalidCursorError, Page

T = TypeVar("T")
_TAG = b"iq1:"


@strawberry.type(description="Where a page of a connection stands (Relay).")
class PageInfo:
    has_next_page: bool = strawberry.field(description="Whether items follow this page: pass endCursor as after.")
    has_previous_page: bool = strawberry.field(description="Whether this page was read after a cursor.")
    start_cursor: str | None = strawberry.field(description="The cursor of the first edge.")
    end_cursor: str | None = strawberry.field(description="The cursor to read the next page after.")


@dataclass(frozen=True)
class Resume:
    """Where a page starts: after `skip` items read from store cursor `base`, past sort key `last`."""

    base: str | None
    skip: int = 0
    last: Any = None


@dataclass(frozen=True)
class Order:
    """How one connection's items are ordered: its cursor scope and each item's sort key."""

    scope: str  # "<store>:<order>"; a cursor only resumes the scope it was made in
    sort_key: Callable[[Any], Any]  # JSON-able: a key, or [a, b] (lists compare like tuples)
    valid_key: Callable[[Any], bool]  # whether a decoded sort key has the right shape


def encode_cursor(order: Order, resume: Resume) -> str:
    """Return the opaque cursor of resume in order's scope."""
    body = orjson.dumps({"s": order.scope, "b": resume.base, "n": resume.skip, "k": resume.last})
    return base64.urlsafe_b64encode(_TAG + body).decode("ascii")


def decode_cursor(order: Order, cursor: str | None, max_skip: int) -> Resume:
    """Return where the page after cursor starts; raise InvalidCursorError if it is not ours."""
    if cursor is None:
        return Resume(None)
    try:
        raw = base64.urlsafe_b64decode(cursor.encode("ascii"))
        if not raw.startswith(_TAG):
            raise ValueError("tag")
        data = orjson.loads(raw[len(_TAG) :])
        base, skip, last, scope = data["b"], data["n"], data["k"], data["s"]
    except (binascii.Error, ValueError, UnicodeEncodeError, KeyError, TypeError) as exc:
        raise InvalidCursorError(f"after: {cursor!r} is not a cursor this API issued") from exc
    if scope != order.scope:
        raise InvalidCursorError(f"after: the cursor belongs to {scope!r}, not to {order.scope!r}")
    if not (base is None or isinstance(base, str)) or not isinstance(skip, int) or skip < 0:
        raise InvalidCursorError(f"after: {cursor!r} is not a cursor this API issued")
    if (last is None) != (skip == 0) or (last is not None and not order.valid_key(last)):
        raise InvalidCursorError(f"after: {cursor!r} is not a cursor this API issued")
    # The sort key keeps the page exact; skip only sizes the read, so a forged one is merely capped.
    return Resume(base, min(skip, max_skip), last)


ReadPage = Callable[[int, "str | None"], Awaitable[Page[Any]]]


@dataclass
class Slice(Generic[T]):
    """One page of a connection: (cursor, item) edges and the page info."""

    edges: list[tuple[str, T]]
    page_info: PageInfo


async def read_slice(read: ReadPage, order: Order, first: int, after: str | None, max_skip: int) -> Slice[Any]:
    """Return the first items after cursor `after`, reading from the store with read(count, cursor)."""
    resume = decode_cursor(order, after, max_skip)
    page = await read(resume.skip + first, resume.base)
    raw = page.items
    start = 0
    if resume.last is not None:
        while start < len(raw) and not order.sort_key(raw[start]) > resume.last:
            start += 1
    taken = raw[start : start + first]
    edges: list[tuple[str, Any]] = []
    for i, item in enumerate(taken, start):
        if i == len(raw) - 1 and page.next_cursor is not None:
            cursor = encode_cursor(order, Resume(page.next_cursor))
        else:
            cursor = encode_cursor(order, Resume(resume.base, i + 1, order.sort_key(item)))
        edges.append((cursor, item))
    has_next = len(raw) - start > first or page.next_cursor is not None
    end = edges[-1][0] if edges else (encode_cursor(order, Resume(page.next_cursor)) if page.next_cursor else None)
    start_cursor = edges[0][0] if edges else None
    return Slice(edges, PageInfo(has_next_page=has_next, has_previous_page=after is not None, start_cursor=start_cursor, end_cursor=end))


class ConnectionType:
    """The ``<Node>Connection`` and ``<Node>Edge`` types of one node type, and how to fill them."""

    def __init__(self, names: TypeNames, node_name: str, node_type: Any, description: str) -> None:
        edge_name, connection_name = names.new(f"{node_name}Edge"), names.new(f"{node_name}Connection")
        self.edge = object_type(
            edge_name,
            [data_field("cursor", str, "Resume after this edge: pass as after."), data_field("node", node_type)],
            f"One item of a {connection_name}.",
        )
        self.type = object_type(
            connection_name,
            [data_field("edges", list[self.edge]), data_field("pageInfo", PageInfo)],  # type: ignore[name-defined]
            description,
        )

    def make(self, page: Slice[Any], node: Callable[[Any], Any]) -> Any:
        """Return the connection object of a page, each item made into a node by node(item)."""
        edges = [self.edge(f0=cursor, f1=node(item)) for cursor, item in page.edges]
        return self.type(f0=edges, f1=page.page_info)
