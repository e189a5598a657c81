"""A plays app with bounded collections and user aggregations, its value types, its ground truth in Python, and
its stores read back through the query path and compared with that truth.

Shared by the pipeline test (Spark), the crash test and the schema test (no Spark: the types built by hand
here are checked against what streaming.value_types derives, in the pipeline test).
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pyspark.sql.types import ArrayType, DataType, DoubleType, LongType, StringType, StructField, StructType

from iqgraph import App, Topic, aggregate, collect, key_value_store, tumbling, window_store
from iqgraph.streaming.partitioner import partition_for
from iqgraph.streaming.sketches import histogram, hyperloglog
from tests.support.queries import single_node

SCHEMA = "user STRING, song STRING, ms DOUBLE, ts LONG"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000
BOUNDS = [10, 100]
Play = tuple[str, dict[str, Any]]


def plays_app(topic: str, partitions: int) -> App:
    """Return the app: last plays per user, first listeners and distinct listeners per song, latency buckets."""
    return App(
        name="plays",
        topics=[Topic(topic, schema=SCHEMA, event_time="ts", partitions=partitions)],
        stores=[
            key_value_store("last_plays", topic, collect("song", "ts", max_items=4, order_by="ts")),
            key_value_store(
                "first_listeners", topic, collect("user", max_items=3, order_by="ts", keep="first"), key="song"
            ),
            key_value_store("listeners", topic, aggregate(hyperloglog("user")), key="song"),
            window_store(
                "latency",
                topic,
                aggregate(histogram("ms", BOUNDS)),
                tumbling(minutes=60, grace_seconds=7200),
                transform=lambda frame: frame.where(frame.ms >= 0),  # a store with its own rows (narrow path)
            ),
        ],
    )


def _struct(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, data_type, True) for name, data_type in fields])


BUCKET = _struct(("low", DoubleType()), ("high", DoubleType()), ("count", LongType()))
TYPES: dict[str, DataType] = {
    "last_plays": ArrayType(_struct(("song", StringType()), ("ts", LongType())), False),
    "first_listeners": ArrayType(_struct(("user", StringType())), False),
    "listeners": LongType(),
    "latency": ArrayType(BUCKET, True),
}


def make_plays(seed: int, n: int, users: int = 40, songs: int = 12) -> list[Play]:
    """Return n plays keyed by user, event times coarse (ties) and out of order."""
    rng = random.Random(seed)
    plays = []
    for _ in range(n):
        user = f"user-{rng.randrange(users):02d}"
        ms = rng.choice([-1.0, 5.0, 10.0, 50.0, 150.0])
        plays.append((user, {"user": user, "song": f"song-{rng.randrange(songs)}", "ms": ms, "ts": _ts(rng)}))
    return plays


def _ts(rng: random.Random) -> int:
    return START_MS + rng.randrange(30) * 60_000 + rng.choice([0, 0, HOUR])


def truth(plays: Sequence[Play], partitions: int) -> dict[str, dict[Any, Any]]:
    """Return each store's expected values by key (latency by (user, hour start)), from plays in produce order."""
    offsets: dict[int, int] = defaultdict(int)
    ranked: list[tuple[int, int, int, dict[str, Any]]] = []
    for user, play in plays:
        p = partition_for(user, partitions, "string", "murmur2")
        ranked.append((play["ts"], p, offsets[p], play))
        offsets[p] += 1
    ranked.sort(key=lambda item: item[:3])
    last: dict[str, list[Any]] = defaultdict(list)
    first: dict[str, list[Any]] = defaultdict(list)
    distinct: dict[str, set[str]] = defaultdict(set)
    buckets: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    for *_, play in ranked:
        last[play["user"]] = [*last[play["user"]], {"song": play["song"], "ts": play["ts"]}][-4:]
        if len(first[play["song"]]) < 3:
            first[play["song"]].append({"user": play["user"]})
        distinct[play["song"]].add(play["user"])
        if play["ms"] >= 0:
            bucket = sum(play["ms"] >= b for b in BOUNDS)
            buckets[play["user"], play["ts"] // HOUR * HOUR][bucket] += 1
    edges = [None, *BOUNDS, None]
    latency = {
        k: [{"low": edges[i], "high": edges[i + 1], "count": n} for i, n in enumerate(counts)]
        for k, counts in buckets.items()
    }
    exact = {song: len(users) for song, users in distinct.items()}
    return {"last_plays": dict(last), "first_listeners": dict(first), "listeners": exact, "latency": latency}


def read_plays(app: App, hosted: Any) -> dict[str, dict[Any, Any]]:
    """Return every store's values by key, read through the production query path."""
    queries = single_node(app, TYPES, hosted)
    users = sorted({f"user-{i:02d}" for i in range(40)})
    songs = [f"song-{i}" for i in range(12)]
    found: dict[str, dict[Any, Any]] = {}
    for name, keys in (("last_plays", users), ("first_listeners", songs), ("listeners", songs)):
        values = asyncio.run(queries.get_many(name, keys))
        found[name] = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
    requests = [(user, START_MS, START_MS + HOUR) for user in users]
    windows = asyncio.run(queries.fetch_many("latency", requests))
    found["latency"] = {(w.key, w.start): w.value for per_user in windows for w in per_user}
    return found


def assert_plays_equal(found: dict[str, dict[Any, Any]], expected: dict[str, dict[Any, Any]]) -> None:
    """Assert the stores equal the ground truth; the sketch within its error bound."""
    for name in ("last_plays", "first_listeners", "latency"):
        assert found[name] == expected[name], name
    assert found["listeners"].keys() == expected["listeners"].keys()
    for song, exact in expected["listeners"].items():
        assert abs(found["listeners"][song] - exact) <= max(1, 0.05 * exact), song
