"""The music charts example (seed 004): song plays joined with a global songs table, ranked live per genre.

Topics: ``songs`` — a global table of the catalogue (title, artist, genre), keyed by song id, on every node;
``plays`` — every play, keyed by the song played (as Kafka Streams' music example re-keys its plays by song
before counting), with the listener, the seconds listened and the time.

Questions it answers:
- the top five songs of a genre, live:
  ``topSongs { top(group: "jazz", first: 5) { member value rank song { title } } }``
  and over every genre: ``topSongs { top(first: 5) { … } }`` (a ranking of ``songPlays``, kept in the same
  transaction as the counts; the next page starts after an entry's ``cursor``);
- a song's plays and its catalogue entry in one object: ``song(key: "song-0007") { title genre songPlays }``;
- plays per song per minute: ``playsPerMinute { fetch(key:, from:, to:) { start value } }``;
- the last 10 plays of a listener (``lastPlays``, a bounded collection keyed by the user column: one user's
  plays arrive on many partitions, merged by time) and the distinct listeners of a song (``listeners``, a
  HyperLogLog sketch: a user-defined aggregation);
- ``songTrend(key:)``, an owner-side field: run on the node that owns the song, it reads the song's plays per
  minute, listeners and plays there and answers its last five minutes against the five before.

Popularity is skewed (a few songs get most plays), so the charts have a clear head and a long tail.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import partial

from iqgraph import (
    App,
    Entity,
    Event,
    Join,
    KafkaSettings,
    Relation,
    StoreViews,
    Topic,
    collect,
    count,
    hyperloglog,
    iso_timestamp,
    key_value_store,
    owner_field,
    ranking_store,
    sum_,
    table_store,
    tumbling,
    window_store,
)

GENRES = ["jazz", "rock", "pop", "folk", "blues", "classical", "electronic", "hip-hop"]
SONGS = 240
USERS = 500
PLAY_SCHEMA = "song_id STRING, user STRING, seconds LONG, ts TIMESTAMP"
SONG_SCHEMA = "title STRING, artist STRING, genre STRING"


def song_id(n: int) -> str:
    """Return the id of song n."""
    return f"song-{n:04d}"


def catalogue(seed: int) -> dict[str, dict[str, str]]:
    """Return the songs of the catalogue: id -> title, artist, genre."""
    rng = random.Random(seed)
    return {
        song_id(n): {"title": f"Song {n}", "artist": f"artist-{rng.randrange(60):02d}", "genre": rng.choice(GENRES)}
        for n in range(SONGS)
    }


def generate(seed: int, start_ms: int, plays: str = "plays", songs: str = "songs") -> Iterator[Event]:
    """Yield the catalogue once, then plays forever: song popularity and listener activity are skewed."""
    rng = random.Random(seed)
    for song, entry in catalogue(seed).items():
        yield songs, song, entry
    now = start_ms
    while True:
        now += rng.randint(5, 40)
        song = song_id((int(rng.paretovariate(0.9)) - 1) % SONGS)
        user = f"user-{(int(rng.paretovariate(1.1)) - 1) % USERS:03d}"
        yield plays, song, {"song_id": song, "user": user, "seconds": rng.randint(20, 320), "ts": iso_timestamp(now)}


TREND_MINUTES = 5
MINUTE_MS = 60_000


@owner_field(
    "song_plays",
    returns="struct<plays: bigint, listeners: bigint, last_minutes: bigint, minutes_before: bigint, rising: boolean>",
)
def song_trend(song: str, views: StoreViews) -> dict[str, object] | None:
    """A song's plays in its last five minutes played against the five before, with its plays and listeners."""
    plays = views.kv("song_plays").get(song)
    if plays is None:
        return None
    minutes = views.window("plays_per_minute").fetch(song)
    last = minutes[-1].start if minutes else 0
    recent = sum(w.value for w in minutes if w.start > last - TREND_MINUTES * MINUTE_MS)
    before = sum(
        w.value for w in minutes if last - 2 * TREND_MINUTES * MINUTE_MS < w.start <= last - TREND_MINUTES * MINUTE_MS
    )
    listeners = views.kv("listeners").get(song) or 0
    return {
        "plays": plays,
        "listeners": listeners,
        "last_minutes": recent,
        "minutes_before": before,
        "rising": recent > before,
    }


def build_app(
    plays: str = "plays", songs: str = "songs", partitions: int = 6, kafka: KafkaSettings | None = None
) -> App:
    """Return the music app on the given topics (tests give each run topics of their own)."""
    song_plays = key_value_store(
        "song_plays", plays, count(), join=Join("catalogue"), description="Plays per song (of the catalogue)"
    )
    return App(
        name="music",
        description="Song plays joined with the catalogue: live charts per genre",
        topics=[
            Topic(plays, schema=PLAY_SCHEMA, event_time="ts", partitions=partitions),
            Topic(songs, schema=SONG_SCHEMA, partitions=partitions, table=True, global_table=True),
        ],
        stores=[
            table_store("catalogue", songs, description="The catalogue: every song's title, artist and genre"),
            song_plays,
            key_value_store("seconds_played", plays, sum_("seconds"), description="Seconds listened per song"),
            ranking_store(
                "top_songs",
                song_plays,
                group="genre",
                description="Songs by plays, per genre and over all",
                relations=[Relation("song", "Song")],
            ),
            window_store(
                "plays_per_minute", plays, count(), tumbling(minutes=1), description="Plays per song per minute"
            ),
            key_value_store(
                "last_plays",
                plays,
                collect("song_id", "seconds", "ts", max_items=10, order_by="ts"),
                key="user",
                description="Each listener's last 10 plays, by time over every partition",
            ),
            key_value_store("listeners", plays, hyperloglog("user"), description="Distinct listeners per song (about)"),
        ],
        entities=[Entity("Song", stores=["catalogue", "song_plays", "seconds_played", "listeners"], table="catalogue")],
        fields=[song_trend],
        kafka=kafka or KafkaSettings(),
        generator=partial(generate, plays=plays, songs=songs),
    )


app = build_app()
