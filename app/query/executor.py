"""The one replica executor: the only code that loops over the replicas of partitions.

Reads (``app.query.store_queries``), owner-side calls (``app.owner.calls``) and live watches
(``app.live.watch``) hand it *what to ask*; it decides *where*, and owns every failover rule::

    keys ──batches()──▶ batches: the keys that need the same partitions, read together (app.query.batches)
                                     │
          Failover(topic, bound) ────┤ plan / choose (app.query.routing: pure)
            exclusions per partition │        │
            backoff, deadline        │        ▼
            map refresh, mark-down   │  ask(server, group) ─▶ Answer │ error   (the caller's: in place, a peer,
                                     │        │                                 a live source)
                                     ◀────────┘ failed(node, partitions, error): schema.errors.CODES says whether
                                                it fails over (that node excluded for those partitions; only
                                                until the next round when it ``waits``), or ends the item;
                                                an unreachable peer is marked down; STORE_MIGRATED refreshes
                                                the map (once per round)
    execute(): one ask of this node when it serves every partition (``_all_here``), else (and for what that ask
    left) rounds of plan → ask → record until every item is answered or the deadline passes; the
    coded errors it ends with carry the same extensions wherever they come from (``refusal_error``,
    ``unavailable``).

A read answers promptly: a partition no replica can serve fails at once, unless it was moving (its last
error ``waits``), which is retried with backoff until the deadline. A watch is *patient*: it retries any
refused partition until the deadline, since a subscription should outlive a node's restart window.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from iqgraph.app.cluster.membership import Membership
from iqgraph.app.cluster.peers import PeerError, PeerUnavailableError
from iqgraph.app.cluster.replicas import PeerStates, ReplicaState
from iqgraph.app.query import routing
from iqgraph.schema import tracing
from iqgraph.schema.errors import (
    NODE_UNAVAILABLE,
    STALE_BEYOND_BOUND,
    STORE_MIGRATED,
    ApiError,
    api_error,
    properties,
)
from iqgraph.schema.types import Answer
from iqgraph.stores import StoreError

MAX_ROUNDS = 16
RETRY_AFTER_MS = 1000


@dataclass(frozen=True)
class RetryPolicy:
    """How long a read waits for a partition that is not queryable yet (invariant 6), and how it backs off."""

    deadline_ms: int = 2_000
    first_backoff_ms: int = 25
    max_backoff_ms: int = 400


class Replicas(Protocol):
    """The cluster as the executor sees it (``ClusterReplicas``; a single node is a one-member cluster)."""

    node_id: str

    def choose(
        self, topic: str, partition: int, bound: int | None, excluded: Collection[str]
    ) -> routing.Server | routing.Refusal:
        """Return the replica that serves topic-partition now, or why none can."""
        ...

    def plan(
        self, topic: str, needs: Mapping[int, Sequence[int]], bound: int | None, excluded: Mapping[int, Collection[str]]
    ) -> routing.Plan:
        """Return where each item's partitions are read."""
        ...

    def mark_down(self, node: str) -> None:
        """Record that node failed a request: routing passes it over until it answers a poll again."""
        ...

    def refresh(self) -> None:
        """Read the cluster map again (a replica answered STORE_MIGRATED)."""
        ...


class ClusterReplicas:
    """The cluster map, what is known of each replica (this node's copies, the peers' polled states), the
    peers marked down after a failed request, and their URLs: what the executor plans with."""

    def __init__(
        self,
        membership: Membership,
        node_id: str,
        local: Callable[[str, int], tuple[str, int | None] | None],
        peer_states: PeerStates,
    ) -> None:
        self.membership = membership
        self.node_id = node_id
        self._local = local
        self.peer_states = peer_states

    def state(self, node: str, topic: str, partition: int) -> ReplicaState:
        """Return what is known of node's copy of topic-partition."""
        if node == self.node_id:
            found = self._local(topic, partition)
            return ReplicaState(found[0], found[1]) if found else ReplicaState("CLOSED")
        return self.peer_states.get(node, topic, partition)

    def choose(
        self, topic: str, partition: int, bound: int | None, excluded: Collection[str]
    ) -> routing.Server | routing.Refusal:
        """Return the replica that serves topic-partition now under the failover rules, or why none can."""
        cmap = self.membership.current()
        return routing.choose(cmap, self.state, topic, partition, bound, excluded, self.node_id)

    def plan(
        self, topic: str, needs: Mapping[int, Sequence[int]], bound: int | None, excluded: Mapping[int, Collection[str]]
    ) -> routing.Plan:
        """Return where each item's partitions are read now."""
        cmap = self.membership.current()
        return routing.plan(cmap, self.state, topic, needs, bound, excluded, self.node_id)

    def mark_down(self, node: str) -> None:
        """Record that node failed a request: routing passes it over until it answers a poll again."""
        self.peer_states.mark_down(node)
        mark = getattr(self.membership, "mark_down", None)
        if mark is not None:
            mark(node)

    def refresh(self) -> None:
        """Read the cluster map again."""
        self.membership.refresh()

    def url_of(self, node: str) -> str:
        """Return the URL of a member; raise PeerUnavailableError if it left the cluster."""
        url = self.membership.current().url_of(node)
        if url is None:
            raise PeerUnavailableError(f"node {node} is not a member of the cluster any more")
        return url


# -- keys → batches -------------------------------------------------------------------------------------


# -- errors ---------------------------------------------------------------------------------------------


def as_api_error(error: BaseException) -> ApiError | None:
    """Return the coded error a replica failed with (an unreachable peer: NODE_UNAVAILABLE); None if uncoded."""
    if isinstance(error, PeerError):
        extensions = {k: v for k, v in error.extensions.items() if k != "code"}
        if error.code == NODE_UNAVAILABLE:
            extensions.setdefault("retryAfterMs", RETRY_AFTER_MS)
        return ApiError(str(error), error.code, **extensions)
    if isinstance(error, ApiError | StoreError):
        found = api_error(error)
        return found if isinstance(found, ApiError) else None
    return None


def refusal_error(refusal: routing.Refusal, bound: int | None) -> ApiError:
    """Return the error of a partition no replica can serve: its partition, the best lag and the bound."""
    extensions: dict[str, Any] = {"partition": refusal.partition, "retryAfterMs": RETRY_AFTER_MS}
    if refusal.best_lag is not None:
        extensions["bestLag"] = refusal.best_lag
    if bound is not None:
        extensions["maxLag"] = bound
    return ApiError(refusal.message, refusal.code, **extensions)


def unavailable(topic: str, partitions: Sequence[int]) -> ApiError:
    """Return the error of partitions whose every replica failed until the deadline."""
    return ApiError(
        f"no replica of {topic} partitions {sorted(partitions)} answered in time",
        NODE_UNAVAILABLE,
        partition=min(partitions),
        retryAfterMs=RETRY_AFTER_MS,
    )


def beyond_bound(topic: str, node: str, partition: int, lag: int | None, bound: int | None) -> ApiError:
    """Return the error of a standby that answered more than the bound behind (or with no lag known)."""
    shown = "an unknown number of" if lag is None else str(lag)
    return ApiError(
        f"partition {topic}-{partition}: the standby {node} is {shown} records behind, more than maxLag {bound}",
        STALE_BEYOND_BOUND,
        partition=partition,
        bestLag=lag,
        maxLag=bound,
        retryAfterMs=RETRY_AFTER_MS,
    )


# -- one request's (or one watch's) failover -----------------------------------------------------------


class Failover:
    """The failover state of one request (or of a watch until its partitions are followed again), one topic."""

    def __init__(
        self,
        replicas: Replicas,
        topic: str,
        bound: int | None,
        retry: RetryPolicy,
        *,
        patient: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replicas = replicas
        self.topic = topic
        self.bound = bound
        self.retry = retry
        self.patient = patient
        self._clock = clock
        self.deadline = clock() + retry.deadline_ms / 1000
        self._backoff = retry.first_backoff_ms / 1000
        self._failed: dict[int, set[str]] = defaultdict(set)  # partition → nodes excluded for the rest
        self._waiting: dict[int, set[str]] = defaultdict(set)  # partition → nodes not ready (until the next round)
        self.last: dict[int, ApiError] = {}  # partition → the last failover-able error met there
        self._migrated = False
        self._new_round = False  # the nodes not ready are asked again in the next plan

    # -- where --------------------------------------------------------------------------------------------

    def excluded(self, partition: int) -> set[str]:
        """Return the nodes not to ask for partition now."""
        if self._new_round:
            self._new_round = False
            self._waiting.clear()
        return self._failed.get(partition, set()) | self._waiting.get(partition, set())

    def choose(self, partition: int) -> routing.Server | routing.Refusal:
        """Return the replica to follow partition on now, or why none can serve it."""
        return self.replicas.choose(self.topic, partition, self.bound, self.excluded(partition))

    def plan(self, needs: Mapping[int, Sequence[int]]) -> routing.Plan:
        """Return where each item's partitions are read now."""
        self.excluded(-1)  # a new round lets the nodes that were not ready be asked again
        if not self._failed and not self._waiting:  # a first round: no node excluded anywhere
            return self.replicas.plan(self.topic, needs, self.bound, {})
        parts = set(self._failed) | set(self._waiting)
        excluded = {p: self.excluded(p) for p in parts}
        return self.replicas.plan(self.topic, needs, self.bound, excluded)

    # -- what happened ------------------------------------------------------------------------------------

    def failed(self, node: str, partitions: Iterable[int], error: BaseException) -> ApiError | None:
        """Record that node could not serve partitions; return the error that ends the item if it cannot fail over.

        An uncoded error (a connection failed, a source ended) fails over; an unreachable peer is marked down.
        """
        if isinstance(error, PeerUnavailableError):
            self.replicas.mark_down(node)
        coded = as_api_error(error)
        if coded is not None and not properties(coded.code).transient:
            return coded
        if coded is not None and coded.code == STORE_MIGRATED:
            self._migrated = True
        waits = coded is not None and properties(coded.code).waits
        for p in partitions:
            if coded is not None:
                self.last[p] = coded
            (self._waiting if waits else self._failed)[p].add(node)
        return None

    def served(self, partition: int) -> None:
        """Record that partition is served again: every node may serve it next time."""
        self._failed.pop(partition, None)
        self._waiting.pop(partition, None)

    def forget(self, partitions: Iterable[int]) -> None:
        """Let the nodes excluded for refused partitions serve them again (a failed node may be back)."""
        for p in partitions:
            self.served(p)

    def refused(self, refusal: routing.Refusal) -> ApiError | None:
        """Return the error that ends a refused partition now, or None while it is worth waiting for."""
        last = self.last.get(refusal.partition)
        moving = last is not None and properties(last.code).waits
        if (moving or self.patient) and not self.expired():
            return None
        explained = last is not None and (moving or properties(last.code).explains)
        return last if explained and last is not None else refusal_error(refusal, self.bound)

    def given_up(self, partitions: Sequence[int]) -> ApiError:
        """Return the error of partitions still unanswered at the deadline: the last met, else unavailable."""
        return next((self.last[p] for p in partitions if p in self.last), None) or unavailable(self.topic, partitions)

    # -- when ---------------------------------------------------------------------------------------------

    def expired(self) -> bool:
        """Return whether the deadline has passed."""
        return self._clock() >= self.deadline

    def refresh_if_moved(self) -> None:
        """Read the cluster map again if a replica answered STORE_MIGRATED since the last round."""
        if self._migrated:
            self._migrated = False
            self.replicas.refresh()

    def next_round(self) -> float:
        """Return how long to back off before the next round (bounded by the deadline); refresh a moved map."""
        self.refresh_if_moved()
        delay = max(min(self._backoff, self.deadline - self._clock()), 0.0)
        self._backoff = min(self._backoff * 2, self.retry.max_backoff_ms / 1000)
        self._new_round = True
        return delay


# -- the rounds of a request ---------------------------------------------------------------------------

Ask = Callable[[routing.Server, routing.Group], Awaitable[Answer[dict[int, Any]]]]
#: Called with each answer that came back: (server, group, answer) → per item, its value, its error, or
#: ``Unserved`` (some of its partitions could not be served there); the hook where reads check a standby's lag
#: and report positions.
Accept = Callable[[routing.Server, routing.Group, Answer[dict[int, Any]]], Mapping[int, Any]]


class Unserved(NamedTuple):
    """An item's answer from a replica that could not serve some of its partitions (a standby beyond the bound)."""

    error: ApiError
    partitions: list[int]


@dataclass
class _Items:
    """What is left to answer of a request's items, across rounds."""

    remaining: dict[int, list[int]]  # item → partitions still to read
    partial: dict[int, Any] = field(default_factory=dict)  # item → value combined so far
    results: dict[int, Any] = field(default_factory=dict)  # item → final value or error
    last: dict[int, ApiError] = field(default_factory=dict)  # item → the last failover-able error it met

    def end(self, item: int, value: Any) -> None:
        self.results[item] = value
        self.remaining.pop(item, None)
        self.partial.pop(item, None)

    def read(self, item: int, partitions: Sequence[int], value: Any, combine: Callable[[Any, Any], Any] | None) -> None:
        """Record item's value from partitions; final once every partition it needs is read."""
        needed = self.remaining.get(item)
        if needed is None:
            return
        if len(needed) == 1 and needed[0] in partitions and item not in self.partial:
            self.end(item, value)  # one partition, read at once: the common case
            return
        had = item in self.partial
        self.partial[item] = combine(self.partial[item], value) if had and combine is not None else value
        left = [p for p in needed if p not in partitions]
        if left:
            self.remaining[item] = left
        else:
            self.end(item, self.partial[item])


async def execute(
    failover: Failover,
    needs: Mapping[int, Sequence[int]],
    ask: Ask,
    accept: Accept,
    combine: Callable[[Any, Any], Any] | None,
    store: str = "",
) -> dict[int, Any]:
    """Return per item its value (combined over its partitions) or the error it failed with.

    With tracing on (schema.tracing), each replica's batch of store is a span, and each round after the first a
    "failover retry" span around its batches."""
    items = _Items({i: list(ps) for i, ps in needs.items()})
    first = 0
    here = None if tracing.ENABLED else _all_here(failover, needs)
    if here is not None:  # the common case: this node's copies serve every partition; the rounds plan nothing
        group = routing.Group({i: list(ps) for i, ps in needs.items()})
        outcome = (await _gather([ask(here, group)]))[0]
        _record(failover, items, here, group, outcome, accept, combine)
        if not items.remaining:
            return items.results
        failover.refresh_if_moved()
        first = 1
    for round_ in range(first, MAX_ROUNDS):
        if not items.remaining:
            break
        plan = failover.plan(items.remaining)
        for i, refusal in plan.refused.items():
            error = failover.refused(refusal)
            if error is not None:
                items.end(i, error)
        groups = list(plan.groups.items())
        if tracing.ENABLED:
            outcomes = await _traced_round(round_, store, groups, ask)
        else:
            outcomes = await _gather([ask(server, group) for server, group in groups])
        for (server, group), outcome in zip(groups, outcomes, strict=True):
            _record(failover, items, server, group, outcome, accept, combine)
        if not items.remaining:
            break
        if not plan.groups or all(i in plan.refused for i in items.remaining):
            if failover.expired():
                break
            await asyncio.sleep(failover.next_round())
        else:
            failover.refresh_if_moved()
    for i in list(items.remaining):
        items.end(i, items.last.get(i) or failover.given_up(items.remaining[i]))
    return items.results


def _all_here(failover: Failover, needs: Mapping[int, Sequence[int]]) -> routing.Server | None:
    """Return this node's active copy when the rules choose it for every partition needed in a first round (nothing
    excluded yet), else None: then one ask answers every item, as the first round's plan would have made it."""
    here = failover.replicas.node_id
    server: routing.Server | None = None
    for p in {p for partitions in needs.values() for p in partitions}:  # each partition once, as ``plan`` asks
        chosen = failover.replicas.choose(failover.topic, p, failover.bound, ())
        if not isinstance(chosen, routing.Server) or chosen.node != here or chosen.stale:
            return None
        server = chosen
    return server


async def _traced_round(
    round_: int, store: str, groups: list[tuple[routing.Server, routing.Group]], ask: Ask
) -> list[Any]:
    """Ask each group in a span of its own (and the round in a failover retry span when it is not the first)."""
    batches = [
        tracing.traced(
            "store batch",
            {
                "iqgraph.store": store,
                "iqgraph.node": server.node,
                "iqgraph.partitions": list(group.partitions),
                "iqgraph.reads": len(group.reads),
                "iqgraph.replica": "standby" if server.stale else "active",
            },
            ask(server, group),
        )
        for server, group in groups
    ]
    if round_ == 0:
        return await _gather(batches)
    partitions = sorted({p for _, group in groups for p in group.partitions})
    with tracing.span(
        "failover retry", {"iqgraph.store": store, "iqgraph.round": round_, "iqgraph.partitions": partitions}
    ):
        return await _gather(batches)


def _record(
    failover: Failover,
    items: _Items,
    server: routing.Server,
    group: routing.Group,
    outcome: Answer[dict[int, Any]] | BaseException,
    accept: Accept,
    combine: Callable[[Any, Any], Any] | None,
) -> None:
    """Record one server's answer (or failure) for each item of its group."""
    if isinstance(outcome, BaseException):
        if as_api_error(outcome) is None and not isinstance(outcome, Exception):
            raise outcome  # a cancellation, an exit: not the replica's failure
        for i, partitions in group.reads.items():
            _failed(failover, items, i, server.node, partitions, outcome)
        return
    for i, value in accept(server, group, outcome).items():
        partitions = group.reads[i]
        if isinstance(value, Unserved):
            _failed(failover, items, i, server.node, value.partitions, value.error)
        elif isinstance(value, Exception):
            _failed(failover, items, i, server.node, partitions, value)
        else:
            items.read(i, partitions, value, combine)


def _failed(
    failover: Failover, items: _Items, item: int, node: str, partitions: Sequence[int], error: BaseException
) -> None:
    final = failover.failed(node, partitions, error)
    if final is not None:
        items.end(item, final)
        return
    coded = as_api_error(error)
    if coded is None and not isinstance(error, PeerUnavailableError):
        raise error  # neither a replica's coded failure nor an unreachable peer: a bug, not a failover
    items.last[item] = coded or unavailable(failover.topic, partitions)


async def _gather(asks: Sequence[Awaitable[Any]]) -> list[Any]:
    if len(asks) == 1:  # one server (always, on a single node): no task of its own
        try:
            return [await asks[0]]
        except Exception as exc:  # noqa: BLE001 - the executor turns it into the group's error
            return [exc]
    return await asyncio.gather(*asks, return_exceptions=True)
