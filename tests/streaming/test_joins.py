"""Enrichment joins at ingest: plays joined with a global songs table (inner, on a column) and a co-partitioned
profiles table (left, on the record key); table updates seen by later batches, never by applied ones."""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import (
    App,
    DefinitionError,
    Join,
    Topic,
    count,
    key_value_store,
    latest,
    table_store,
)
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from iqgraph.streaming.value_types import value_types
from tests.conftest import MakeTopic

SONGS = [f"s-{i}" for i in range(20)]
USERS = [f"u-{i}" for i in range(15)]
GENRES = ["jazz", "rock", "folk"]


def music_app(plays: str, songs: str, profiles: str) -> App:
    return App(
        name="music",
        topics=[
            Topic(plays, schema="song_id STRING, ms LONG", event_time="ms", partitions=2),
            Topic(songs, schema="title STRING, genre STRING", partitions=2, table=True, global_table=True),
            Topic(profiles, schema="city STRING", partitions=2, table=True),
        ],
        stores=[
            table_store("songs", songs),
            table_store("profiles", profiles),
            key_value_store("plays_per_genre", plays, count(), key="genre", join=Join("songs", on="song_id")),
            key_value_store(
                "last_play", plays, latest("song_id", "city"), join=Join("profiles", how="left")
            ),  # keyed by user
        ],
    )


def _send(broker: KafkaBroker, topic: str, records: list[tuple[str, Any]]) -> None:
    produce(
        broker.bootstrap_servers,
        topic,
        [(k.encode(), None if v is None else orjson.dumps(v), None) for k, v in records],
    )


def _plays(rng: random.Random, n: int, start: int) -> list[tuple[str, dict[str, Any]]]:
    return [(rng.choice(USERS), {"song_id": rng.choice(SONGS), "ms": start + i}) for i in range(n)]


def _genres(runner: StreamRunner, topic: str) -> dict[str, int]:
    found: Counter[str] = Counter()
    for stores in runner.partitions[topic].values():  # keyed by a column: each partition counts its own plays
        found.update(dict(stores.kv("plays_per_genre").all(limit=1000).items))
    return dict(found)


def test_plays_are_enriched_with_the_table_as_of_their_batch(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    plays, songs, profiles = make_topic(2, prefix="plays"), make_topic(2, prefix="songs"), make_topic(2, prefix="prof")
    app = music_app(plays, songs, profiles)
    assert value_types(app, spark)["last_play"].simpleString() == "struct<song_id:string,city:string>"
    rng = random.Random(4)
    genre = {s: rng.choice(GENRES) for s in SONGS}
    _send(broker, songs, [(s, {"title": s.upper(), "genre": g}) for s, g in genre.items()])
    del genre["s-19"]  # a song deleted before any play: inner join drops its plays
    _send(broker, songs, [("s-19", None)])
    cities = {u: rng.choice(["Oslo", "Lima"]) for u in USERS[:10]}  # users 10..14 have no profile: left join
    _send(broker, profiles, [(u, {"city": c}) for u, c in cities.items()])
    first = _plays(rng, 300, 0)
    _send(broker, plays, first)

    settings = RunnerSettings(broker.bootstrap_servers)
    runner = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "music"), settings)
    try:
        runner.start({plays: [0, 1], songs: [0, 1], profiles: [0, 1]})
        runner.wait_until_caught_up(timeout=180)
        expected = Counter(genre[v["song_id"]] for _, v in first if v["song_id"] in genre)
        assert _genres(runner, plays) == dict(expected)
        last: dict[str, Any] = {}
        for user, play in first:
            last[user] = {"song_id": play["song_id"], **({"city": cities[user]} if user in cities else {})}
        found: dict[str, Any] = {}
        for stores in runner.partitions[plays].values():
            for key, value in stores.kv("last_play").all(limit=1000).items:
                found[key] = {c: x for c, x in value.items() if x is not None}
        assert found == last

        # the table changes; once applied, later plays see the new genre, and applied counts stay put
        moved = SONGS[:5]
        _send(broker, songs, [(s, {"title": s, "genre": "pop"}) for s in moved])
        runner.wait_until_caught_up(timeout=120)
        second = _plays(rng, 200, 10_000)
        _send(broker, plays, second)
        runner.wait_until_caught_up(timeout=120)
        genre.update({s: "pop" for s in moved})
        expected += Counter(genre[v["song_id"]] for _, v in second if v["song_id"] in genre)
        assert _genres(runner, plays) == dict(expected)

        # table updates racing plays: every play is counted once, under a genre its song had at some time
        before = sum(expected.values())
        third = [p for p in _plays(rng, 300, 20_000) if p[1]["song_id"] != "s-19"]
        racer = threading.Thread(target=_send, args=(broker, songs, [(s, {"genre": "folk"}) for s in SONGS[5:12]]))
        racer.start()
        _send(broker, plays, third)
        racer.join()
        runner.wait_until_caught_up(timeout=120)
        counts = _genres(runner, plays)
        assert sum(counts.values()) == before + len(third)
        assert set(counts) <= {*GENRES, "pop"}
    finally:
        runner.stop()
    # a restart re-applies nothing: the joined counts stay exactly as they were
    again = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "music"), settings)
    try:
        again.start({plays: [0, 1], songs: [0, 1], profiles: [0, 1]})
        again.wait_until_caught_up(timeout=180)
        assert _genres(again, plays) == counts
    finally:
        again.stop()


def test_joins_that_cannot_run_fail_at_load_with_one_line() -> None:
    topics = [
        Topic("plays", schema="song_id STRING", partitions=2),
        Topic("songs", schema="genre STRING", partitions=3, table=True),
    ]
    table = table_store("songs", "songs")
    with pytest.raises(DefinitionError, match="on column 'song_id': a join on a column needs a global table"):
        App("m", topics, [table, key_value_store("n", "plays", count(), join=Join("songs", on="song_id"))])
    with pytest.raises(DefinitionError, match="must be co-partitioned — the same partitions"):
        App("m", topics, [table, key_value_store("n", "plays", count(), join=Join("songs"))])
    with pytest.raises(DefinitionError, match="joins 'nope', which is not a table store"):
        App("m", topics, [table, key_value_store("n", "plays", count(), join=Join("nope"))])
    longs = [topics[0], Topic("songs", schema="genre STRING", partitions=2, table=True, key_format="long")]
    with pytest.raises(DefinitionError, match=r"key format \(string vs long\)"):
        App("m", longs, [table, key_value_store("n", "plays", count(), join=Join("songs"))])
    with pytest.raises(DefinitionError, match="a table topic feeds only table_store.*no join"):
        App("m", topics, [table, key_value_store("t", "songs", latest(), join=Join("songs"))])
    with pytest.raises(DefinitionError, match="store 's' reads topic 'nowhere', which the app lacks"):
        App("m", topics, [key_value_store("n", "plays", count(), join=Join("songs")), table_store("s", "nowhere")])


def test_a_join_on_a_column_the_records_lack_fails_at_load_naming_it(spark: Any) -> None:
    app = App(
        "m",
        [
            Topic("plays", schema="song_id STRING", partitions=2),
            Topic("songs", schema="genre STRING", partitions=2, table=True, global_table=True),
        ],
        [table_store("songs", "songs"), key_value_store("n", "plays", count(), join=Join("songs", on="song"))],
    )
    with pytest.raises(DefinitionError, match="store 'n' joins 'songs' on column 'song', which its records lack"):
        value_types(app, spark)
    songs = Topic("songs", schema="genre STRING", partitions=2, table=True, global_table=True)
    plays = Topic("plays", schema="song_id DOUBLE, user STRING", partitions=2)
    by_double = key_value_store("n", "plays", count(), join=Join("songs", on="song_id"))
    with pytest.raises(DefinitionError, match="on column 'song_id' of type double: a table's keys are strings"):
        value_types(App("m", [plays, songs], [table_store("songs", "songs"), by_double]), spark)
    left = key_value_store("n", "plays", count(), key="genre", join=Join("songs", on="user", how="left"))
    with pytest.raises(DefinitionError, match="keyed by 'genre', a column of table 'songs', with a left join"):
        value_types(App("m", [plays, songs], [table_store("songs", "songs"), left]), spark)
