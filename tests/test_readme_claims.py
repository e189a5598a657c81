"""The README's claims about rankings' ties, name clashes, owner-side views and missing entities, each pinned.

One small library app (a members table, loans keyed by member: a count, a collection, a window, a bloom filter
and a ranking of the count per branch, an entity, an owner-side field) on real RocksDB partitions, written as
the sink merges them, and queried over the production query path of one node: no Spark, no broker. Each test
names the README section whose words it pins.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from strawberry.types import ExecutionResult

from iqgraph.app.catalog import entity_infos
from iqgraph.app.cli import main
from iqgraph.app.dev.producer import producer_config
from iqgraph.app.http.sdl import sdl
from iqgraph.app.owner.runner import owner_field_infos
from iqgraph.schema import Limits, SchemaDefinitionError, build_schema, context_getter
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory, WindowedValue
from iqgraph.streaming.collect import collect
from iqgraph.streaming.definitions import (
    App,
    Entity,
    Topic,
    bloom_store,
    count,
    key_value_store,
    ranking_store,
    table_store,
    tumbling,
    window_store,
)
from iqgraph.streaming.owner_fields import owner_field
from iqgraph.streaming.partials import _store_value  # the expression the sink's payload column is
from iqgraph.streaming.partitioner import partition_for
from iqgraph.streaming.static_types import static_value_types
from tests.support.apps import begin_batch
from tests.support.queries import single_node

PARTITIONS = 3
MINUTE = 60_000
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
LOANS = "book STRING, branch STRING, ts TIMESTAMP"
MEMBERS = "full_name STRING, joined_at TIMESTAMP, home_branch STRING"

#: What the owner-side function saw, per member (it runs on a worker thread of the node).
SEEN: dict[str, dict[str, Any]] = {}


@owner_field("loan_count", returns="bigint")
def what_views_show(member: str, views: Any) -> int:
    """Record what each kind of view gives for member."""
    seen = SEEN[member] = {
        "table": views.kv("profiles").get(member),
        "count": views.kv("loan_count").get(member),
        "collection": views.kv("last_loans").get(member),
        "windows": views.window("loans_per_minute").fetch(member),
        "later_windows": views.window("loans_per_minute").fetch(member, START_MS + MINUTE),
        "counts_by_prefix": views.kv("loan_count").prefix("m-"),
        "counts_in_range": views.kv("loan_count").range("m-a", "m-z", limit=1),
        "counts_many": views.kv("loan_count").get_many([member, "m-top"]),
        "bloom": views.bloom("borrowers").might_contain(member),
    }
    try:
        views.kv("top_borrowers")
    except Exception as refused:  # noqa: BLE001 - the message is what the test reads
        seen["ranking"] = str(refused)
    return 0


def library_app(**changes: Any) -> App:
    """Return the library app; changes replace its stores, entities or fields."""
    loan_count = key_value_store("loan_count", "loans", count())
    parts: dict[str, Any] = {
        "stores": [
            table_store("profiles", "members"),
            loan_count,
            key_value_store("last_loans", "loans", collect("book", "ts", max_items=2, order_by="ts")),
            window_store("loans_per_minute", "loans", count(), tumbling(minutes=1)),
            bloom_store("borrowers", "loans"),
            ranking_store("top_borrowers", loan_count, group="branch"),
        ],
        "entities": [Entity("Member", ["profiles", "loan_count", "loans_per_minute"], table="profiles")],
        "fields": [what_views_show],
    }
    parts.update(changes)
    topics = [
        Topic("loans", schema=LOANS, event_time="ts", partitions=PARTITIONS),
        Topic("members", schema=MEMBERS, partitions=PARTITIONS, table=True),
    ]
    return App("library", topics, **parts)


def iso(ms: int) -> str:
    """Return ms as Spark's to_json writes a timestamp (the session's zone is UTC)."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


#: Members (a row each in the table) and their loans (book, branch, minute); m-idle borrowed nothing.
PROFILES = {
    "m-ada": {"full_name": "Ada Lovelace", "joined_at": iso(START_MS), "home_branch": "north"},
    "m-idle": {"full_name": "Idle Reader", "joined_at": iso(START_MS + MINUTE), "home_branch": "south"},
}
#: Loan counts chosen to tie: five members with 2 loans (one spelled with a capital, two with numbers that sort as
#: text), one with 3; all in branch north but m-b, in south.
LOAN_COUNTS = {"m-ada": 2, "m-b": 2, "B-7": 2, "m-10": 2, "m-9": 2, "m-top": 3}


def _partition(key: str) -> int:
    return partition_for(key, PARTITIONS, "string", "murmur2")


def _loans() -> list[tuple[str, str, str, int]]:
    """Return the loans (member, book, branch, minute), in offset order."""
    return [
        (member, f"book-{i}", "south" if member == "m-b" else "north", i)
        for member, n in LOAN_COUNTS.items()
        for i in range(n)
    ]


def _fill(hosted: dict[str, dict[int, PartitionStores]]) -> None:
    """Write the table and the loans as the sink merges a batch (one transaction per partition); RUNNING."""
    for p, stores in hosted["members"].items():
        with begin_batch(stores) as tx:
            stores.kv("profiles").merge(tx, [(k, v) for k, v in PROFILES.items() if _partition(k) == p])
        stores.db.set_state(PartitionState.RUNNING)
    for p, stores in hosted["loans"].items():
        mine = [loan for loan in _loans() if _partition(loan[0]) == p]
        with begin_batch(stores) as tx:
            counts = stores.kv("loan_count").merge(tx, [(m, 1) for m, *_ in mine])
            collected = [
                (m, [[iso(START_MS + i * MINUTE), p, offset, {"book": book, "ts": iso(START_MS + i * MINUTE)}]])
                for offset, (m, book, _, i) in enumerate(mine)
            ]
            stores.kv("last_loans").merge(tx, collected)
            stores.window("loans_per_minute").aggregate(tx, [(m, START_MS + i * MINUTE, 1) for m, _, _, i in mine])
            stores.bloom("borrowers").add(tx, [m for m, *_ in mine])
            members = list(dict.fromkeys(m for m, *_ in mine))
            branch = {m: b for m, _, b, _ in mine}
            stored = stores.kv("loan_count").codec.encode_many(members)
            values = [counts.states[k] for k in stored]
            stores.ranking("top_borrowers").update(tx, members, [branch[m] for m in members], values)
        stores.db.set_state(PartitionState.RUNNING)


class Library:
    """The library's schema over the production query path of one node hosting every partition."""

    def __init__(self, hosted: dict[str, dict[int, PartitionStores]]) -> None:
        self.app = library_app()
        self.queries = single_node(self.app, static_value_types(self.app), hosted)
        self.limits = Limits()
        self.schema = build_schema(
            self.queries.stores(),
            self.limits,
            entities=entity_infos(self.app),
            owner_fields=owner_field_infos(self.app),
        )

    async def run(self, query: str) -> ExecutionResult:
        return await self.schema.execute(query, context_value=context_getter(self.queries, self.limits)())

    async def data(self, query: str) -> Any:
        result = await self.run(query)
        assert result.errors is None, [e.formatted for e in result.errors]
        return result.data


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Library]:
    state = StateDirectory(tmp_path_factory.mktemp("library") / "state", "library")
    app = library_app()
    hosted = {t.name: {p: state.open(t.name, p, app.specs(t.name)) for p in range(PARTITIONS)} for t in app.topics}
    try:
        _fill(hosted)
        yield Library(hosted)
    finally:
        for partitions in hosted.values():
            for stores in partitions.values():
                stores.close()


# -- "Rankings: top N per group, live" ------------------------------------------------------------------------


async def test_equal_values_take_consecutive_ranks_in_ascending_member_order(library: Library) -> None:
    """README, Rankings: ties take consecutive ranks (1, 2, 3, not 1, 1, 3), members in ascending natural order
    (a string's UTF-8 bytes: "B-7" before "m-10" before "m-9"), over every partition, across pages."""
    assert len({_partition(m) for m, n in LOAN_COUNTS.items() if n == 2}) > 1  # the tie spans partitions
    top = await library.data("{ topBorrowers { top(first: 10) { rank member value } } }")
    assert top["topBorrowers"]["top"] == [
        {"rank": 1, "member": "m-top", "value": 3},
        {"rank": 2, "member": "B-7", "value": 2},
        {"rank": 3, "member": "m-10", "value": 2},
        {"rank": 4, "member": "m-9", "value": 2},
        {"rank": 5, "member": "m-ada", "value": 2},
        {"rank": 6, "member": "m-b", "value": 2},
    ]
    north = await library.data('{ topBorrowers { top(group: "north", first: 3) { rank member cursor } } }')
    first = north["topBorrowers"]["top"]
    assert [(e["rank"], e["member"]) for e in first] == [(1, "m-top"), (2, "B-7"), (3, "m-10")]
    after = first[-1]["cursor"]
    rest = await library.data(
        f'{{ topBorrowers {{ top(group: "north", first: 3, after: "{after}") {{ rank member }} }} }}'
    )
    assert rest["topBorrowers"]["top"] == [{"rank": 4, "member": "m-9"}, {"rank": 5, "member": "m-ada"}]


# -- "Owner-side fields: your logic, run where the key lives" ---------------------------------------------------


async def test_owner_side_views_show_each_store_kind_as_the_readme_says(library: Library) -> None:
    """README, Owner-side fields: a table value is a dict of the topic's columns under their declared
    (snake_case) names, timestamps as ISO strings; an aggregate its value; collect() a list of dicts; a window
    store a list of WindowedValue (.key, .start, .end in epoch ms, .value), oldest first, from/to bounding the
    start; a bloom filter a bool; range and prefix (key, value) tuples of the call's partition only; a ranking
    has no view; an absent key is None (a window store: [])."""
    SEEN.clear()
    await library.data('{ whatViewsShowMany(keys: ["m-ada", "m-idle", "nobody"]) }')
    ada = SEEN["m-ada"]
    assert ada["table"] == {
        "full_name": "Ada Lovelace",
        "joined_at": "2026-01-01T00:00:00.000Z",
        "home_branch": "north",
    }
    assert ada["count"] == 2
    assert ada["collection"] == [
        {"book": "book-0", "ts": "2026-01-01T00:00:00.000Z"},
        {"book": "book-1", "ts": "2026-01-01T00:01:00.000Z"},
    ]
    assert ada["windows"] == [
        WindowedValue("m-ada", START_MS, START_MS + MINUTE, 1),
        WindowedValue("m-ada", START_MS + MINUTE, START_MS + 2 * MINUTE, 1),
    ]
    assert [(w.start, w.end, w.value) for w in ada["windows"]] == [
        (START_MS, START_MS + MINUTE, 1),
        (START_MS + MINUTE, START_MS + 2 * MINUTE, 1),
    ]
    assert [w.start for w in ada["later_windows"]] == [START_MS + MINUTE]  # from: the earliest start, inclusive
    assert ada["bloom"] is True
    # range and prefix: (key, value) tuples in key order, of the call's partition only (the keys living with it)
    assert _partition("m-ada") == _partition("m-b") != _partition("m-top")
    assert ada["counts_by_prefix"] == [("m-ada", 2), ("m-b", 2)]  # not m-10, m-9, m-top: other partitions
    assert ada["counts_in_range"] == [("m-ada", 2)]
    assert ada["counts_many"] == [2, None]  # m-top's count is in another partition
    assert ada["ranking"] == "store 'top_borrowers' is a ranking store, not key_value"
    idle = SEEN["m-idle"]
    assert idle["table"]["full_name"] == "Idle Reader"
    assert (idle["count"], idle["collection"], idle["windows"], idle["bloom"]) == (None, None, [], False)
    assert SEEN["nobody"]["table"] is None


@pytest.mark.slow
def test_a_table_value_is_stored_with_declared_column_names_and_iso_timestamps(spark: Any) -> None:
    """README, Owner-side fields: what the sink stores for a table row (and so what views.kv(...).get gives) is
    a JSON object of the topic's columns under their declared names, a struct an object, an array a list, a
    timestamp an ISO string in UTC.

    The one Spark test here (one row through the sink's payload expression): the in-process tests write what it
    makes."""
    app = library_app()
    row = spark.sql(  # literals: no Python worker
        "SELECT 'Ada Lovelace' AS full_name, TIMESTAMP'2026-01-01 10:30:00' AS joined_at,"
        " named_struct('city', 'Oslo') AS address, array('a', 'b') AS tags, X'7B7D' AS _raw_value"
    )
    payload, kind = _store_value(row, app.store("profiles"))
    assert kind == "payload" and payload is not None
    stored = orjson.loads(row.select(payload).first()[0])
    assert stored == {
        "full_name": "Ada Lovelace",
        "joined_at": "2026-01-01T10:30:00.000Z",
        "address": {"city": "Oslo"},
        "tags": ["a", "b"],
    }


# -- "What a producer must do: nothing special" ------------------------------------------------------------


def test_the_partitioner_is_auto_by_default_and_iqgraph_produce_uses_murmur2_unless_the_app_pins_crc32() -> None:
    """README, What a producer must do: `auto` is the default; `iqgraph produce` partitions with murmur2
    (librdkafka's murmur2_random), or consistent_random when the app pins that."""
    app = library_app()
    assert app.kafka.partitioner == "auto"
    assert producer_config(app, "k:9092")["partitioner"] == "murmur2_random"
    for pinned, used in (("murmur2", "murmur2_random"), ("consistent_random", "consistent_random")):
        kafka = dataclasses.replace(app.kafka, partitioner=pinned)
        assert producer_config(dataclasses.replace(app, kafka=kafka), "k:9092")["partitioner"] == used


# -- "Tables, joins, entities and relations" ---------------------------------------------------------------


async def test_an_entity_of_a_key_no_store_holds_is_an_object_of_nulls_not_null(library: Library) -> None:
    """README, Entities: member(key: "nobody") answers the key with every field null (a window store's field:
    []), not a null member, and no error; a key some stores hold answers their values and null for the others."""
    query = '{ member(key: "%s") { key fullName joinedAt loanCount loansPerMinute { start value } } }'
    assert await library.data(query % "nobody") == {
        "member": {"key": "nobody", "fullName": None, "joinedAt": None, "loanCount": None, "loansPerMinute": []}
    }
    idle = await library.data(query % "m-idle")
    assert idle["member"] == {
        "key": "m-idle",
        "fullName": "Idle Reader",
        "joinedAt": "2026-01-01T00:01:00.000Z",
        "loanCount": None,
        "loansPerMinute": [],
    }
    many = await library.data('{ members(keys: ["m-top", "nobody"]) { key fullName loanCount } }')
    assert many["members"] == [
        {"key": "m-top", "fullName": None, "loanCount": 3},
        {"key": "nobody", "fullName": None, "loanCount": None},
    ]


CLASHES = [
    pytest.param(
        {"stores": [table_store("members", "members"), key_value_store("loan_count", "loans", count())],
         "entities": [Entity("Member", ["members", "loan_count"], table="members")], "fields": []},
        "entity 'Member' would add the root field 'members', which store 'members' has already: give the entity "
        "another plural (plural=...)",
        id="store-named-like-the-entitys-plural",
    ),
    pytest.param(
        {"stores": [key_value_store("member", "loans", count())], "entities": [Entity("Member", ["member"])],
         "fields": []},
        "entity 'Member' would add the root field 'member', which store 'member' has already: rename the entity",
        id="store-named-like-the-entity",
    ),
    pytest.param(
        {"stores": [key_value_store("loan_count", "loans", count()), key_value_store("loanCount", "loans", count())],
         "entities": [], "fields": []},
        "stores 'loan_count' and 'loanCount' would both be the field 'loanCount'",
        id="two-stores-one-camel-case",
    ),
    pytest.param(
        {"stores": [key_value_store("key_metadata", "loans", count())], "entities": [], "fields": []},
        "store 'key_metadata' would be the field 'keyMetadata', which is metadata: rename it",
        id="store-named-like-metadata",
    ),
    pytest.param(
        {"stores": [table_store("profiles", "members"), key_value_store("full_name", "loans", count())],
         "entities": [Entity("Member", ["profiles", "full_name"], table="profiles")], "fields": []},
        "entity 'Member': column 'full_name' of table 'profiles' and store 'full_name' would both be the field "
        "'fullName': rename one",
        id="table-column-named-like-a-store",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("parts", "message"), CLASHES)
def test_names_that_would_meet_in_the_schema_are_refused_at_load_with_one_line(
    parts: dict[str, Any], message: str
) -> None:
    """README, Entities ("Names meet in one schema"): each clash is refused when the schema is built, with one line
    saying what to rename; App(...) itself accepts the definition."""
    app = library_app(**parts)
    with pytest.raises(SchemaDefinitionError) as refused:
        sdl(app, static_value_types(app))
    assert str(refused.value) == message


def test_iqgraph_schema_refuses_a_clash_with_one_line_and_exit_code_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README, Entities ("Names meet in one schema"): `iqgraph schema` (as `dev` and `serve`) stops with that line."""
    (tmp_path / "readme_clash_app.py").write_text(
        "from iqgraph import App, Entity, Topic, table_store\n"
        "app = App('lib', [Topic('members', schema='name STRING', partitions=2, table=True)],\n"
        "          [table_store('members', 'members')], entities=[Entity('Member', ['members'], table='members')])\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["schema", "--app", "readme_clash_app:app"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "iqgraph: error: entity 'Member' would add the root field 'members', which store 'members' has already: "
        "give the entity another plural (plural=...)\n"
    )
