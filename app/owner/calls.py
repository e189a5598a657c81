"""Route an owner-side field's keys to their owners: the lookups' routing core, the field's own sub-request.

``ClusterStoreQueries.call_many`` answers through ``call_many`` here. A field's keys are routed as lookups of
the store it names (``streaming.owner_fields``): keys → partitions (the producers' partitioner) → serving
replicas (``app.query.routing``, the staleness bound, failover), executed by the one executor
(``app.query.executor``, through ``ClusterStoreQueries.run``). Keys
that need the same partitions form one batch; this node's batches run in place (``LocalPartitions.call``),
each peer's go in ONE ``_call`` sub-request (``PeerClient.call``, ``schema.wire``) whatever their number.

A batch fails over to another replica as a whole when the replica cannot serve its partitions (not hosted,
not ready, down: the codes that fail over in ``schema.errors.CODES``); a key's own failure — its function
raised (INTERNAL), ran too long (TIMEOUT) — is that key's answer, the others stand.

A key with two candidate partitions (producers' partitioner unknown or mixed) may be served by two nodes,
each running the function over its own partition only. Each owner reports whether the routing store holds
the key in the partitions it read (``wire.Owned.found``); the caller keeps the answer of the candidate
holding it — of none (the value computed with no data): the answer of the candidate with the lowest
partitions, whichever node answers first; of both: PARTITIONER_MISMATCH. On one node both partitions are
read in one call and its views merge them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from iqgraph.app.catalog import definition_of
from iqgraph.app.owner.runner import owner_field_of
from iqgraph.app.query import routing
from iqgraph.app.query.batches import batches, per_batch
from iqgraph.schema import wire
from iqgraph.schema.access import check_read
from iqgraph.schema.errors import PARTITIONER_MISMATCH, ApiError, api_error, fails_over
from iqgraph.schema.types import Answer
from iqgraph.stores import Key

if TYPE_CHECKING:
    from iqgraph.app.query.store_queries import ClusterStoreQueries


class _Candidate(NamedTuple):
    """One candidate partition set's answer for a key: whether it holds the key, and its value or error."""

    found: bool
    value: Any
    partitions: tuple[int, ...]


def _batch(values: Sequence[Any], partitions: tuple[int, ...]) -> Any:
    """Return a batch's keys' candidates (read from partitions), or the replica's error that fails it over."""
    error = next((v for v in values if isinstance(v, Exception) and fails_over(api_error(v))), None)
    return api_error(error) if error is not None else [_candidate(v, partitions) for v in values]


def _candidate(value: Any, partitions: tuple[int, ...]) -> _Candidate:
    if isinstance(value, wire.Owned):
        return _Candidate(value.found, value.value, partitions)
    return _Candidate(False, value, partitions)  # an error without found: it holds nothing we know of


def _holding(a: list[_Candidate], b: list[_Candidate]) -> list[_Candidate]:
    """Return two candidate partitions' answers of a batch, key by key: the one whose store holds the key."""
    return [_pick(x, y) for x, y in zip(a, b, strict=True)]


def _pick(x: _Candidate, y: _Candidate) -> _Candidate:
    if x.found and y.found:
        partitions = tuple(sorted({*x.partitions, *y.partitions}))
        return _Candidate(True, _both_hold(partitions), partitions)
    if x.found != y.found:
        return x if x.found else y
    return min(x, y, key=lambda c: c.partitions)  # neither: the same candidate's, whichever answered first


def _both_hold(partitions: tuple[int, ...]) -> ApiError:
    return ApiError(
        f"the key is held in partitions {list(partitions)}, both candidates of its producers' partitioners: "
        "the producers use two partitioners for one key, so no one partition answers it; set the app's kafka "
        "partitioner to the one the producers use, or produce with one partitioner",
        PARTITIONER_MISMATCH,
        partitions=list(partitions),
    )


async def call_many(queries: ClusterStoreQueries, field: str, keys: Sequence[Key], max_lag: int | None) -> list[Any]:
    """Return field's value per key, in key order (an error in place of a key that failed)."""
    app = queries.app
    definition = definition_of(app, owner_field_of(app, field).store)
    check_read(queries.principal, definition.name)
    queries.bound(max_lag)  # a bad maxLag fails before any call
    routed = batches(app, definition, keys, queries.partitioner(definition.topic))
    results: list[Any] = [routed.errors.get(i) for i in range(len(keys))]

    async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
        calls = [(keys[i], partitions) for _, i, partitions in routed.of(group.reads)]
        if server.node == queries.node_id:
            answer = await queries.local.call(field, calls, queries.principal)
        else:
            url = queries.replicas.url_of(server.node)
            answer = await queries.peers.call(url, field, calls, queries.principal)
        values = per_batch(list(group.reads), routed.members, answer.value)
        found = {b: _batch(part, tuple(sorted(group.reads[b]))) for b, part in zip(group.reads, values, strict=True)}
        return Answer(found, answer.positions, answer.lags, answer.kafka_away_since)

    found = await queries.run(definition, max_lag, routed.needs(), ask, _holding)
    for b, value in found.items():
        members = routed.members[b]
        for i, v in zip(members, value if isinstance(value, list) else [value] * len(members), strict=True):
            results[i] = v.value if isinstance(v, _Candidate) else v
    return results
