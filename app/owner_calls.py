"""Route an owner-side field's keys to their owners: the lookups' routing core, the field's own sub-request.

``ClusterStoreQueries.call_many`` answers through ``call_many`` here. A field's keys are routed as lookups of
the store it names (``streaming.owner_fields``): keys → partitions (the producers' partitioner) → serving
replicas (``app.routing``, the staleness bound, failover), executed by ``ClusterStoreQueries._execute``. Keys
that need the same partitions form one batch; this node's batches run in place (``LocalPartitions.call``),
each peer's go in ONE ``_call`` sub-request (``schema.wire``) whatever their number.

A batch fails over to another replica as a whole when the replica cannot serve its partitions (not hosted,
not ready, down: the codes of ``FAILOVER_CODES``); a key's own failure — its function raised (INTERNAL),
ran too long (TIMEOUT) — is that key's answer, the others stand.

A key with two candidate partitions (producers' partitioner unknown or mixed) may be served by two nodes,
each running the function over its own partition only. Each owner reports whether the routing store holds
the key in the partitions it read (``wire.Owned.found``); the caller keeps the answer of the candidate
holding it — of none (the value computed with no data): the answer of the candidate with the lowest
partitions, whichever node answers first; of both: PARTITIONER_MISMATCH. On one node both partitions are
read in one call and its views merge them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from iqgraph.app import routing
from iqgraph.app.local_partitions import definition_of
from iqgraph.app.owner_fields import owner_field_of
from iqgraph.schema import wire
from iqgraph.schema.access import check_read
from iqgraph.schema.errors import PARTITIONER_MISMATCH, ApiError, api_error
from iqgraph.schema.types import Answer
from iqgraph.stores import Key

if TYPE_CHECKING:
    from iqgraph.app.cluster_queries import ClusterStoreQueries


class _Candidate(NamedTuple):
    """One candidate partition set's answer for a key: whether it holds the key, and its value or error."""

    found: bool
    value: Any
    partitions: tuple[int, ...]


def _replica_error(value: Any, codes: frozenset[str]) -> Exception | None:
    """Return value as the error that fails its whole batch over to another replica, if it is one."""
    if not isinstance(value, Exception):
        return None
    found = api_error(value)
    return found if isinstance(found, ApiError) and found.code in codes else None


def _per_batch(
    batches: Sequence[int],
    members: Sequence[Sequence[int]],
    reads: Mapping[int, Sequence[int]],
    values: Sequence[Any],
    codes: frozenset[str],
) -> dict[int, Any]:
    """Return per batch its keys' candidates (read from reads[b]), or the replica's error that fails it over."""
    found: dict[int, Any] = {}
    start = 0
    for b in batches:
        part = values[start : start + len(members[b])]
        start += len(part)
        error = next((e for e in (_replica_error(v, codes) for v in part) if e is not None), None)
        partitions = tuple(sorted(reads[b]))
        found[b] = error if error is not None else [_candidate(v, partitions) for v in part]
    return found


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
    from iqgraph.app.cluster_queries import FAILOVER_CODES  # it calls this module

    app = queries.app
    definition = definition_of(app, owner_field_of(app, field).store)
    check_read(queries.principal, definition.name)
    bound = queries._bound(max_lag)
    results: list[Any] = [None] * len(keys)
    batches: dict[tuple[int, ...], list[int]] = {}
    for i, where in enumerate(
        routing.store_keys_partitions(app, definition, keys, queries.partitioner(definition.topic))
    ):
        if isinstance(where, Exception):
            results[i] = where
        else:
            batches.setdefault(where, []).append(i)
    members = list(batches.values())

    async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
        here = list(group.reads)
        calls = [(keys[i], tuple(group.reads[b])) for b in here for i in members[b]]
        if server.node == queries.node_id:
            answer = await queries.local.call(field, calls, queries.principal)
        else:
            variables = {"field": field, "keys": wire.encode_calls(calls)}
            data = await queries.peers.query(queries._url(server.node), wire.CALL, variables, queries.principal)
            answer = wire.decode_call_answer(data["_call"])
        value = _per_batch(here, members, group.reads, answer.value, FAILOVER_CODES)
        return Answer(value, answer.positions, answer.lags)

    needs = {b: list(where) for b, where in enumerate(batches)}
    found = await queries._execute(definition, needs, bound, ask, _holding)
    for b, value in found.items():
        for i, v in zip(members[b], value if isinstance(value, list) else [value] * len(members[b]), strict=True):
            results[i] = v.value if isinstance(v, _Candidate) else v
    return results
