"""A node's Prometheus metrics: every metric's definition, in one registry per node, served at /metrics.

The node makes one ``NodeMetrics`` and hands its parts to what observes: the GraphQL schema
(``graphql``: requests, latency, errors, keys per lookup), the peer client (forwarded requests sent and
peer errors), the ASGI server (forwarded requests received) and the streaming sink (micro-batches and
bad records). Partition states, lag and restore progress already live in the node's stores: a
Collector reads them at scrape time. A registry per node, not the global one: several nodes and
schemas live in one process in tests.

Metrics (all prefixed ``iqgraph_``)::

    graphql_requests_total{field,store}              counter    per root field of each request
    graphql_request_duration_seconds{field,store}    histogram  the request's duration, per root field
    graphql_errors_total{code}                       counter    errors returned, by extensions.code
    lookup_keys{store}                               histogram  keys per batched lookup (DataLoader batch)
    forwarded_sent_total{peer}                       counter    sub-requests sent to a peer
    forwarded_received_total{peer}                   counter    forwarded sub-requests received
    peer_errors_total{peer,code}                     counter    sub-requests a peer failed or answered with an error
    batch_duration_seconds{topic}                    histogram  micro-batch: Spark job + merge into the stores
    batch_records{topic}                             histogram  records (offsets) applied per micro-batch
    bad_records_total{store}                         counter    bad records counted (invariant 7)
    requests_cut_total{reason}                       counter    requests cut short (too large, timeout, client gone)
    node_state{state}                                gauge      1 for the node's current state
    partitions{role,state}                           gauge      hosted partitions
    partition_lag_records{topic,partition,role}      gauge      records the partition's stores are behind
    partition_applied_offset{topic,partition}        gauge      next offset to apply
    partition_end_offset{topic,partition}            gauge      the topic's end offset
    restore_remaining_records                        gauge      records left to apply by partitions not RUNNING
    partition_seconds_since_applied{topic,partition} gauge      seconds since the partition's last applied batch
    partition_stalled{topic,partition}               gauge      1 when records wait and no batch came for too long
    partition_lost_offsets{topic,partition,first_offset,end_offset}
                                                     gauge      offsets Kafka deleted before the partition applied
                                                                them (retention): DATA_LOST, or rebuilt without them
    pipeline_up                                      gauge      1 while the streaming queries run (0: DEAD)
    pipeline_restarts_total                          counter    restarts of dead streaming queries by the supervisor
    pipeline_deaths_in_a_row                         gauge      deaths since the queries last ran for a while
    kafka_reachable                                  gauge      1 while Kafka answers the node's probe (every second)
    kafka_unreachable_since_seconds                  gauge      unix time since when Kafka has not answered (only
                                                                while it does not: `time() - …` is the outage)

While Kafka does not answer, the partition gauges keep the end offsets last read (``app.cluster.topic_watch``): the
lag stays the lag as of Kafka's last answer, and ``kafka_unreachable_since_seconds`` says since when.

The ``peer`` label is a node id of the cluster map, or ``unknown``. Peers do not authenticate yet, so the
forwarded header a request carries is a claim anyone can make: it names the label only when it is a
member's id (bounded cardinality), and until peers authenticate, a client can still inflate a real
member's count by sending its id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from iqgraph.schema.metrics import GraphQLMetrics, metric_code
from iqgraph.stores import PartitionState
from iqgraph.stores.changelog import RESTORES, RestoreProgress
from iqgraph.streaming.kafka_offsets import KafkaSourceError
from iqgraph.streaming.kafka_watch import KafkaStatus

if TYPE_CHECKING:
    from iqgraph.app.cluster.membership import Member
    from iqgraph.schema.types import NodeInfo
    from iqgraph.streaming.sink import BatchReport

log = logging.getLogger(__name__)

UNKNOWN_PEER = "unknown"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
KEYS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000)
BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_RECORDS_BUCKETS = (1, 10, 100, 1_000, 10_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)

Members = Callable[[], Mapping[str, "Member"]]
NodeView = Callable[[], "NodeInfo | None"]
KafkaView = Callable[[], KafkaStatus | None]


class NodeMetrics:
    """Every metric of one node, in its own registry; the observers the node's parts call."""

    def __init__(
        self,
        members: Members,
        node: NodeView,
        state: Callable[[], str],
        live: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        self._members = members
        registry = self.registry
        self.graphql = GraphQLMetrics(
            Counter(
                "iqgraph_graphql_requests", "GraphQL requests, per root field", ["field", "store"], registry=registry
            ),
            Histogram(
                "iqgraph_graphql_request_duration_seconds",
                "GraphQL request duration, per root field",
                ["field", "store"],
                registry=registry,
                buckets=LATENCY_BUCKETS,
            ),
            Counter(
                "iqgraph_graphql_errors", "GraphQL errors returned, by extensions.code", ["code"], registry=registry
            ),
            Histogram(
                "iqgraph_lookup_keys", "Keys per batched lookup", ["store"], registry=registry, buckets=KEYS_BUCKETS
            ),
        )
        self.sent = Counter("iqgraph_forwarded_sent", "Forwarded sub-requests sent", ["peer"], registry=registry)
        self.received = Counter(
            "iqgraph_forwarded_received", "Forwarded sub-requests received", ["peer"], registry=registry
        )
        self.peer_errors = Counter(
            "iqgraph_peer_errors", "Forwarded sub-requests that failed, by code", ["peer", "code"], registry=registry
        )
        self.batch_duration = Histogram(
            "iqgraph_batch_duration_seconds",
            "Micro-batch duration: Spark job and merge into the stores",
            ["topic"],
            registry=registry,
            buckets=BATCH_SECONDS_BUCKETS,
        )
        self.batch_records = Histogram(
            "iqgraph_batch_records",
            "Records (offsets) applied per micro-batch",
            ["topic"],
            registry=registry,
            buckets=BATCH_RECORDS_BUCKETS,
        )
        self.bad_records = Counter("iqgraph_bad_records", "Bad records counted", ["store"], registry=registry)
        self.requests_cut = Counter(
            "iqgraph_requests_cut",
            "HTTP requests cut short before an answer, by reason (headers or body too large, timeout, client gone)",
            ["reason"],
            registry=registry,
        )
        registry.register(NodeStateCollector(node, state))
        registry.register(LiveCollector(live))
        self.kafka = KafkaCollector()
        registry.register(self.kafka)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)

    def peer_of_id(self, node_id: str | None) -> str:
        """Return node_id as a peer label: itself when it is a member's id, else ``unknown``."""
        return node_id if node_id is not None and node_id in self._members() else UNKNOWN_PEER

    def peer_of_url(self, url: str) -> str:
        """Return the id of the member at url as a peer label, else ``unknown``."""
        return next((m.id for m in self._members().values() if m.url == url), UNKNOWN_PEER)

    def request_cut(self, reason: str) -> None:
        """Count a request the guard cut short (app.http.request_guard's reasons)."""
        self.requests_cut.labels(reason).inc()

    def forwarded_received(self, claimed: str | None) -> None:
        """Count a forwarded sub-request from the peer its signature authenticated (app.security.peer_auth)."""
        self.received.labels(self.peer_of_id(claimed)).inc()

    def sent_to(self, url: str) -> None:
        """Count a sub-request sent to the peer at url."""
        self.sent.labels(self.peer_of_url(url)).inc()

    def failed(self, url: str, code: str) -> None:
        """Count a sub-request the peer at url failed (NODE_UNAVAILABLE) or answered with an error code."""
        self.peer_errors.labels(self.peer_of_url(url), metric_code(code)).inc()

    def batch_applied(self, report: BatchReport) -> None:
        """Record one applied micro-batch (the streaming sink's observer)."""
        self.batch_duration.labels(report.topic).observe(report.duration_s)
        self.batch_records.labels(report.topic).observe(report.records)
        for store, count in report.bad.items():
            self.bad_records.labels(store).inc(count)


class KafkaCollector:
    """Collect, at scrape time, whether Kafka answers the node and since when it does not (nothing until ``watch``
    is given what to read: the node's ``streaming.kafka_watch.KafkaWatch.status``)."""

    def __init__(self, status: KafkaView = lambda: None) -> None:
        self._status = status

    def watch(self, status: KafkaView) -> None:
        """Read Kafka's reach from status at every scrape."""
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        if status is None:
            return
        yield GaugeMetricFamily(
            "iqgraph_kafka_reachable", "1 while Kafka answers the node's probe", value=int(status.reachable)
        )
        if status.unreachable_since is not None:
            yield GaugeMetricFamily(
                "iqgraph_kafka_unreachable_since_seconds",
                "Unix time since when Kafka has not answered the node (present only while it does not)",
                value=status.unreachable_since,
            )


class LiveCollector:
    """Collect, at scrape time, the live subscriptions' gauges (``app.live.watch``: feed subscriptions, upstreams)."""

    HELP = {
        "feed_subscriptions": "Subscriptions to this node's change feed (local watches and peers' upstreams)",
        "upstreams": "Streams this node follows on peers for its watches (one per peer, topic, caller and copy)",
        "change_upstreams": "Streams of changed-key counts this node follows on peers (one per peer, store, caller)",
    }

    def __init__(self, stats: Callable[[], Mapping[str, int]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        for name, value in self._stats().items():
            yield GaugeMetricFamily(f"iqgraph_live_{name}", self.HELP.get(name, name), value=value)


class NodeStateCollector:
    """Collect, at scrape time, the node's state and its partitions' states, offsets, lag and restore progress."""

    def __init__(self, node: NodeView, state: Callable[[], str]) -> None:
        self._node = node
        self._state = state

    def collect(self) -> Iterator[Metric]:
        """Yield the node and partition gauges (partition gauges only once the node hosts partitions)."""
        current = self._state()
        states = GaugeMetricFamily("iqgraph_node_state", "1 for the node's current state", labels=["state"])
        states.add_metric([current], 1)
        yield states
        try:
            info = self._node()
        except KafkaSourceError as exc:  # the end offsets come from Kafka: a scrape must not fail with it
            log.warning("partition metrics left out of this scrape: %s", exc)
            return
        if info is not None:
            yield from partition_metrics(info)
            yield from pipeline_metrics(info)
            yield from changelog_metrics()


def pipeline_metrics(info: NodeInfo) -> Iterator[Metric]:
    """Yield the streaming pipeline's gauges and restart counter (nothing before the node starts it)."""
    pipeline = info.pipeline
    if pipeline is None:
        return
    yield GaugeMetricFamily(
        "iqgraph_pipeline_up", "1 while the streaming queries run (0: DEAD)", value=int(pipeline.state == "RUNNING")
    )
    yield CounterMetricFamily(
        "iqgraph_pipeline_restarts", "Restarts of dead streaming queries by the supervisor", value=pipeline.restarts
    )
    yield GaugeMetricFamily(
        "iqgraph_pipeline_deaths_in_a_row",
        "Deaths since the queries last ran for a while",
        value=pipeline.deaths_in_a_row,
    )


def partition_metrics(info: NodeInfo) -> Iterator[Metric]:
    """Yield the gauges of info's partitions: count per role and state, lag, offsets, restore progress."""
    counts = GaugeMetricFamily("iqgraph_partitions", "Hosted partitions, by role and state", labels=["role", "state"])
    lag = GaugeMetricFamily(
        "iqgraph_partition_lag_records",
        "Records the partition's stores are behind",
        labels=["topic", "partition", "role"],
    )
    applied = GaugeMetricFamily(
        "iqgraph_partition_applied_offset", "Next offset to apply", labels=["topic", "partition"]
    )
    end = GaugeMetricFamily("iqgraph_partition_end_offset", "The topic's end offset", labels=["topic", "partition"])
    since = GaugeMetricFamily(
        "iqgraph_partition_seconds_since_applied",
        "Seconds since the partition's last applied batch (or its opening)",
        labels=["topic", "partition"],
    )
    stalled = GaugeMetricFamily(
        "iqgraph_partition_stalled",
        "1 when records wait and no batch was applied for longer than the stall timeout",
        labels=["topic", "partition"],
    )
    lost = GaugeMetricFamily(
        "iqgraph_partition_lost_offsets",
        "Offsets [first_offset, end_offset) Kafka deleted before the partition applied them (retention): the "
        "partition is DATA_LOST, or was rebuilt from the earliest offset without them",
        labels=["topic", "partition", "first_offset", "end_offset"],
    )
    tally: dict[tuple[str, str], int] = {(role, s.value): 0 for role in ("active", "standby") for s in PartitionState}
    remaining = 0
    for p in info.partitions:
        tally[(p.role, p.state)] = tally.get((p.role, p.state), 0) + 1
        lag.add_metric([p.topic, str(p.partition), p.role], p.lag)
        applied.add_metric([p.topic, str(p.partition)], p.applied_offset)
        end.add_metric([p.topic, str(p.partition)], p.end_offset)
        since.add_metric([p.topic, str(p.partition)], p.seconds_since_applied)
        stalled.add_metric([p.topic, str(p.partition)], int(p.stalled))
        if p.lost is not None:
            lost.add_metric([p.topic, str(p.partition), str(p.lost[0]), str(p.lost[1])], p.lost[1] - p.lost[0])
        if p.state != PartitionState.RUNNING.value:
            remaining += p.lag
    for (role, state), count in sorted(tally.items()):
        counts.add_metric([role, state], count)
    restore = GaugeMetricFamily(
        "iqgraph_restore_remaining_records", "Records left to apply by partitions not yet RUNNING", value=remaining
    )
    yield from (counts, lag, applied, end, since, stalled, lost, restore)


def changelog_metrics(restores: Mapping[tuple[str, int], RestoreProgress] | None = None) -> Iterator[Metric]:
    """Yield the gauges of the copies kept from changelogs (``streaming.changelog``): where each is in its
    changelog, the changelog's end it restores to, and the restore's progress (records, bytes, rate, ETA)."""
    restores = RESTORES if restores is None else restores
    labels = ["changelog", "partition"]
    position = GaugeMetricFamily(
        "iqgraph_changelog_position", "Next changelog offset the copy reads (a standby follows on)", labels=labels
    )
    end = GaugeMetricFamily(
        "iqgraph_changelog_end_offset", "The changelog end offset the copy restores to (last seen)", labels=labels
    )
    lag = GaugeMetricFamily(
        "iqgraph_changelog_restore_remaining_offsets", "Changelog offsets left to the restore's end", labels=labels
    )
    records = GaugeMetricFamily(
        "iqgraph_changelog_restored_records", "Changelog records applied since the copy was opened", labels=labels
    )
    size = GaugeMetricFamily(
        "iqgraph_changelog_restored_bytes", "Bytes of changelog records applied since opened", labels=labels
    )
    rate = GaugeMetricFamily("iqgraph_changelog_restore_rate", "Records applied per second", labels=labels)
    eta = GaugeMetricFamily(
        "iqgraph_changelog_restore_eta_seconds", "Seconds left to the restore's end at its rate", labels=labels
    )
    for (changelog, partition), progress in sorted(restores.items()):
        at = [changelog, str(partition)]
        position.add_metric(at, progress.position)
        end.add_metric(at, progress.target)
        lag.add_metric(at, max(progress.target - progress.position, 0))
        records.add_metric(at, progress.records)
        size.add_metric(at, progress.bytes)
        rate.add_metric(at, progress.rate)
        eta.add_metric(at, progress.eta_s or 0.0)
    yield from (position, end, lag, records, size, rate, eta)


def scrape(metrics: NodeMetrics) -> bytes:
    """Return the node's metrics in the Prometheus text exposition format."""
    return generate_latest(metrics.registry)
