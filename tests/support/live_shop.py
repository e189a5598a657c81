"""A live shop on one node, without Spark: real RocksDB partitions written by the real StoreSink (batches built
as the partials would bring them), its ChangeFeed, the production StoreQueries and Live, and the public
schema with its subscriptions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.types import BooleanType, DataType, LongType
from strawberry.types import ExecutionResult

from iqgraph.app.catalog import entity_infos, store_info
from iqgraph.app.live.watch import Live
from iqgraph.schema import Limits, build_schema
from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.schema.context import Context, request_context
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.definitions import App
from iqgraph.streaming.sink import StoreSink
from tests.support.feed_shop import KEYS, MINUTE, START_MS, TOPIC, Orders, shop_app, where
from tests.support.queries import single_node

__all__ = ["KEYS", "MINUTE", "START_MS", "TOPIC", "Events", "LiveShop", "open_live_shop", "where"]

TYPES: dict[str, DataType] = {
    "per_key": LongType(),
    "per_minute": LongType(),
    "items": BooleanType(),
    "top": LongType(),
    "top_by_item": LongType(),  # a ranking of per_key per item, in apps that add it (tests/app/live/test_live_rankings)
}
WATCH = """subscription($keys: [String!]!, $after: [PositionInput!]) {
  perKeyWatch(keys: $keys, after: $after) { key value position { partition offset } dropped snapshot }
}"""
WATCH_WINDOWS = """subscription($keys: [String!]!, $from: DateTime) {
  perMinuteWatchWindows(keys: $keys, from: $from) { key start end value position { partition offset } dropped snapshot }
}"""
WATCH_CONTAINS = """subscription($keys: [String!]!) {
  itemsWatchContains(keys: $keys) { key position { partition offset } snapshot }
}"""


@dataclass
class LiveShop:
    """The shop's stores on one node, written batch by batch, followed by subscriptions."""

    partitions: dict[int, PartitionStores]
    feed: ChangeFeed
    limits: Limits
    hosted: Collection[int]
    role: Callable[[str, int], str]
    app: Any = field(default_factory=shop_app)
    orders: Orders = field(default_factory=Orders)

    def __post_init__(self) -> None:
        self.sink = StoreSink(self.app, self.app.topic(TOPIC), self.partitions, change_feed=self.feed)
        self.served = {TOPIC: {p: s for p, s in self.partitions.items() if p in self.hosted}}
        # the node's queries (a one-member cluster) over what it serves, given to its Live as app.node does
        self.queries = single_node(self.app, TYPES, self.served)
        self.live = Live(
            self.app,
            self.served,
            self.feed,
            partitioner=lambda topic: "murmur2",
            queries=self.queries,
            role=self.role,
            check_every_s=0.1,
        )
        stores = [store_info(self.app, s, TYPES[s.name]) for s in self.app.stores]
        self.schema = build_schema(stores, self.limits, entities=entity_infos(self.app), subscriptions=True)

    def context(self, principal: Principal = ANONYMOUS) -> Context:
        """Return a request context following this node's live feed."""
        return request_context(self.queries, self.limits, principal=principal, live=self.live)

    async def subscribe(
        self, query: str, variables: dict[str, Any] | None = None, principal: Principal = ANONYMOUS
    ) -> Events:
        """Start a subscription, as a transport does."""
        results = await self.schema.subscribe(query, variables, context_value=self.context(principal))
        return Events(results)  # type: ignore[arg-type]

    def write(self, orders: Sequence[tuple[str, str, int]]) -> None:
        """Apply one batch of orders (key, item, minute) through the sink, as a micro-batch would."""
        self.sink.apply(self.orders.batches(orders))

    def count(self, key: str) -> int | None:
        """Return the order count the store holds for key."""
        value: int | None = self.partitions[where(key)].kv("per_key").get(key)
        return value

    def position(self, partition: int) -> int:
        """Return the partition's applied position (next offset)."""
        return self.partitions[partition].db.next_offset()

    def close(self) -> None:
        """Close every partition database."""
        for stores in self.partitions.values():
            stores.close()


def open_live_shop(
    root: Path,
    *,
    feed: ChangeFeed | None = None,
    limits: Limits | None = None,
    hosted: Collection[int] = (0, 1),
    role: Callable[[str, int], str] = lambda topic, partition: "active",
    app: App | None = None,
    orders: Orders | None = None,
) -> LiveShop:
    """Return a live shop over new partitions under root (both RUNNING); hosted: those this node follows.

    app: the shop's stores and entities (default: the change feed tests' shop); orders: what builds its batches.
    """
    app = app or shop_app()
    state = StateDirectory(root / "state", "shop")
    partitions = {p: state.open(TOPIC, p, app.specs(TOPIC)) for p in (0, 1)}
    for stores in partitions.values():
        stores.db.set_state(PartitionState.RUNNING)
    return LiveShop(partitions, feed or ChangeFeed(), limits or Limits(), hosted, role, app, orders or Orders())


class Events:
    """A subscription's results as a client reads them: the next events, a quiet spell, the error it ends with."""

    def __init__(self, results: AsyncGenerator[ExecutionResult, None]) -> None:
        self.results = results
        self._next: asyncio.Future[ExecutionResult] | None = None  # a read still waiting (kept across calls)

    async def _result(self, timeout: float) -> ExecutionResult | None:
        self._next = self._next or asyncio.ensure_future(self.results.__anext__())
        done, _ = await asyncio.wait([self._next], timeout=timeout)
        if not done:
            return None
        result, self._next = self._next.result(), None
        return result

    async def take(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Return the next n events' data (the field's object), failing on an error or a wait past timeout."""
        found = []
        for _ in range(n):
            result = await self._result(timeout)
            assert result is not None, f"no event within {timeout} s"
            assert result.errors is None, [e.formatted for e in result.errors]
            assert result.data is not None
            found.append(next(iter(result.data.values())))
        return found

    async def quiet(self, seconds: float = 0.3) -> bool:
        """Return whether no event comes within seconds (a read keeps waiting for the next take)."""
        return await self._result(seconds) is None

    async def error(self, timeout: float = 5.0) -> dict[str, Any]:
        """Return the one error a failing subscription ends with (as the client sees it)."""
        result = await self._result(timeout)
        assert result is not None and result.errors, None if result is None else result.data
        return result.errors[0].formatted

    async def close(self) -> None:
        """Stop the subscription, as a client going away does."""
        if self._next is not None:
            self._next.cancel()
            await asyncio.gather(self._next, return_exceptions=True)
        await self.results.aclose()
