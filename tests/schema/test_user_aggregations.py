"""Collections and user aggregations in GraphQL: typed fields from their Spark types, answers from RocksDB.

The plays app (tests.support.plays) with states written as the sink writes them (the task's fold, then
the store's merge), read through the production query path of one node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iqgraph.stores import PartitionState
from iqgraph.streaming.partitioner import partition_for
from tests.schema.conftest import Api, Hosted, api_factory, close_hosted, open_hosted
from tests.support.apps import PARTITIONS
from tests.support.plays import HOUR, START_MS, TYPES, make_plays, plays_app, truth

TOPIC = "plays"


def _fill(hosted: Hosted, plays: list[Any]) -> None:
    """Apply plays as the sink does: per partition, each store's fold of the records merged into its state."""
    app = plays_app(TOPIC, PARTITIONS)
    by_partition: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for user, play in plays:
        p = partition_for(user, PARTITIONS, "string", "murmur2")
        mine = by_partition.setdefault(p, [])
        mine.append((len(mine), play))
    for p, records in by_partition.items():
        stores = hosted[TOPIC][p]
        with stores.db.begin(0, len(records)) as tx:
            for store in app.stores:
                user = store.aggregate.user
                assert user is not None
                groups: dict[Any, list[dict[str, Any]]] = {}
                for offset, play in records:
                    key = play[store.key or "user"]
                    if store.window is not None:
                        key = (key, play["ts"] // HOUR * HOUR)
                    row = {c: play[c] for c in store.aggregate.columns} | {"_partition": p, "_offset": offset}
                    groups.setdefault(key, []).append(row)
                if store.window is None:
                    stores.kv(store.name).merge(tx, [(k, user.fold(rows)) for k, rows in groups.items()])
                else:
                    items = [(k, start, user.fold(rows)) for (k, start), rows in groups.items()]
                    stores.window(store.name).merge(tx, items, None, 0)
        stores.db.set_state(PartitionState.RUNNING)


@pytest.fixture
def plays(tmp_path: Path) -> Iterator[tuple[Api, list[Any]]]:
    app = plays_app(TOPIC, PARTITIONS)
    hosted = open_hosted(tmp_path / "plays", app, TOPIC)
    played = [p for p in make_plays(5, 400) if p[1]["ms"] >= 0]  # the transform's filter, applied here
    _fill(hosted, played)
    yield api_factory(app, TYPES, hosted)(), played
    close_hosted(hosted)


async def test_collections_and_sketches_are_typed_fields(plays: tuple[Api, list[Any]]) -> None:
    api, _ = plays
    sdl = api.schema.as_str()
    assert "type LastPlays {\n  song: String\n  ts: Long\n}" in sdl  # collect: a list of typed records
    assert "type FirstListeners {\n  user: String\n}" in sdl
    assert "type Latency {\n  low: Float\n  high: Float\n  count: Long\n}" in sdl  # the histogram's DDL type
    entries = {name: _block(sdl, f"type {name}Entry {{") for name in ("LastPlays", "Listeners")}
    assert "value: [LastPlays!]" in entries["LastPlays"]
    assert "value: Long" in entries["Listeners"]  # the sketch's value type
    assert "value: [Latency]" in _block(sdl, "type LatencyWindow {")


def _block(sdl: str, start: str) -> str:
    return sdl[sdl.index(start) :].split("}", 1)[0]


async def test_collections_and_sketches_answer_like_python(plays: tuple[Api, list[Any]]) -> None:
    api, played = plays
    expected = truth(played, PARTITIONS)
    user = next(iter(expected["last_plays"]))
    data = await api.data(
        f"""{{
          lastPlays {{ get(key: "{user}") {{ song ts }} }}
          firstListeners {{ get(key: "song-3") {{ user }} }}
          listeners {{ get(key: "song-3") }}
          latency {{ fetch(key: "{user}", from: {START_MS}, to: {START_MS}) {{ start value {{ low high count }} }} }}
        }}"""
    )
    assert data["lastPlays"]["get"] == expected["last_plays"][user]
    assert data["firstListeners"]["get"] == expected["first_listeners"]["song-3"]
    assert abs(data["listeners"]["get"] - expected["listeners"]["song-3"]) <= 1
    (window,) = data["latency"]["fetch"]
    assert window["value"] == expected["latency"][user, START_MS]
