"""End to end with Spark: collections and user aggregations through the broker, the task's fold and the sink,
read back through the production query path, equal to Python over the same plays — across a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from iqgraph import App, Topic, collect, key_value_store
from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import DefinitionError
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from iqgraph.streaming.value_types import value_types
from tests.conftest import MakeTopic
from tests.support.plays import TYPES, Play, assert_plays_equal, make_plays, plays_app, read_plays, truth

PARTITIONS = 3


def _send(broker: KafkaBroker, topic: str, plays: list[Play]) -> None:
    produce(broker.bootstrap_servers, topic, [(k.encode(), orjson.dumps(v), None) for k, v in plays])


def test_collections_and_user_aggregations_equal_python_across_a_restart(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(PARTITIONS, prefix="plays")
    app = plays_app(topic, PARTITIONS)
    plays = make_plays(11, 1_200)
    assert value_types(app, spark) == TYPES
    settings = RunnerSettings(broker.bootstrap_servers, max_records_per_batch=400)
    state = StateDirectory(tmp_path / "state", app.name)
    _send(broker, topic, plays[:700])
    runner = StreamRunner(app, spark, state, settings)
    try:
        runner.start({topic: range(PARTITIONS)})
        runner.wait_until_caught_up(timeout=180)
        assert_plays_equal(read_plays(app, runner.partitions), truth(plays[:700], PARTITIONS))
    finally:
        runner.stop()
    _send(broker, topic, plays[700:])  # applied after a restart: merged into the stored states
    again = StreamRunner(app, spark, state, settings)
    try:
        again.start({topic: range(PARTITIONS)})
        again.wait_until_caught_up(timeout=180)
        assert_plays_equal(read_plays(app, again.partitions), truth(plays, PARTITIONS))
    finally:
        again.stop()


def test_value_types_refuse_missing_columns_and_bad_types_in_one_line(spark: Any) -> None:
    topic = Topic("t", schema="user STRING, tags MAP<STRING, INT>, ts LONG")

    def refused(store: Any) -> str:
        with pytest.raises(DefinitionError) as error:
            value_types(App("a", [topic], [store]), spark)
        assert "\n" not in str(error.value)
        return str(error.value)

    missing = key_value_store("s", "t", collect("user", max_items=2, order_by="when"))
    assert refused(missing) == "store 's' uses columns ['when'], which its records lack"
    by_map = key_value_store("s", "t", collect("user", max_items=2, order_by="tags"))
    assert "order by a number, string, date or timestamp column" in refused(by_map)
