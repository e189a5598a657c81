"""What a node says about its start: how long it took to be ready, and where the time went when slow."""

from __future__ import annotations

import time

from iqgraph.app.node import Node
from iqgraph.app.settings import Settings
from tests.support.apps import shop_app


def test_a_slow_start_says_how_long_each_step_took_and_which_took_most() -> None:
    node = Node(Settings(app="x:app"), shop_app())
    node.timings = {"started": time.monotonic() - 16.0, "joined": 0.8, "spark": 10.5, "queries": 2.0}
    said = node.ready_in()
    assert said.startswith("ready 16.0 s after start (slow: "), said
    assert "starting Spark (while joining) 10.5 s" in said and "starting the streaming queries 2.0 s" in said
    assert "applying the records Kafka holds (restoring) 3.5 s" in said
    assert "most went to starting Spark (while joining)" in said and "cluster joined in 0.8 s" in said

    node.timings = {"started": time.monotonic() - 40.0, "joined": 0.8, "spark": 7.0, "queries": 1.0}
    assert "most went to applying the records Kafka holds (restoring)" in node.ready_in()


def test_a_quick_start_says_only_how_long() -> None:
    node = Node(Settings(app="x:app"), shop_app())
    node.timings = {"started": time.monotonic() - 6.0, "joined": 0.5, "spark": 4.0, "queries": 1.0}
    assert node.ready_in() == "ready 6.0 s after start"
