"""Readiness while Kafka is away: a node whose pipeline died or stalled for it stays ready (its stores answer, and no
node has anything newer); the same pipeline death with Kafka answering makes it not ready."""

from __future__ import annotations

from types import SimpleNamespace

from iqgraph.app.node import Node, NodeState
from iqgraph.app.settings import Settings
from iqgraph.schema.types import NodeInfo, PartitionInfo, PipelineInfo
from iqgraph.streaming.kafka_watch import KafkaStatus
from tests.support.apps import shop_app


def node_with(reachable: bool) -> Node:
    node = Node(Settings(app="x:app"), shop_app())
    node.state = NodeState.RUNNING
    node.local = SimpleNamespace()  # type: ignore[assignment] # ready() reads info given, not local
    node.kafka_watch = SimpleNamespace(status=lambda: KafkaStatus(reachable, None if reachable else 1.0))  # type: ignore[assignment]
    return node


def info(pipeline: PipelineInfo, stalled: bool = False, state: str = "RUNNING") -> NodeInfo:
    return NodeInfo(
        "node-0", "http://n", "RUNNING", (PartitionInfo("orders", 0, "active", state, 5, 9, 70.0, stalled),), pipeline
    )


def test_a_pipeline_dead_or_stalled_for_kafka_keeps_the_node_ready_and_not_otherwise() -> None:
    dead = PipelineInfo("DEAD", 1, 1, "KafkaException: all brokers down")
    assert node_with(reachable=False).ready(info(dead))
    assert node_with(reachable=False).ready(info(PipelineInfo("RUNNING"), stalled=True))
    assert not node_with(reachable=True).ready(info(dead))
    assert not node_with(reachable=True).ready(info(PipelineInfo("RUNNING"), stalled=True))
    assert not node_with(reachable=False).ready(info(PipelineInfo("RUNNING"), state="RESTORING"))  # still restoring
