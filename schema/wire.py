"""The peer wire protocol: the forwarded sub-requests a node sends, and how their answers are encoded.

A node reads another node's partitions with ONE GraphQL request per peer to the internal fields
(``schema.internal``): ``_lookup`` (point reads, each naming the partitions to read — the caller's
routing decides, the peer only checks it hosts them), ``_scan`` (one page per partition, resumed at
its position) and ``_count``. Answers are compact JSON: mergeable *states*, not values, so that the
caller combines several nodes' answers before finalizing; every answer carries, per partition read,
its position (the applied offset, read before the data) and its lag, and, when the peer cannot reach Kafka,
since when (``kafkaAwaySince``, unix time: its answer is the last state it knew). Both sides of the wire use this
module: the peer client (``app.cluster.peers``) and the internal fields.

    lookup reads   [[key, time_from, time_to, [partition, …]], …]
    answer         {"results": [state | {"error": {message, extensions}}, …],
                    "positions": {"<p>": offset}, "lags": {"<p>": records}}
    scan answer    {"pages": {"<p>": {"items": [[key, state] | [key, start, end, state], …],
                    "next": cursor | null} | {"error": …}}, "positions": …, "lags": …}
    count answer   {"counts": {"<p>": n | {"error": …}}, "positions": …, "lags": …}
    _call keys     [[key, [partition, …]], …]  (an owner-side field's keys: app.owner.calls)
    _call answer   {"results": [[found, value] | {"error": …, "found": found} | {"error": …}, …],
                   "positions": …, "lags": …}  (a value is boxed: a struct value {"error": …} is not
                   mistaken for an error; found: the routing store holds the key in the partitions read —
                   an error without it is the replica's, e.g. a partition not ready)

Live sources between nodes (follow and changes streams): ``schema.live.peer_streams``.

A node's health for its peers' poller is ``READY_PATH`` (``encode_ready``; its partitions in the names
``decode_partition`` reads, the same as the node metadata's), with what the node knows of Kafka:

    kafka          {"reachable": bool, "unreachableSince": "2026-11-29T08:40:12+00:00" | null,
                    "unreachableSinceSeconds": unix time | null}  (null before the node watches Kafka)
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

import orjson

from iqgraph.schema.errors import INTERNAL, ApiError, api_error
from iqgraph.schema.types import Answer, NodeInfo, PartitionInfo, PipelineInfo, Read
from iqgraph.stores import IndexEntry, Page, WindowedValue
from iqgraph.stores.distinct import BloomBits, KeyDigests

log = logging.getLogger(__name__)

#: The peers' endpoints (signed: ``app.security.peer_auth``), and the health their poller reads.
INTERNAL_PREFIX = "/internal/"  # served only on the peer listener (app.http.server.peer_asgi)
INTERNAL_PATH = "/internal/graphql"
FOLLOW_PATH = "/internal/follow"
CHANGES_PATH = "/internal/changes"
READY_PATH = "/readyz"
HEALTH_PATH = "/healthz"  # says where the node's peer listener is (peerUrl)
HEARTBEAT_S = 5.0  # a stream's comment when it has nothing to send: a follower notices a peer gone silent
MAX_FOLLOW_KEYS = 100_000  # keys one follow request may name (a relay opens another stream past it)

LOOKUP = """query($store: String!, $reads: JSON!) { _lookup(store: $store, reads: $reads) }"""
SCAN = """query($store: String!, $scan: JSON!, $positions: JSON!, $first: Int!, $partitions: [Int!]!) {
  _scan(store: $store, scan: $scan, positions: $positions, first: $first, partitions: $partitions) }"""
COUNT = """query($store: String!, $partitions: [Int!]!, $exact: Boolean!) {
  _count(store: $store, partitions: $partitions, exact: $exact) }"""
CALL = """query($field: String!, $keys: JSON!) { _call(field: $field, keys: $keys) }"""
NODE = (
    "{ node { id url state"
    " partitions { topic partition role state appliedOffset endOffset secondsSinceApplied stalled }"
    " pipeline { state restarts deathsInARow keepsDying lastError } } }"
)


#: Most lookups one forwarded request carries (each is an aliased field: the alias limit is 100).
MAX_LOOKUPS = 50
#: How long a node waits for a peer's answer (read, write, pool), in seconds: an owner-side field's longest
#: run (``streaming.owner_fields.OWNER_FIELD_MAX_TIMEOUT_S``, 4 s) and a round trip; tests/streaming/
#: test_owner_fields.py checks the two agree (schema and streaming do not import each other).
PEER_TIMEOUT_S = 5.0


def lookups(count: int) -> str:
    """Return the document of count point-read batches in ONE request: ``l<i>: _lookup(store: $s<i>, reads: $r<i>)``.

    A request that reads several stores (an entity, a relation's depth) sends one sub-request per peer, not
    one per store; ``lookup_variables`` fills it, and each answer is ``data["l<i>"]``.
    """
    if count == 1:
        return LOOKUP
    variables = ", ".join(f"$s{i}: String!, $r{i}: JSON!" for i in range(count))
    fields = " ".join(f"l{i}: _lookup(store: $s{i}, reads: $r{i})" for i in range(count))
    return f"query({variables}) {{ {fields} }}"


def lookup_variables(batches: Sequence[tuple[str, list[list[Any]]]]) -> tuple[dict[str, Any], list[str]]:
    """Return the variables of ``lookups(len(batches))`` for (store, encoded reads) batches, and each answer's field."""
    if len(batches) == 1:
        store, reads = batches[0]
        return {"store": store, "reads": reads}, ["_lookup"]
    variables: dict[str, Any] = {}
    for i, (store, reads) in enumerate(batches):
        variables[f"s{i}"], variables[f"r{i}"] = store, reads
    return variables, [f"l{i}" for i in range(len(batches))]


def encode_reads(reads: Sequence[Read]) -> list[list[Any]]:
    """Return point reads as JSON: [key, time_from, time_to, [partitions]]."""
    return [[key, lo, hi, list(partitions)] for (key, lo, hi), partitions in reads]


def decode_reads(data: Any) -> list[Read]:
    """Return the point reads of a _lookup's JSON; raise ValueError if it is not that shape."""
    if not isinstance(data, list):
        raise ValueError("reads must be a list of [key, from, to, [partitions]]")
    reads: list[Read] = []
    for item in data:
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[3], list)):
            raise ValueError(f"read {item!r} is not [key, from, to, [partitions]]")
        key, lower, upper, partitions = item
        if not _is_key(key) or not all(_is_time(t) for t in (lower, upper)):
            raise ValueError(f"read {item!r}: the key is a string or an integer, from and to integers or null")
        if not all(type(p) is int and p >= 0 for p in partitions):
            raise ValueError(f"read {item!r}: partitions are integers from 0")
        reads.append(((key, lower, upper), tuple(partitions)))
    return reads


def _is_key(value: Any) -> bool:
    return type(value) in (str, int)


def _is_time(value: Any) -> bool:
    return value is None or type(value) is int


def encode_error(error: Exception) -> dict[str, Any]:
    """Return one failed read as JSON (an unexpected failure is logged and masked)."""
    found = api_error(error)
    if isinstance(found, ApiError):
        return {"error": {"message": found.message, "extensions": found.extensions}}
    log.error("unexpected error in a forwarded read", exc_info=error)
    return {"error": {"message": "internal error on the peer", "extensions": {"code": INTERNAL}}}


def decode_error(data: Mapping[str, Any]) -> ApiError:
    """Return the ApiError a peer reported."""
    extensions = dict(data.get("extensions") or {})
    code = str(extensions.pop("code", INTERNAL))
    return ApiError(str(data.get("message")), code, **extensions)


def _is_error(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "error" in value


def encode_state(value: Any) -> Any:
    """Return a lookup result as JSON: the state, windows as [key, start, end, state], or an error."""
    if isinstance(value, Exception):
        return encode_error(value)
    if isinstance(value, list) and value and isinstance(value[0], WindowedValue):
        return [encode_item(w) for w in value]
    return value


def decode_state(value: Any, windowed: bool) -> Any:
    """Return a lookup result from JSON (an ApiError in place of a failed read)."""
    if _is_error(value):
        return decode_error(value["error"])
    if windowed and value is not None:
        return [WindowedValue(k, s, e, v) for k, s, e, v in value]
    return value


def encode_item(item: Any) -> list[Any]:
    """Return one scan item as JSON: [key, state], [key, start, end, state] or [member, value, index key]."""
    if isinstance(item, WindowedValue):
        return [item.key, item.start, item.end, item.value]
    if isinstance(item, IndexEntry):
        return [item.member, item.value, base64.b64encode(item.index_key).decode("ascii")]
    key, state = item
    return [key, state]


def decode_item(item: list[Any], windowed: bool) -> Any:
    """Return one scan item from JSON."""
    if windowed:
        key, start, end, state = item
        return WindowedValue(key, start, end, state)
    if len(item) == 3:  # a ranking's index entry
        return IndexEntry(item[0], item[1], base64.b64decode(item[2]))
    return (item[0], item[1])


def _marks(answer: Answer[Any]) -> dict[str, Any]:
    marks: dict[str, Any] = {
        "positions": {str(p): o for p, o in answer.positions.items()},
        "lags": {str(p): lag for p, lag in answer.lags.items()},
    }
    if answer.kafka_away_since is not None:
        marks["kafkaAwaySince"] = answer.kafka_away_since
    return marks


def _read_marks(data: Mapping[str, Any]) -> tuple[dict[int, int], dict[int, int], float | None]:
    positions = {int(p): int(o) for p, o in (data.get("positions") or {}).items()}
    away = data.get("kafkaAwaySince")
    lags = {int(p): int(lag) for p, lag in (data.get("lags") or {}).items()}
    return positions, lags, None if away is None else float(away)


def encode_lookup(answer: Answer[list[Any]]) -> dict[str, Any]:
    """Return a _lookup answer as JSON."""
    return {"results": [encode_state(r) for r in answer.value], **_marks(answer)}


def decode_lookup(data: Mapping[str, Any], windowed: bool) -> Answer[list[Any]]:
    """Return a peer's _lookup answer."""
    return Answer([decode_state(r, windowed) for r in data["results"]], *_read_marks(data))


def encode_scan(answer: Answer[dict[int, Any]]) -> dict[str, Any]:
    """Return a _scan answer as JSON (a partition that failed: its error in place of its page)."""
    pages = {
        str(p): encode_error(page)
        if isinstance(page, Exception)
        else {"items": [encode_item(i) for i in page.items], "next": page.next_cursor}
        for p, page in answer.value.items()
    }
    return {"pages": pages, **_marks(answer)}


def decode_scan(data: Mapping[str, Any], windowed: bool) -> Answer[dict[int, Any]]:
    """Return a peer's _scan answer: per partition a Page, or an ApiError."""
    pages = {
        int(p): decode_error(page["error"])
        if _is_error(page)
        else Page([decode_item(i, windowed) for i in page["items"]], page["next"])
        for p, page in data["pages"].items()
    }
    return Answer(pages, *_read_marks(data))


def encode_count(answer: Answer[dict[int, Any]]) -> dict[str, Any]:
    """Return a _count answer as JSON: per partition a number, a key set (``{"digests"|"bloom": base64}``) or an
    error."""
    counts = {str(p): _encode_counted(n) for p, n in answer.value.items()}
    return {"counts": counts, **_marks(answer)}


def _encode_counted(n: Any) -> Any:
    if isinstance(n, Exception):
        return encode_error(n)
    if isinstance(n, KeyDigests):
        return {"digests": base64.b64encode(n.data).decode()}
    if isinstance(n, BloomBits):
        return {"bloom": base64.b64encode(n.data).decode()}
    return n


def decode_count(data: Mapping[str, Any]) -> Answer[dict[int, Any]]:
    """Return a peer's _count answer: per partition a count, a key set, or an ApiError."""
    counts = {int(p): _decode_counted(n) for p, n in data["counts"].items()}
    return Answer(counts, *_read_marks(data))


def _decode_counted(n: Any) -> Any:
    if _is_error(n):
        return decode_error(n["error"])
    if isinstance(n, dict) and "digests" in n:
        return KeyDigests(base64.b64decode(n["digests"]))
    if isinstance(n, dict) and "bloom" in n:
        return BloomBits(base64.b64decode(n["bloom"]))
    return int(n)


def encode_calls(calls: Sequence[tuple[Any, Sequence[int]]]) -> list[list[Any]]:
    """Return an owner-side field's (key, partitions) calls as JSON: [key, [partitions]]."""
    return [[key, list(partitions)] for key, partitions in calls]


def decode_calls(data: Any) -> list[tuple[Any, tuple[int, ...]]]:
    """Return the (key, partitions) calls of a _call's JSON; raise ValueError if it is not that shape."""
    if not isinstance(data, list):
        raise ValueError("keys must be a list of [key, [partitions]]")
    calls: list[tuple[Any, tuple[int, ...]]] = []
    for item in data:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], list)):
            raise ValueError(f"call {item!r} is not [key, [partitions]]")
        calls.append((item[0], tuple(int(p) for p in item[1])))
    return calls


class Owned(NamedTuple):
    """An owner's answer for one key of an owner-side field: its value (or the key's own error, e.g. INTERNAL,
    TIMEOUT) and whether the routing store holds the key in the partitions the owner read (``found``: with
    two candidate partitions, the caller keeps the answer of the one holding the key)."""

    found: bool
    value: Any


def encode_call_answer(answer: Answer[list[Any]]) -> dict[str, Any]:
    """Return a _call answer as JSON: [found, value], a key's own error with found, or a replica's error."""
    results: list[Any] = []
    for r in answer.value:
        if not isinstance(r, Owned):
            results.append(encode_error(r) if isinstance(r, Exception) else [False, r])
        elif isinstance(r.value, Exception):
            results.append({**encode_error(r.value), "found": r.found})
        else:
            results.append([r.found, r.value])
    return {"results": results, **_marks(answer)}


def decode_call_answer(data: Mapping[str, Any]) -> Answer[list[Any]]:
    """Return a peer's _call answer: per key an Owned (value or the key's error), or the replica's ApiError."""
    results: list[Any] = []
    for r in data["results"]:
        if not isinstance(r, dict):  # a value is boxed in a list: any object is an error
            results.append(Owned(bool(r[0]), r[1]))
        elif "found" in r:
            results.append(Owned(bool(r["found"]), decode_error(r["error"])))
        else:
            results.append(decode_error(r["error"]))
    return Answer(results, *_read_marks(data))


def decode_partition(p: Mapping[str, Any]) -> PartitionInfo:
    """Return one partition of a peer's node metadata (or of its /readyz body: the same names)."""
    return PartitionInfo(
        p["topic"],
        p["partition"],
        p["role"],
        p["state"],
        p["appliedOffset"],
        p["endOffset"],
        p.get("secondsSinceApplied") or 0.0,
        bool(p.get("stalled")),
    )


def decode_node(data: Mapping[str, Any]) -> NodeInfo:
    """Return a peer's node metadata (the NODE query's answer)."""
    partitions = tuple(decode_partition(p) for p in data.get("partitions") or [])
    pipeline = data.get("pipeline")
    return NodeInfo(
        data["id"],
        data["url"],
        data["state"],
        partitions,
        None
        if not pipeline
        else PipelineInfo(
            pipeline["state"],
            pipeline["restarts"],
            pipeline["deathsInARow"],
            pipeline["lastError"],
            pipeline["keepsDying"],
        ),
    )


def encode_json(data: object) -> bytes:
    """Return the JSON of a request or response body (orjson; json for what orjson refuses, e.g. huge ints)."""
    try:
        return orjson.dumps(data)
    except TypeError:
        return json.dumps(data, separators=(",", ":")).encode()


# -- a node's health ----------------------------------------------------------------------------------------


class KafkaReach(Protocol):
    """What a node knows of Kafka (``streaming.kafka_watch.KafkaStatus``)."""

    @property
    def reachable(self) -> bool: ...

    @property
    def unreachable_since(self) -> float | None: ...


def encode_ready(
    ready: bool, state: str, node_id: str, info: NodeInfo | None, kafka: KafkaReach | None = None
) -> dict[str, Any]:
    """Return the body of READY_PATH: readiness, the node's state, its pipeline, its partitions and Kafka's reach."""
    return {
        "ready": ready,
        "state": state,
        "node": node_id,
        "pipeline": None if info is None or info.pipeline is None else encode_pipeline(info.pipeline),
        "partitions": [] if info is None else [encode_partition(p) for p in info.partitions],
        "kafka": None if kafka is None else encode_kafka(kafka),
    }


def encode_kafka(kafka: KafkaReach) -> dict[str, Any]:
    """Return whether Kafka answers and since when it does not, as READY_PATH shows it (ISO 8601 UTC, unix)."""
    since = kafka.unreachable_since
    return {
        "reachable": kafka.reachable,
        "unreachableSince": None if since is None else datetime.fromtimestamp(since, UTC).isoformat(timespec="seconds"),
        "unreachableSinceSeconds": since,
    }


def encode_partition(p: PartitionInfo) -> dict[str, Any]:
    """Return one hosted partition as READY_PATH shows it (``decode_partition``'s names)."""
    return {
        "topic": p.topic,
        "partition": p.partition,
        "role": p.role,
        "state": p.state,
        "appliedOffset": p.applied_offset,
        "endOffset": p.end_offset,
        "lag": p.lag,
        "secondsSinceApplied": round(p.seconds_since_applied, 3),
        "stalled": p.stalled,
    }


def encode_pipeline(pipeline: PipelineInfo) -> dict[str, Any]:
    """Return the node's streaming pipeline as READY_PATH shows it."""
    return {
        "state": pipeline.state,
        "restarts": pipeline.restarts,
        "deathsInARow": pipeline.deaths_in_a_row,
        "keepsDying": pipeline.keeps_dying,
        "lastError": pipeline.last_error,
    }
