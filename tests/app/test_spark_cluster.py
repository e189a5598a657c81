"""A node on a real Spark standalone cluster: executors run the Kafka reads and the user's functions.

The master and a worker are started from the pyspark installation on loopback (tests.support.spark_cluster). The
user's app calls a plain function of its own module in a UDF: the executors can import that module only
because the node ships it (streaming.session.ship_module) — without it the first batch fails with
ModuleNotFoundError. A worker is killed with SIGKILL mid-stream (with its executor) and another started:
queries are answered throughout from the node's stores, and the values end equal to the ground truth —
then the node is stopped and every one of the shop example's stores, read back from its state directory,
equals the ground truth computed in Python (the end-to-end pipeline check, run on the cluster).
"""

from __future__ import annotations

import itertools
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from iqgraph.examples.shop import build_app
from iqgraph.stores import PartitionState, StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from tests.conftest import MakeTopic
from tests.support.nodes import NodeProcess, start_node, wait_ready
from tests.support.pipeline import START_MS, assert_equal_to_ground_truth
from tests.support.readback import read_back
from tests.support.spark_cluster import StandaloneCluster

PARTITIONS = 3

USER_APP = """
from pyspark.sql import functions as F

from iqgraph.examples.shop import build_app
from iqgraph.streaming.definitions import App, KafkaSettings, count, key_value_store


def band(amount):
    '''A plain function of the user's module: an executor runs it only if it can import this module.'''
    return "large" if amount >= 50 else "small"


def with_band(frame):
    return frame.withColumn("band", F.udf(band, "string")(F.col("amount")))


shop = build_app({topic!r}, {partitions}, KafkaSettings(bootstrap_servers={servers!r}))
app = App(
    "onspark",
    shop.topics,
    [*shop.stores, key_value_store("orders_per_band", {topic!r}, count(), key="band", transform=with_band)],
    kafka=shop.kafka,
)
"""


def _band(amount: float) -> str:
    return "large" if amount >= 50 else "small"


class Orders:
    """The events produced so far, and the counts they make."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        generator = build_app(topic, PARTITIONS).generator
        assert generator is not None
        self._events = generator(61, START_MS)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, n: int) -> None:
        batch = list(itertools.islice(self._events, n))
        produce(self.broker.bootstrap_servers, self.topic, [(k.encode(), orjson.dumps(v), None) for k, v in batch])
        self.sent.extend(batch)

    def truth(self) -> tuple[dict[str, int], dict[str, int]]:
        per_customer: dict[str, int] = {}
        per_band: dict[str, int] = {}
        for key, value in self.sent:
            per_customer[key] = per_customer.get(key, 0) + 1
            band = _band(value["amount"])
            per_band[band] = per_band.get(band, 0) + 1
        return per_customer, per_band


def _counts(node: NodeProcess, customers: list[str]) -> tuple[list[int], list[int]]:
    body = node.post(
        "query($c: [String!]!) { orderCount { getMany(keys: $c) }"
        ' ordersPerBand { getMany(keys: ["large", "small"]) } }',
        {"c": customers},
    )
    assert "errors" not in body, body
    return body["data"]["orderCount"]["getMany"], body["data"]["ordersPerBand"]["getMany"]


def _reach_the_ground_truth(node: NodeProcess, orders: Orders, timeout: float) -> None:
    per_customer, per_band = orders.truth()
    customers = sorted(per_customer)
    want = ([per_customer[c] for c in customers], [per_band.get("large", 0), per_band.get("small", 0)])
    deadline = time.monotonic() + timeout
    while (found := _counts(node, customers)) != want:
        assert time.monotonic() < deadline, f"counts {found} never reached {want}:\n{node.log.read_text()[-3000:]}"
        time.sleep(1)


@pytest.fixture(scope="module")
def on_spark(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[StandaloneCluster, NodeProcess, Orders]]:
    home = tmp_path_factory.mktemp("onspark")
    cluster = StandaloneCluster(home / "spark").start()
    try:
        cluster.add_worker()
        topic = make_topic(PARTITIONS, prefix="onspark")
        orders = Orders(broker, topic)
        (home / "clusterapp.py").write_text(
            textwrap.dedent(USER_APP.format(topic=topic, partitions=PARTITIONS, servers=broker.bootstrap_servers))
        )
        orders.send(1_000)
        flags = ["--spark-master", cluster.url, "--spark-conf", "spark.driver.host=127.0.0.1"]
        flags += ["--spark-conf", "spark.executor.memory=768m", "--spark-conf", "spark.cores.max=2"]
        node = start_node(home, "clusterapp", "node-0", free_port(), flags)
        try:
            wait_ready([node], timeout=300)
            yield cluster, node, orders
        finally:
            node.kill()
    finally:
        cluster.stop()


def test_values_computed_on_executors_with_the_users_function_equal_the_ground_truth(
    on_spark: tuple[StandaloneCluster, NodeProcess, Orders],
) -> None:
    cluster, node, orders = on_spark
    _reach_the_ground_truth(node, orders, timeout=120)
    assert "ModuleNotFoundError" not in node.log.read_text()
    executors = list((cluster.home / "worker-0").glob("app-*/*/stderr"))
    assert executors, "no executor ran on the worker: the node did not use the cluster"


def test_a_worker_killed_mid_stream_is_survived_and_the_stores_stay_exact(
    on_spark: tuple[StandaloneCluster, NodeProcess, Orders],
) -> None:
    cluster, node, orders = on_spark
    answered: list[int] = []
    failed: list[Any] = []
    stop = threading.Event()

    def ask() -> None:
        customers = sorted(orders.truth()[0])[:20]
        while not stop.is_set():
            try:
                _counts(node, customers)
                answered.append(1)
            except AssertionError as exc:
                failed.append(exc)
            time.sleep(0.2)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        orders.send(500)
        time.sleep(2)  # a batch of them under way on the executor
        cluster.kill_worker(cluster.workers[0])
        orders.send(500)
        time.sleep(5)
        cluster.add_worker()
        orders.send(500)
        _reach_the_ground_truth(node, orders, timeout=240)
    finally:
        stop.set()
        asker.join()
    assert answered and not failed, failed[:3]
    wait_ready([node], timeout=120)
    print("pipeline after the worker's death:", node.post("{ node { pipeline { state restarts lastError } } }"))


def test_every_store_built_on_the_cluster_equals_the_ground_truth(
    on_spark: tuple[StandaloneCluster, NodeProcess, Orders],
) -> None:
    _, node, orders = on_spark
    node.process.send_signal(signal.SIGTERM)  # a clean stop releases the stores for reading
    assert node.process.wait(timeout=120) == 0, node.log.read_text()[-3000:]
    shop = build_app(orders.topic, PARTITIONS)
    state = StateDirectory(node.log.parent / f"state-{node.id}", "onspark")
    partitions = [state.open(orders.topic, p, shop.specs(orders.topic)) for p in range(PARTITIONS)]
    try:
        assert sum(stores.db.next_offset() for stores in partitions) == len(orders.sent)
        for stores in partitions:
            stores.db.set_state(PartitionState.RUNNING)  # opened for reading, not restored: serve as stored
        assert_equal_to_ground_truth(shop, read_back(shop, partitions), orders.sent)
    finally:
        for stores in partitions:
            stores.close()
