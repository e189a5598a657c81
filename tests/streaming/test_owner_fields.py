"""Owner-side field definitions: the declared type (DDL parsed without a JVM, or a Python annotation), and every
bad definition refused when the app loads with one DefinitionError line."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

import pytest
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from iqgraph.streaming.ddl import DDLError, parse_ddl
from iqgraph.streaming.definitions import (
    App,
    DefinitionError,
    Entity,
    Topic,
    count,
    key_value_store,
    table_store,
)
from iqgraph.streaming.owner_fields import OwnerField, owner_field


def _app(*fields: Any, **changes: Any) -> App:
    base = App(
        name="music",
        topics=[
            Topic("plays", schema="song STRING, genre STRING"),
            Topic("songs", schema="title STRING", table=True, global_table=True),
        ],
        stores=[
            key_value_store("plays_per_user", "plays", count()),
            key_value_store("plays_per_song", "plays", count(), key="song"),
            table_store("song_titles", "songs"),
        ],
        entities=[Entity("Listener", stores=["plays_per_user"])],
    )
    return dataclasses.replace(base, fields=list(fields), **changes)


def _genre(key: str, views: Any) -> str:
    return "jazz"


def _untyped(key, views):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
    return "jazz"


def test_ddl_types_parse_without_spark() -> None:
    assert parse_ddl("string") == StringType()
    assert parse_ddl("DOUBLE") == DoubleType()
    assert parse_ddl("struct<genre: string, plays: bigint>") == StructType(
        [StructField("genre", StringType()), StructField("plays", LongType())]
    )
    assert parse_ddl("genre STRING, plays LONG NOT NULL") == StructType(
        [StructField("genre", StringType()), StructField("plays", LongType(), False)]
    )
    assert parse_ddl("array<map<string, decimal(10, 2)>>") == ArrayType(MapType(StringType(), DecimalType(10, 2)))
    commented = parse_ddl("struct<`odd name`: timestamp COMMENT 'when'>")
    assert isinstance(commented, StructType)
    assert commented.fields[0].name == "odd name" and commented.fields[0].dataType == TimestampType()
    assert commented.fields[0].metadata == {"comment": "when"}
    for bad, message in [
        ("strin", "expected a type"),
        ("array<int", "expected > at 'the end'"),
        ("struct<a int,>", "expected a field name at '>'"),
    ]:
        with pytest.raises(DDLError, match=message):
            parse_ddl(bad)


def test_a_field_is_typed_by_its_ddl_its_datatype_or_its_annotation() -> None:
    assert OwnerField("genre", _genre, "string", "plays_per_user").value_type == StringType()
    assert OwnerField("genre", _genre, DoubleType(), "plays_per_user").value_type == DoubleType()

    def annotated(key: str, views: Any) -> list[dict[str, float | None]]:
        return []

    assert OwnerField("top", annotated, None, "plays_per_user").value_type == ArrayType(
        MapType(StringType(), DoubleType())
    )

    @owner_field("plays_per_user")
    def last_played(key: str, views: Any) -> dt.datetime | None:
        """When the user last played."""
        return None

    assert (last_played.name, last_played.value_type, last_played.description) == (
        "last_played",
        TimestampType(),
        "When the user last played.",
    )
    assert last_played("u1", None) is None  # a decorated function stays callable
    app = _app(last_played)
    assert app.fields == [last_played]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: OwnerField("genre", _untyped, None, "plays_per_user"),
            "owner-side field 'genre' has no return type: give returns= a Spark DDL type",
        ),
        (lambda: OwnerField("genre", _genre, "strnig", "plays_per_user"), "owner-side field 'genre': type 'strnig'"),
        (
            lambda: OwnerField("genre", lambda key: key, "string", "plays_per_user"),
            r"must take two arguments: \(key, views\)",
        ),
        (lambda: OwnerField("genre", "not a function", "string", "plays_per_user"), "function must be callable"),
        (lambda: OwnerField("genre", _genre, "string", "plays_per_user", timeout_s=0), "timeout_s must be > 0"),
        (  # the peer client waits 5 s for a peer: a field must answer TIMEOUT before (app.peers)
            lambda: OwnerField("genre", _genre, "string", "plays_per_user", timeout_s=4.5),
            r"timeout_s must be > 0 and <= 4 seconds \(a peer's answer must beat the peer timeout of 5 s\), not 4.5",
        ),
        (lambda: OwnerField("2genre", _genre, "string", "plays_per_user"), "owner-side field name '2genre'"),
    ],
)
def test_a_bad_field_is_one_line_at_load(make: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message) as raised:
        make()
    assert "\n" not in str(raised.value)


def test_an_async_function_is_refused() -> None:
    async def genre(key: str, views: Any) -> str:
        return "jazz"

    with pytest.raises(DefinitionError, match="genre is async; write a plain function"):
        OwnerField("genre", genre, "string", "plays_per_user")


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (
            OwnerField("genre", _genre, "string", "nope"),
            "routes by store 'nope', which the app lacks (stores: plays_per_user, plays_per_song, song_titles)",
        ),
        (OwnerField("genre", _genre, "string", "plays_per_song"), "keyed by column 'song'"),
        (OwnerField("genre", _genre, "string", "song_titles"), "a global table that every node holds"),
        (
            OwnerField("playsPerUser", _genre, "string", "plays_per_user"),
            "would be the root field 'playsPerUser', which store 'plays_per_user' has: rename it",
        ),
        (
            OwnerField("listeners", _genre, "string", "plays_per_user"),
            "would be the root field 'listeners', which entity 'Listener' has",
        ),
    ],
)
def test_an_app_refuses_a_field_it_cannot_serve(field: OwnerField, message: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(message)) as raised:
        _app(field)
    assert "\n" not in str(raised.value)


def test_two_fields_may_not_share_a_name() -> None:
    with pytest.raises(DefinitionError, match="which owner-side field 'genre' has"):
        _app(*[OwnerField("genre", _genre, "string", "plays_per_user")] * 2)
    with pytest.raises(DefinitionError, match="takes owner_field"):
        _app(_genre)


def test_the_timeout_limit_leaves_the_peer_round_trip_room() -> None:
    from iqgraph.app.cluster.peers import PeerClient
    from iqgraph.schema.wire import PEER_TIMEOUT_S
    from iqgraph.streaming.owner_fields import OWNER_FIELD_MAX_TIMEOUT_S

    assert OWNER_FIELD_MAX_TIMEOUT_S <= PEER_TIMEOUT_S - 1.0
    assert PeerClient("node-0").timeout.read == PEER_TIMEOUT_S
    assert OwnerField("genre", _genre, "string", "plays_per_user", timeout_s=OWNER_FIELD_MAX_TIMEOUT_S).timeout_s == 4.0


def test_a_ranking_is_no_store_to_route_by() -> None:
    from iqgraph.streaming.definitions import ranking_store

    plays = key_value_store("plays_per_user", "plays", count())
    base = _app()
    stores = [*base.stores, ranking_store("top_users", plays, group="genre")]
    with pytest.raises(DefinitionError, match="routes by ranking 'top_users', keyed by group"):
        _app(OwnerField("genre", _genre, "string", "top_users"), stores=stores)
