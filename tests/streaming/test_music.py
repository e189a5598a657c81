"""The music example through real Spark and the production query path: plays joined with the global songs
table, counted, and ranked per genre and over all in the same transaction; the charts equal a Python sort of
the ground truth, in two rounds (counts rise between them) and after a restart that re-applies nothing."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from iqgraph.examples.music import build_app, catalogue
from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import App
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from iqgraph.streaming.value_types import value_types
from tests.conftest import MakeTopic
from tests.schema.conftest import Api, RecordingQueries
from tests.support.pipeline import START_MS
from tests.support.queries import single_node

SEED = 11
CHART = "query($g: String) { topSongs { top(group: $g, first: 5) { member value rank song { title genre } } } }"


def _send(broker: KafkaBroker, app: App, events: list[Any]) -> None:
    by_topic: dict[str, list[tuple[bytes, bytes | None, None]]] = {}
    for event in events:
        topic, key, value = app.addressed(event)
        by_topic.setdefault(topic.name, []).append((str(key).encode(), orjson.dumps(value), None))
    for topic, records in by_topic.items():
        produce(broker.bootstrap_servers, topic, records)


def _chart(plays: Counter[str], genre: str | None, songs: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    kept = [(s, n) for s, n in plays.items() if genre is None or songs[s]["genre"] == genre]
    top = sorted(kept, key=lambda sn: (-sn[1], sn[0]))[:5]
    return [
        {"member": s, "value": n, "rank": i, "song": {"title": songs[s]["title"], "genre": songs[s]["genre"]}}
        for i, (s, n) in enumerate(top, start=1)
    ]


async def _assert_charts(api: Api, plays: Counter[str], songs: dict[str, dict[str, str]]) -> None:
    for genre in [*sorted({s["genre"] for s in songs.values()}), None]:
        data = await api.data(CHART, {"g": genre})
        assert data["topSongs"]["top"] == _chart(plays, genre, songs), genre


async def _assert_listeners_and_trends(api: Api, plays: list[Any]) -> None:
    """Each listener's last 10 plays by time; distinct listeners per song within the sketch's error; the trend
    field answers from the owner's stores."""
    by_user: dict[str, list[dict[str, Any]]] = {}
    listeners: dict[str, set[str]] = {}
    for _, song, play in plays:
        by_user.setdefault(play["user"], []).append(play)
        listeners.setdefault(song, set()).add(play["user"])
    users = sorted(by_user)[:20]
    query = "query($u: [String!]!) { lastPlays { getMany(keys: $u) { songId seconds } } }"
    found = (await api.data(query, {"u": users}))["lastPlays"]["getMany"]
    for user, last in zip(users, found, strict=True):
        expected = sorted(by_user[user], key=lambda p: p["ts"])[-10:]
        assert last == [{"songId": p["song_id"], "seconds": p["seconds"]} for p in expected], user
    songs = sorted(listeners)
    query = "query($s: [String!]!) { listeners { getMany(keys: $s) } songTrendMany(keys: $s) { plays listeners } }"
    data = await api.data(query, {"s": songs})
    plays_of = Counter(song for _, song, _ in plays)
    for song, estimate, trend in zip(songs, data["listeners"]["getMany"], data["songTrendMany"], strict=True):
        assert abs(estimate - len(listeners[song])) <= max(2, 0.05 * len(listeners[song])), song
        assert trend == {"plays": plays_of[song], "listeners": estimate}, song


async def test_the_charts_equal_the_ground_truth_as_plays_arrive_and_after_a_restart(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    plays_topic, songs_topic = make_topic(2, prefix="plays"), make_topic(2, prefix="songs")
    app = build_app(plays_topic, songs_topic, partitions=2)
    songs = catalogue(SEED)
    events = list(itertools.islice(app.generator(SEED, START_MS), len(songs) + 4_000))
    first, second = events[: len(songs) + 2_500], events[len(songs) + 2_500 :]
    _send(broker, app, first)
    settings = RunnerSettings(broker.bootstrap_servers)
    assignment = {plays_topic: [0, 1], songs_topic: [0, 1]}
    types = value_types(app, spark)
    runner = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "music"), settings)
    try:
        runner.start(assignment)
        runner.wait_until_caught_up(timeout=180)
        played = Counter(key for topic, key, _ in first[len(songs) :])
        api = Api(app, single_node(app, types, runner.partitions, cls=RecordingQueries))
        await _assert_charts(api, played, songs)
        await _assert_listeners_and_trends(api, first[len(songs) :])
        _send(broker, app, second)
        runner.wait_until_caught_up(timeout=120)
        played.update(key for topic, key, _ in second)
        await _assert_charts(api, played, songs)
    finally:
        runner.stop()
    again = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "music"), settings)
    try:
        again.start(assignment)
        again.wait_until_caught_up(timeout=180)
        await _assert_charts(Api(app, single_node(app, types, again.partitions, cls=RecordingQueries)), played, songs)
    finally:
        again.stop()
