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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
import strawberry

from iqgraph.schema.dynamic import data_field, list_of, object_type
from iqgraph.stores import InvalidCursorError, Page

T = TypeVar("T")
_TAG = b"iq1:"
MAX_READS = 4  # store reads for one page at most


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


def _past(order: Order, items: list[Any], last: Any) -> int:
    """Return the index of the first item whose sort key is past last (None: 0)."""
    start = 0
    if last is not None:
        while start < len(items) and not order.sort_key(items[start]) > last:
            start += 1
    return start


async def read_slice(read: ReadPage, order: Order, first: int, after: str | None, max_skip: int) -> Slice[Any]:
    """Return the first items after cursor `after`, reading from the store with read(count, cursor).

    A page comes up short of first when keys arrived before the cursor since it was issued, or when
    the store filters items out of its pages; then the next store page is read, up to MAX_READS reads.
    """
    resume = decode_cursor(order, after, max_skip)
    edges: list[tuple[str, Any]] = []
    for _ in range(MAX_READS):
        page = await read(resume.skip + first - len(edges), resume.base)
        start = _past(order, page.items, resume.last)
        taken = page.items[start : start + first - len(edges)]
        for i, item in enumerate(taken, start):
            last_of_page = i == len(page.items) - 1 and page.next_cursor is not None
            position = Resume(page.next_cursor) if last_of_page else Resume(resume.base, i + 1, order.sort_key(item))
            edges.append((encode_cursor(order, position), item))
        cut = start + len(taken) < len(page.items)  # items of this read are left for the next page
        if cut or page.next_cursor is None or len(edges) == first:
            break
        resume = Resume(page.next_cursor)
    has_next = cut or page.next_cursor is not None
    if cut or not has_next:
        end = edges[-1][0] if edges else None
    else:
        end = encode_cursor(order, Resume(page.next_cursor))
    info = PageInfo(
        has_next_page=has_next,
        has_previous_page=after is not None,
        start_cursor=edges[0][0] if edges else None,
        end_cursor=end,
    )
    return Slice(edges, info)


class ConnectionType:
    """A ``<Node>Connection`` type and its ``<Node>Edge`` type, and how to fill them."""

    def __init__(self, edge_name: str, connection_name: str, node_type: Any, description: str) -> None:
        self.edge = object_type(
            edge_name,
            [data_field("cursor", str, "Resume after this edge: pass as after."), data_field("node", node_type)],
            f"An edge of {connection_name}: a cursor and an item.",
        )
        edges = list_of(self.edge)
        self.type = object_type(
            connection_name, [data_field("edges", edges), data_field("pageInfo", PageInfo)], description
        )

    def make(self, page: Slice[Any], node: Callable[[Any], Any]) -> Any:
        """Return the connection object of a page, each item made into a node by node(item)."""
        edges = [self.edge(f0=cursor, f1=node(item)) for cursor, item in page.edges]
        return self.type(f0=edges, f1=page.page_info)

    def of_nodes(self, page: Slice[Any], nodes: Sequence[Any]) -> Any:
        """Return the connection object of a page whose items are made into nodes already (in edge order)."""
        edges = [self.edge(f0=cursor, f1=node) for (cursor, _), node in zip(page.edges, nodes, strict=True)]
        return self.type(f0=edges, f1=page.page_info)
