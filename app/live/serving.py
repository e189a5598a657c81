"""The owner's side of a watch: partitions hosted here, followed for whoever serves a watch from them.

A watch (``app.live.watch``) follows each of its partitions on the replica the failover rules choose. When that
replica is this node, ``Serving.follow`` is its source: for a peer's relay (``app.live.relay``: the upstream it
opens to ``/internal/follow``, ``app.live.stream``), and for this node's own watches alike. It checks what the
caller carried (``schema.access.check_read``), the keys' limit (``wire.MAX_FOLLOW_KEYS``) and the copy asked for
(the active one, or a standby when the watch accepts one), then follows the partitions on this node's change feed
(``app.live.follow.follow_partitions``) until they stop being served here as they were (STORE_MIGRATED).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping

from iqgraph.app.catalog import definition_of
from iqgraph.app.live.follow import Hosted, Interest, Rows, follow_partitions, partitions_of
from iqgraph.schema import wire
from iqgraph.schema.access import Principal, check_read
from iqgraph.schema.errors import STORE_MIGRATED, ApiError, api_error, invalid_argument, limit_exceeded
from iqgraph.stores import PartitionState, PartitionStores, StoreError, store_class
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.definitions import App, StoreDefinition


def watchable(app: App, store: str) -> StoreDefinition:
    """Return the definition of a store whose keys can be followed; raise its coded error otherwise."""
    try:
        definition = definition_of(app, store)
    except StoreError as exc:
        raise api_error(exc) from None
    if not store_class(definition.kind).followable:  # a ranking is followed by its store's changes instead
        raise invalid_argument("store", f"{store} is a {definition.kind.value} store, which cannot be followed")
    return definition


class Serving:
    """Follow partitions hosted here for a watch's source: a peer's relay, or this node's own watch."""

    def __init__(
        self,
        app: App,
        partitions: Hosted,
        feed: ChangeFeed,
        *,
        node_id: str,
        role: Callable[[str, int], str] | None = None,
        lag: Callable[[str, int], int | None] | None = None,
        check_every_s: float = 2.0,
    ) -> None:
        """Args:
        partitions: topic → partition → stores this node hosts, now (the runner's live dict).
        role: "active" or "standby" of this node's copy of a topic-partition (default: active). lag: this node's lag
        of a partition (default: none known). check_every_s: how often a quiet partition is checked for still
        being served here.
        """
        self.app = app
        self.partitions = partitions
        self.feed = feed
        self.node_id = node_id
        self.role = role or (lambda topic, partition: "active")
        self.lag = lag or (lambda topic, partition: None)
        self.check_every_s = check_every_s

    async def follow(
        self,
        topic: str,
        interest: Interest,
        after: Mapping[int, int],
        window_from: Mapping[str, int | None],
        standby: bool,
        principal: Principal,
    ) -> AsyncGenerator[Rows, None]:
        """Yield the rows of interest's partitions hosted here, checking the caller; standby: a standby copy may
        serve them (the watch accepts one)."""
        for store in interest:
            check_read(principal, store)
            if watchable(self.app, store).topic != topic:
                raise invalid_argument("interest", f"store {store} is not of topic {topic}")
        count = sum(len(keys) for ps in interest.values() for keys in ps.values())
        if count > wire.MAX_FOLLOW_KEYS:
            raise limit_exceeded("keys a peer follows", wire.MAX_FOLLOW_KEYS, count)
        hosted = {p: self._serves(topic, p, standby) for p in partitions_of(interest)}
        roles = {p: self.role(topic, p) for p in hosted}

        def still_serves(p: int, stores: PartitionStores) -> bool:
            now = self.partitions.get(topic, {}).get(p)
            return now is stores and (standby or self.role(topic, p) == "active")

        def lag(p: int) -> int | None:
            if roles[p] == "active":
                return None
            found = self.lag(topic, p)
            return 0 if found is None else found  # a standby's rows always say so (its end offset not known yet: 0)

        follow = follow_partitions(
            self.app,
            self.feed,
            topic,
            hosted,
            interest,
            after=after,
            window_from=window_from,
            still_serves=still_serves,
            lag=lag,
            check_every_s=self.check_every_s,
        )
        async with contextlib.aclosing(follow) as rows:
            async for found in rows:
                yield found

    def _serves(self, topic: str, partition: int, standby: bool) -> PartitionStores:
        """Return the stores of a partition this node may serve a watch from, or why not (coded)."""
        stores = self.partitions.get(topic, {}).get(partition)
        if stores is None or not (standby or self.role(topic, partition) == "active"):
            copy = "is not hosted" if stores is None else "is only a standby copy"
            raise ApiError(
                f"partition {topic}-{partition} {copy} on {self.node_id}", STORE_MIGRATED, partition=partition
            )
        if stores.db.state is not PartitionState.RUNNING:
            raise api_error(stores.db.not_queryable(f" on {self.node_id}"))
        return stores
