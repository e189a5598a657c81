"""The live streams between nodes: what a follow or changes request sends, and the events that answer it.

Live sources between nodes are signed POSTs answered with Server-Sent Events (``FOLLOW_PATH``: a relay's
upstream, ``app.live.relay``; ``CHANGES_PATH``: a store's change counts), a comment every ``HEARTBEAT_S``;
a failure is one ``error`` event, then the end of the stream:

    follow request {"topic": t, "interest": {store: {"<p>": [key, …]}}, "after": {"<p>": offset},
                    "windowFrom": {store: ms | null}, "standby": bool}
    rows event     data: {"p": partition, "o": position, "s": snapshot, "l": lag | null,
                          "r": [[store, key, window start | null, state, dropped, key position | null], …]}
    changes        request {"store": s}; event data: {"n": keys changed}
    error event    data: {"error": {"message": …, "extensions": {"code": …}}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from iqgraph.schema.errors import BAD_REQUEST, ApiError
from iqgraph.schema.wire import encode_error, encode_json
from iqgraph.stores import Key

#: Per store, per partition, the keys followed.
Interest = Mapping[str, Mapping[int, Sequence[Key]]]
#: One key's state in one event: (store, key, window start or None, state, states conflated before it, position: the
#: offset of the record that changed it — -1 for a key never written, None when not known; ``stores.positions``).
Row = tuple[str, Key, int | None, Any, int, int | None]


@dataclass(frozen=True)
class Rows:
    """What a source sends of one partition: a snapshot read at position, or one batch's changes."""

    partition: int
    position: int  # the partition's position once these rows are applied (a batch's next offset)
    rows: list[Row]
    snapshot: bool
    lag: int | None = None  # records the copy that read them is behind its partition's end (a standby's)


def encode_follow(
    topic: str, interest: Interest, after: Mapping[int, int], window_from: Mapping[str, int | None], standby: bool
) -> bytes:
    """Return the body of a follow request."""
    return encode_json(
        {
            "topic": topic,
            "interest": {s: {str(p): list(keys) for p, keys in ps.items()} for s, ps in interest.items()},
            "after": {str(p): o for p, o in after.items()},
            "windowFrom": dict(window_from),
            "standby": standby,
        }
    )


def decode_follow(body: bytes) -> tuple[str, Interest, dict[int, int], dict[str, int | None], bool]:
    """Return a follow request's (topic, interest, after, window_from, standby); BAD_REQUEST if malformed."""
    try:
        data = orjson.loads(body)
        topic, standby = data["topic"], data["standby"]
        interest = {str(s): {int(p): list(keys) for p, keys in ps.items()} for s, ps in data["interest"].items()}
        after = {int(p): int(o) for p, o in data["after"].items()}
        window_from = {str(s): None if v is None else int(v) for s, v in data["windowFrom"].items()}
        valid = isinstance(topic, str) and isinstance(standby, bool)
        valid = valid and all(isinstance(k, str | int) for ps in interest.values() for ks in ps.values() for k in ks)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ApiError(f"not a follow request this API sends: {exc}", BAD_REQUEST) from None
    if not valid or any(p < 0 for ps in interest.values() for p in ps) or any(o < 0 for o in after.values()):
        raise ApiError("not a follow request this API sends", BAD_REQUEST)
    return topic, interest, after, window_from, standby


def encode_changes(store: str) -> bytes:
    """Return the body of a changes request."""
    return encode_json({"store": store})


def decode_changes(body: bytes) -> str:
    """Return the store a changes request names; BAD_REQUEST if malformed."""
    try:
        store = orjson.loads(body)["store"]
    except (ValueError, TypeError, KeyError):
        store = None
    if not isinstance(store, str):
        raise ApiError("not a changes request this API sends", BAD_REQUEST)
    return store


def _event(data: Any) -> bytes:
    return b"data: " + encode_json(data) + b"\n\n"


def encode_rows(rows: Rows) -> bytes:
    """Return one event of rows."""
    return _event({"p": rows.partition, "o": rows.position, "s": rows.snapshot, "l": rows.lag, "r": rows.rows})


def decode_rows(data: Mapping[str, Any]) -> Rows:
    """Return the rows of one event's data."""
    rows = [(r[0], r[1], r[2], r[3], r[4], r[5] if len(r) > 5 else None) for r in data["r"]]  # an older peer: none
    return Rows(data["p"], data["o"], rows, data["s"], data["l"])


def encode_changed(n: int) -> bytes:
    """Return one event of a changes stream: how many keys a batch changed."""
    return _event({"n": n})


def encode_failure(error: Exception) -> bytes:
    """Return the event that ends a stream with error."""
    return _event(encode_error(error))
