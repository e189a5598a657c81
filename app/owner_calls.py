"""Route an owner-side field's keys to their owners: the lookups' routing core, the field's own sub-request.

``ClusterStoreQueries.call_many`` answers through ``call_many`` here. A field's keys are routed as lookups of
the store it names (``streaming.owner_fields``): keys → partitions (the producers' partitioner) → serving
replicas (``app.routing``, the staleness bound, failover), executed by ``ClusterStoreQueries._execute``. Keys
that need the same partitions form one batch; this node's batches run in place (``LocalPartitions.call``),
each peer's go in ONE ``_call`` sub-request (``schema.wire``) whatever their number.

A batch fails over to another replica as a whole when the replica cannot serve its partitions (not hosted,
not ready, down: the codes of ``FAILOVER_CODES``); a key's own failure — its function raised (INTERNAL),
ran too long (TIMEOUT) — is that key's answer, the others stand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from iqgraph.app import routing
from iqgraph.app.local_partitions import definition_of
from iqgraph.app.owner_fields import owner_field_of
from iqgraph.schema import wire
from iqgraph.schema.errors import ApiError, api_error
from iqgraph.schema.types import Answer
from iqgraph.stores import Key

if TYPE_CHECKING:
    from iqgraph.app.cluster_queries import ClusterStoreQueries


def _replica_error(value: Any, codes: frozenset[str]) -> Exception | None:
    """Return value as the error that fails its whole batch over to another replica, if it is one."""
    if not isinstance(value, Exception):
        return None
    found = api_error(value)
    return found if isinstance(found, ApiError) and found.code in codes else None


def _per_batch(
    batches: Sequence[int], members: Sequence[Sequence[int]], values: Sequence[Any], codes: frozenset[str]
) -> dict[int, Any]:
    """Return per batch its keys' values, or the replica's error that fails the batch over."""
    found: dict[int, Any] = {}
    start = 0
    for b in batches:
        part = values[start : start + len(members[b])]
        start += len(part)
        found[b] = next((e for e in (_replica_error(v, codes) for v in part) if e is not None), part)
    return found


def _first_found(a: list[Any], b: list[Any]) -> list[Any]:
    """Return two candidate partitions' values of a batch, key by key: the one that found something."""
    return [y if x is None else x for x, y in zip(a, b, strict=True)]


async def call_many(queries: ClusterStoreQueries, field: str, keys: Sequence[Key], max_lag: int | None) -> list[Any]:
    """Return field's value per key, in key order (an error in place of a key that failed)."""
    from iqgraph.app.cluster_queries import FAILOVER_CODES  # it calls this module

    app = queries.app
    definition = definition_of(app, owner_field_of(app, field).store)
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
            answer = await queries.local.call(field, calls)
        else:
            variables = {"field": field, "keys": wire.encode_calls(calls)}
            data = await queries.peers.query(queries._url(server.node), wire.CALL, variables, queries.authorization)
            answer = wire.decode_call_answer(data["_call"])
        return Answer(_per_batch(here, members, answer.value, FAILOVER_CODES), answer.positions, answer.lags)

    needs = {b: list(where) for b, where in enumerate(batches)}
    found = await queries._execute(definition, needs, bound, ask, _first_found)
    for b, value in found.items():
        for i, v in zip(members[b], value if isinstance(value, list) else [value] * len(members[b]), strict=True):
            results[i] = v
    return results
