"""Rankings through the sink and the production query path: top N per group and among all, values that rise
and fall, ties, pages with ranks that continue, merged over every partition; bad rankings refused at load."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql.types import DoubleType, LongType

from iqgraph.schema import wire
from iqgraph.schema.types import Answer
from iqgraph.stores import IndexEntry, Page, PartitionState
from iqgraph.streaming.definitions import (
    App,
    DefinitionError,
    Entity,
    Topic,
    count,
    key_value_store,
    latest,
    max_,
    ranking_store,
    sum_,
)
from iqgraph.streaming.sink import PartitionBatch, StoreSink
from iqgraph.streaming.user_aggregations import UserAggregation, aggregate
from iqgraph.streaming.value_types import value_types
from tests.schema.conftest import Api, Hosted, RecordingQueries, close_hosted, open_hosted
from tests.support.apps import PARTITIONS, shop_partition
from tests.support.queries import rest_client, single_node

TOPIC = "plays"
GENRES = ("jazz", "rock", "pop")
PAGE = (
    "query($g: String, $n: Int, $a: String) "
    "{ %s { top(group: $g, first: $n, after: $a) { member value rank cursor } } }"
)
QUERY = PAGE % "topSongs"


def charts_app() -> App:
    plays = key_value_store("song_plays", TOPIC, count())
    seconds = key_value_store("song_seconds", TOPIC, sum_("seconds"))
    return App(
        "charts",
        [Topic(TOPIC, schema="genre STRING, seconds LONG", partitions=PARTITIONS)],
        [
            plays,
            seconds,
            ranking_store("top_songs", plays, group="genre"),
            ranking_store("top_seconds", seconds, description="Songs by seconds listened, over every genre"),
        ],
    )


TYPES = {name: LongType() for name in ("song_plays", "song_seconds", "top_songs", "top_seconds")}


class Truth:
    """What the stores should hold: plays and seconds per song, each song's latest genre."""

    def __init__(self) -> None:
        self.plays: dict[str, int] = {}
        self.seconds: dict[str, int] = {}
        self.genre: dict[str, str] = {}

    def top(self, values: dict[str, int], genre: str | None) -> list[tuple[str, int]]:
        kept = [(s, v) for s, v in values.items() if genre is None or self.genre[s] == genre]
        return sorted(kept, key=lambda sv: (-sv[1], sv[0]))


def play_batches(seed: int, batches: int, songs: int = 40) -> Iterator[list[tuple[str, str, int]]]:
    """Yield batches of plays (song, genre, seconds): seconds may be negative (corrections: sums fall);
    a song's genre may change (it moves between groups); plays tie often."""
    rng = random.Random(seed)
    genre = {f"song-{i:02d}": rng.choice(GENRES) for i in range(songs)}
    for _ in range(batches):
        batch = []
        for _ in range(rng.randint(5, 60)):
            song = f"song-{rng.randrange(songs):02d}"
            if rng.random() < 0.05:
                genre[song] = rng.choice(GENRES)
            batch.append((song, genre[song], rng.choice([30, 60, 180, -200])))
        yield batch


def apply(sink: StoreSink, plays: list[tuple[str, str, int]], offsets: dict[int, int]) -> None:
    """Apply one batch of plays through the sink, as Spark's partials would bring it."""
    batches: dict[int, PartitionBatch] = {}
    by_song: dict[str, list[tuple[str, int]]] = {}
    for song, genre, seconds in plays:
        by_song.setdefault(song, []).append((genre, seconds))
    for song, rows in by_song.items():
        p = shop_partition(song)
        batch = batches.setdefault(p, PartitionBatch())
        batch.partials["song_plays"].append((song, None, len(rows), len(rows)))
        batch.partials["song_seconds"].append((song, None, sum(s for _, s in rows), len(rows)))
        batch.partials["top_songs"].append((song, None, {"genre": rows[-1][0]}, len(rows)))
        batch.partials["top_seconds"].append((song, None, None, len(rows)))
        count_ = len(rows)
        batch.first_offset = offsets[p] if batch.first_offset < 0 else batch.first_offset
        batch.last_offset = batch.first_offset + count_ - 1 if batch.last_offset < 0 else batch.last_offset + count_
    for p, batch in batches.items():
        offsets[p] = batch.last_offset + 1
    sink.apply(batches)


@pytest.fixture
def charts(tmp_path: Path) -> Iterator[tuple[Api, Truth]]:
    app = charts_app()
    hosted: Hosted = open_hosted(tmp_path / "charts", app, TOPIC)
    for stores in hosted[TOPIC].values():
        stores.db.set_state(PartitionState.RUNNING)
    sink = StoreSink(app, app.topic(TOPIC), hosted[TOPIC])
    truth, offsets = Truth(), dict.fromkeys(range(PARTITIONS), 0)
    for plays in play_batches(7, 12):
        apply(sink, plays, offsets)
        for song, genre, seconds in plays:
            truth.plays[song] = truth.plays.get(song, 0) + 1
            truth.seconds[song] = truth.seconds.get(song, 0) + seconds
            truth.genre[song] = genre
    try:
        yield Api(app, single_node(app, TYPES, hosted, cls=RecordingQueries)), truth
    finally:
        close_hosted(hosted)


async def _all_pages(api: Api, field: str, group: str | None, size: int) -> list[dict[str, Any]]:
    query = PAGE
    seen: list[dict[str, Any]] = []
    after = None
    while True:
        page = (await api.data(query % field, {"g": group, "n": size, "a": after}))[field]["top"]
        seen += page
        if len(page) < size:
            return seen
        after = page[-1]["cursor"]


@pytest.mark.parametrize("genre", [*GENRES, None])
async def test_top_per_group_and_among_all_equals_a_sort_of_the_ground_truth(
    charts: tuple[Api, Truth], genre: str | None
) -> None:
    api, truth = charts
    expected = truth.top(truth.plays, genre)
    first5 = (await api.data(QUERY, {"g": genre, "n": 5}))["topSongs"]["top"]
    assert [(e["member"], e["value"], e["rank"]) for e in first5] == [
        (s, v, i) for i, (s, v) in enumerate(expected[:5], start=1)
    ]
    paged = await _all_pages(api, "topSongs", genre, 3)
    assert [(e["member"], e["value"], e["rank"]) for e in paged] == [
        (s, v, i) for i, (s, v) in enumerate(expected, start=1)
    ]


async def test_values_that_fall_are_ranked_where_they_are_now(charts: tuple[Api, Truth]) -> None:
    api, truth = charts
    assert any(v < 0 for v in truth.seconds.values())  # corrections took some sums below zero
    paged = await _all_pages(api, "topSeconds", None, 7)
    assert [(e["member"], e["value"]) for e in paged] == truth.top(truth.seconds, None)


async def test_ties_are_ordered_by_member_and_counts_are_the_members(charts: tuple[Api, Truth]) -> None:
    api, truth = charts
    values = list(truth.plays.values())
    assert len(values) > len(set(values))  # the data has ties
    everything = await _all_pages(api, "topSongs", None, 100)
    for a, b in zip(everything, everything[1:], strict=False):
        assert (-a["value"], a["member"]) < (-b["value"], b["member"])
    data = await api.data("{ topSongs { count } topSeconds { count } }")
    assert data == {"topSongs": {"count": len(truth.plays)}, "topSeconds": {"count": len(truth.plays)}}


async def test_a_cursor_of_another_group_is_one_invalid_cursor_error(charts: tuple[Api, Truth]) -> None:
    api, _ = charts
    jazz = (await api.data(QUERY, {"g": "jazz", "n": 2}))["topSongs"]["top"]
    errors = await api.errors(QUERY, {"g": "rock", "n": 2, "a": jazz[-1]["cursor"]})
    assert [e["extensions"]["code"] for e in errors] == ["INVALID_CURSOR"]
    errors = await api.errors(QUERY, {"g": "rock", "n": 2, "a": "not-a-cursor"})
    assert [e["extensions"]["code"] for e in errors] == ["INVALID_CURSOR"]
    seconds = (await api.data(PAGE % "topSeconds", {"g": None, "n": 2}))["topSeconds"]["top"]
    errors = await api.errors(QUERY, {"g": None, "n": 2, "a": seconds[-1]["cursor"]})  # another field's
    assert [e["extensions"]["code"] for e in errors] == ["INVALID_CURSOR"]


def _mean() -> UserAggregation:
    """A mean over column x whose finalize raises for a key whose records all had no x."""
    return UserAggregation(
        "mean",
        lambda: [0, 0],
        lambda s, row: s if row["x"] is None else [s[0] + row["x"], s[1] + 1],
        lambda a, b: [a[0] + b[0], a[1] + b[1]],
        lambda s: s[0] / s[1],
        "double",
        columns=("x",),
    )


async def test_a_value_whose_finalize_raises_is_unranked_and_that_key_alone_answers_internal(tmp_path: Path) -> None:
    means = key_value_store("means", TOPIC, aggregate(_mean()))
    app = App("means", [Topic(TOPIC, schema="x DOUBLE", partitions=PARTITIONS)], [means, ranking_store("top", means)])
    hosted: Hosted = open_hosted(tmp_path / "means", app, TOPIC)
    for stores in hosted[TOPIC].values():
        stores.db.set_state(PartitionState.RUNNING)
    try:
        batches: dict[int, PartitionBatch] = {}
        for key, state in (("a", [6.0, 2]), ("b", [0, 0]), ("c", [9.0, 1])):
            batch = batches.setdefault(shop_partition(key), PartitionBatch())
            batch.partials["means"].append((key, None, state, 1))
            batch.partials["top"].append((key, None, None, 1))
            batch.first_offset = 0
            batch.last_offset = len(batch.partials["means"]) - 1
        sink = StoreSink(app, app.topic(TOPIC), hosted[TOPIC])
        sink.apply(batches)  # "b" cannot finalize: the batch still applies
        assert sum(s.db.next_offset() for s in hosted[TOPIC].values()) == 3
        types = {"means": DoubleType(), "top": DoubleType()}
        api = Api(app, single_node(app, types, hosted, cls=RecordingQueries))
        top = (await api.data("{ top { top { member value rank } } }"))["top"]["top"]
        assert top == [{"member": "c", "value": 9.0, "rank": 1}, {"member": "a", "value": 3.0, "rank": 2}]
        result = await api.run('{ means { getMany(keys: ["a", "b", "c"]) } }')
        assert result.data == {"means": {"getMany": [3.0, None, 9.0]}}
        assert [(e.path, e.extensions["code"]) for e in result.errors or []] == [(["means", "getMany", 1], "INTERNAL")]
        # a user aggregation's value falls: c's mean goes from 9 to 2, below a's 3
        p = shop_partition("c")
        later = PartitionBatch(first_offset=hosted[TOPIC][p].db.next_offset())
        later.last_offset = later.first_offset
        later.partials["means"].append(("c", None, [-3.0, 2], 1))
        later.partials["top"].append(("c", None, None, 1))
        sink.apply({p: later})
        fallen = (await api.data("{ top { top { member value rank } } }"))["top"]["top"]
        assert fallen == [{"member": "a", "value": 3.0, "rank": 1}, {"member": "c", "value": 2.0, "rank": 2}]
    finally:
        close_hosted(hosted)


def test_rankings_of_decimals_missing_groups_and_sums_of_strings_fail_at_load(spark: Any) -> None:
    topic = Topic(TOPIC, schema="title STRING, price DECIMAL(10,2)")
    titles = key_value_store("titles", TOPIC, max_("title"))
    with pytest.raises(DefinitionError, match="max needs a numeric column; 'title' is string"):
        value_types(App("bad", [topic], [titles]), spark)
    plays = key_value_store("plays", TOPIC, count())
    with pytest.raises(DefinitionError, match=r"'top'.*\['genre'\], which its records lack"):
        value_types(App("bad", [topic], [plays, ranking_store("top", plays, group="genre")]), spark)
    money = UserAggregation("money", lambda: 0, lambda s, r: s, lambda a, b: a + b, lambda s: s, "decimal(10,2)")
    revenue = key_value_store("revenue", TOPIC, aggregate(money, "price"))
    with pytest.raises(DefinitionError, match="whose values are decimal.*rank integers or doubles"):
        value_types(App("bad", [topic], [revenue, ranking_store("top", revenue)]), spark)


def test_rankings_that_cannot_be_kept_fail_at_load_with_one_line() -> None:
    topic = Topic(TOPIC, schema="genre STRING, seconds LONG, user STRING")
    by_user = key_value_store("by_user", TOPIC, count(), key="user")
    records = key_value_store("records", TOPIC, latest("genre"))
    plays_ = key_value_store("plays", TOPIC, count())
    with pytest.raises(DefinitionError, match="keyed by column 'user'.*keyed by the record key"):
        App("bad", [topic], [by_user, ranking_store("top", by_user)])
    with pytest.raises(DefinitionError, match="whose values are records"):
        App("bad", [topic], [records, ranking_store("top", records)])
    with pytest.raises(DefinitionError, match="add that key-value store to the app"):
        App("bad", [topic], [ranking_store("top", records)])
    with pytest.raises(DefinitionError, match="entity 'Song' composes 'top', a ranking.*compose the store it ranks"):
        App(
            "bad", [topic], [records, by_user, plays_, ranking_store("top", plays_)], entities=[Entity("Song", ["top"])]
        )
    with pytest.raises(DefinitionError, match="takes the store definition"):
        ranking_store("top", "records")  # type: ignore[arg-type]


def test_index_entries_cross_the_peer_wire_whole() -> None:
    entries = Page([IndexEntry("song-01", 12, b"a\x7f\x00song-01"), IndexEntry(7, 3.5, b"g\x00\x03pop\xff")], "c")
    answer = Answer({0: entries}, {0: 10}, {})
    decoded = wire.decode_scan(orjson.loads(orjson.dumps(wire.encode_scan(answer))), windowed=False)
    assert decoded.value[0].items == entries.items
    assert all(isinstance(item, IndexEntry) for item in decoded.value[0].items)


async def test_the_rest_path_reads_a_rankings_top_as_graphql_does_and_no_key(charts: tuple[Api, Truth]) -> None:
    """GET /stores/{ranking}/top is the top field's answer (the same words); a key of a ranking is refused."""
    api, truth = charts
    async with rest_client(api.queries) as client:
        found = await client.get("/stores/top_songs/keys/song-01")
        genre = GENRES[0]
        top = await client.get(f"/stores/top_songs/top?group={genre}&first=5")
        count = await client.get("/stores/top_songs/count")
    error = found.json()["errors"][0]
    assert (found.status_code, error["extensions"]["code"]) == (400, "INVALID_ARGUMENT")
    assert "is a ranking" in error["message"] and "/stores/top_songs/top" in error["message"]
    graphql = (await api.data(QUERY, {"g": genre, "n": 5}))["topSongs"]["top"]
    assert top.status_code == 200 and top.json() == {"store": "top_songs", "group": genre, "top": graphql}
    assert [(e["member"], e["value"]) for e in graphql] == truth.top(truth.plays, genre)[:5]
    assert count.json() == {"store": "top_songs", "count": len(truth.plays)}
