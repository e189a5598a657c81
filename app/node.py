"""A node's lifecycle: state directory, Kafka check, Spark session, streaming queries, store queries.

The node's change feed (``streaming.change_feed``) lives as long as the node: every sink the runner makes
(restarts and reassignments included) publishes to it, and ``live`` follows it for subscriptions.

start() runs the steps in order and reports each through ``progress``: open() checks Kafka, joins, opens and
restores the hosted partitions and makes what serves them, while Spark starts in a thread; start_pipelines() then
starts the streaming queries. stop() undoes them (stop the queries, close RocksDB cleanly, stop Spark). Errors a
user can fix surface as NodeStartError with one line that says what to do.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from iqgraph.app.cluster.health import PeerHealth
from iqgraph.app.cluster.joining import membership_for
from iqgraph.app.cluster.membership import ClusterMap, Member, Membership, with_joined_tables
from iqgraph.app.cluster.peers import PeerClient
from iqgraph.app.cluster.replicas import PeerStates
from iqgraph.app.cluster.topic_watch import TopicWatch
from iqgraph.app.cluster.topics import (
    TopicCheckError,
    TopicCreationError,
    check_kafka_access,
    check_topics,
    create_app_topics,
)
from iqgraph.app.live.watch import Live
from iqgraph.app.metrics import NodeMetrics
from iqgraph.app.owner.calls import call_many
from iqgraph.app.owner.runner import OwnerFieldRunner
from iqgraph.app.pipeline_placement import PipelinePlacement
from iqgraph.app.query.partitions import LocalPartitions
from iqgraph.app.query.store_queries import ClusterStoreQueries, RetryPolicy
from iqgraph.app.restore_progress import ready_in, watch_restore
from iqgraph.app.security.tls import peer_verify
from iqgraph.app.settings import Settings
from iqgraph.app.supervisor import QuerySupervisor
from iqgraph.schema.types import PipelineInfo
from iqgraph.stores import PartitionState, StateDirectory, StoreError, UserError
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.definitions import App
from iqgraph.streaming.kafka_watch import KafkaWatch
from iqgraph.streaming.runner import RunnerSettings, StreamRunner

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from iqgraph.schema.types import NodeInfo

log = logging.getLogger(__name__)
T = TypeVar("T")
Progress = Callable[[str], None]


class NodeStartError(UserError, RuntimeError):
    """The node cannot start; the message says what to fix."""


class NodeState(enum.Enum):
    """Where a node is in its life."""

    CREATED = "CREATED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


class Node:
    """One iqgraph node: it keeps its partitions' stores and answers queries over them."""

    def __init__(self, settings: Settings, app: App, assignment: Mapping[str, Iterable[int]] | None = None) -> None:
        self.settings = settings
        self.app = app
        self.bootstrap_servers = settings.bootstrap_servers or app.kafka.bootstrap_servers
        self.assignment = assignment
        self.state = NodeState.CREATED
        self.timings: dict[str, float] = {"started": time.monotonic()}  # start-up steps, for the ready line
        self.spark: SparkSession | None = None
        self.runner: StreamRunner | None = None
        self.types: Mapping[str, Any] = {}  # each store's Spark value type, once Spark runs
        self.local: LocalPartitions | None = None
        self.queries: ClusterStoreQueries | None = None
        self.topic_watch: TopicWatch | None = None
        self.membership: Membership | None = None
        self.peers: PeerClient | None = None
        self.health: PeerHealth | None = None
        self.supervisor: QuerySupervisor | None = None
        self.kafka_watch: KafkaWatch | None = None
        self.start_failure: BaseException | None = None  # why the pipelines did not start (start(serve_first=True))
        self._spark_start: ThreadPoolExecutor | None = None
        self._spark_future: Future[SparkSession] | None = None  # the session starting while the node opens
        self._start_lock = threading.Lock()  # the pipelines start, or the node stops: not both
        # what each committed batch changed, for the subscriptions (at most max_subscriptions watches at once)
        self.change_feed = ChangeFeed(max_subscriptions=settings.max_subscriptions)
        self.live: Live | None = None
        self._hosted: dict[str, list[int]] = {}
        self._running: dict[str, list[int]] = {}  # the hosted partitions whose pipeline runs here
        self.placement = PipelinePlacement(
            settings.node_id,
            lambda: None if self.membership is None else self.membership.current(),
            self._fenced_since,
            self._look_again,
        )
        self.metrics = NodeMetrics(self._members, self._node_info, lambda: self.state.value, self._live_stats)

    def _members(self) -> Mapping[str, Member]:
        return {} if self.membership is None else self.membership.current().members

    def _node_info(self) -> NodeInfo | None:
        return None if self.local is None else self.local.node()

    def _client_config(self) -> dict[str, str]:
        return {**self.app.kafka.config, **self.settings.kafka, "bootstrap.servers": self.bootstrap_servers}

    def _create_topics(self, progress: Progress, changelogs: bool = False) -> None:
        """Create the app's missing topics (``--create-topics``), or only its changelog topics (at every start)."""
        try:
            for said in create_app_topics(self._client_config(), self.app, changelogs):
                progress(said)
        except TopicCreationError as exc:
            hint = "; --no-changelog keeps none" if changelogs else ""
            raise NodeStartError(f"{exc} (Kafka at {self.bootstrap_servers}{hint})") from None

    def check_topics(self) -> dict[str, list[int]]:
        """Return every topic's partitions; raise NodeStartError if Kafka or a topic is not as declared."""
        try:
            return check_topics(self._client_config(), self.app, self.bootstrap_servers)
        except TopicCheckError as exc:
            raise NodeStartError(str(exc)) from None

    def start(self, progress: Progress = log.info, serve_first: bool = False) -> None:
        """Start the node: join the cluster, open and restore its partitions and make what serves them (`open`),
        then, once Spark has started, run the streaming queries over them (`start_pipelines`).

        serve_first: return once the node can serve (its stores restored), and start the pipelines in a thread;
        a start error found there stops the node and is kept in `start_failure` (the server exits on it).
        """
        self.open(progress)
        if not serve_first:
            self.start_pipelines(progress)
            return
        thread = threading.Thread(target=self._start_pipelines_behind, args=(progress,), name="pipelines-start")
        thread.daemon = True
        thread.start()

    def open(self, progress: Progress = log.info) -> None:
        """Check Kafka, join the cluster, open and restore the hosted partitions, and make what serves reads over
        them; Spark starts meanwhile in a thread (`start_pipelines` waits for it). Nothing here needs Spark but a
        store whose value type only Spark's analysis can tell."""
        self.state = NodeState.STARTING
        self.timings["started"] = time.monotonic()
        try:
            state_dir = StateDirectory(self.settings.state_dir, self.app.name)
            self._runner_settings()  # a Kafka setting Spark's connector cannot take fails before anything starts
        except (StoreError, ValueError) as exc:
            raise NodeStartError(str(exc)) from None
        self._check(state_dir, progress)  # what fails in one line fails before the JVM starts (and says so)
        progress(f"starting Spark ({self.settings.spark_master}) while joining and restoring; this takes a few seconds")
        self._spark_start = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-start")
        self._spark_future = self._spark_start.submit(self._timed, "spark", self._spark)  # while the node joins
        try:
            assignment = self._join(state_dir, progress)
            self.timings["joined"] = time.monotonic() - self.timings["started"]
            self._open_partitions(state_dir, assignment)
            assert self.runner is not None  # noqa: S101 - opened above
            self._start_serving(self.runner)
        except BaseException:
            self.stop()
            raise
        self.timings["serving"] = time.monotonic() - self.timings["started"]

    def start_pipelines(self, progress: Progress = log.info) -> None:
        """Wait for Spark and start the streaming queries over the open partitions; the node is RUNNING then."""
        assert self.runner is not None and self.supervisor is not None  # noqa: S101 - opened first
        assert self._spark_future is not None and self._spark_start is not None  # noqa: S101 - submitted by open
        if not self._spark_future.done():
            progress("serving reads from the restored stores while Spark starts")
        try:
            spark = self._spark_future.result()
            self._spark_start.shutdown()
            with self._start_lock:
                if self.state is not NodeState.STARTING:
                    return  # stopped while Spark started: stop() stops it
                self.spark = spark
            progress(f"Spark ready in {self.timings['spark']:.1f} s; starting the streaming queries")
            started = time.monotonic()
            self.runner.use_spark(spark)
        except (StoreError, ValueError) as exc:  # DefinitionError is a ValueError
            self.stop()
            raise NodeStartError(str(exc)) from None
        except BaseException:
            self.stop()
            raise
        self.timings["queries"] = time.monotonic() - started
        with self._start_lock:
            if self.state is not NodeState.STARTING:
                return
            self.state = NodeState.RUNNING
        self.supervisor.start()
        if self.assignment is None and self.membership is not None:
            self._on_new_map(self.membership.current())  # a map that changed while the node started

    def _start_pipelines_behind(self, progress: Progress) -> None:
        """Start the pipelines (in a thread, the node serving); keep a start error in start_failure."""
        try:
            self.start_pipelines(progress)
        except BaseException as exc:  # noqa: BLE001 - kept for the server, which exits and raises it
            self.start_failure = exc

    def _check(self, state_dir: StateDirectory, progress: Progress) -> None:
        """Check Kafka and the topics (creating them if asked), and that no other process holds this state dir."""
        group = self.app.name if self.settings.membership == "kafka" else None
        try:  # a refused login or right: one line naming the grant, before anything is created or joined
            check_kafka_access(self._client_config(), self.app, self.settings.changelog, group)
        except TopicCheckError as exc:
            raise NodeStartError(str(exc)) from None
        if self.settings.create_topics:
            self._create_topics(progress)
        progress(f"checking Kafka at {self.bootstrap_servers}")
        self.check_topics()
        if self.settings.changelog:
            self._create_topics(progress, changelogs=True)
        try:
            for topic, partition in state_dir.partitions_on_disk():
                state_dir.check_unlocked(topic, partition)
        except StoreError as exc:
            raise NodeStartError(str(exc)) from None

    def _join(self, state_dir: StateDirectory, progress: Progress) -> Mapping[str, Iterable[int]]:
        """Join the cluster and return the partitions this node hosts (their stores unlocked)."""
        self.membership = self._membership()
        progress(f"joining the cluster ({self.settings.membership} membership)")
        try:
            self.membership.start()
        except RuntimeError as exc:  # GroupMembershipError: Kafka, topics or the group said no
            raise NodeStartError(f"cannot join the cluster: {exc}") from None
        assignment = self.assignment or self._hosted_in(self.membership.current())
        self._hosted = {t: sorted(ps) for t, ps in assignment.items()}
        self._running = self.placement.pipelines(self._hosted)
        try:
            for topic, partitions in assignment.items():
                for partition in partitions:
                    state_dir.check_unlocked(topic, partition)
        except StoreError as exc:
            raise NodeStartError(str(exc)) from None
        return assignment

    def _open_partitions(self, state_dir: StateDirectory, assignment: Mapping[str, Iterable[int]]) -> None:
        """Make the runner (no Spark yet) and open and restore the hosted partitions with it."""
        from iqgraph.streaming.static_types import NeedsSparkError, static_value_types

        try:
            try:  # from the declared schemas, as `iqgraph schema` does (equal to Spark's: test_schema_without_spark)
                self.types = static_value_types(self.app)
            except NeedsSparkError:  # a transform only Spark's analysis can type: wait for Spark
                from iqgraph.streaming.value_types import value_types

                assert self._spark_future is not None  # noqa: S101 - submitted by open
                self.types = value_types(self.app, self._spark_future.result())
            self.runner = StreamRunner(
                self.app,
                None,
                state_dir,
                self._runner_settings(),
                observer=self.metrics.batch_applied,
                change_feed=self.change_feed,
                role=self.placement.role,
            )
            self.runner.start(assignment)
        except (StoreError, ValueError) as exc:  # DefinitionError is a ValueError
            raise NodeStartError(str(exc)) from None

    def _timed(self, step: str, run: Callable[[], T]) -> T:
        """Return run(), keeping how long it took as timings[step]."""
        started = time.monotonic()
        try:
            return run()
        finally:
            self.timings[step] = time.monotonic() - started

    def _start_serving(self, runner: StreamRunner) -> None:
        """Make what serves reads, owner-side fields and subscriptions over the runner's partitions."""
        assert self.membership is not None  # noqa: S101 - joined
        watch = self.kafka_watch = KafkaWatch(self._client_config())
        watch.start()
        self.supervisor = QuerySupervisor(runner, kafka_reachable=watch.reachable)
        self.topic_watch = TopicWatch(
            runner.partitions,
            lambda topic, ps: runner.offsets(topic).latest(ps),
            self.app.kafka.partitioner,
            partition_count=lambda topic: len(runner.offsets(topic).partitions()),
        )
        self.topic_watch.start()
        self.local = LocalPartitions(
            self.app,
            runner.partitions,
            node_id=self.settings.node_id,
            url=self.settings.url,
            end_offset=self.topic_watch.end_offset,
            state=lambda: self.state.value,
            role=self._role,
            pipeline=self._pipeline,
            stall_timeout_s=self.settings.stall_timeout_s,
            owner=OwnerFieldRunner,
            kafka_away_since=lambda: watch.status().unreachable_since,
        )
        self.peers = PeerClient(
            self.settings.node_id,
            observer=self.metrics,
            verify=peer_verify(self.settings),
            secret=self.settings.cluster_secret,
        )
        peer_states = PeerStates()
        self.queries = ClusterStoreQueries(
            self.app,
            self.types,
            self.local,
            self.membership,
            self.peers,
            max_lag=self.settings.max_lag,
            retry=RetryPolicy(deadline_ms=self.settings.not_ready_deadline_ms),
            peer_states=peer_states,
            partitioner=self.topic_watch.partitioner,
            owner_calls=call_many,
        )
        self.live = Live(
            self.app,
            runner.partitions,
            self.change_feed,
            partitioner=self.topic_watch.partitioner,
            role=self._role,
            node_id=self.settings.node_id,
            queries=self.queries,
            peers=self.peers,
            lag=self._local_lag,
        )
        self.membership.subscribe(self._on_new_map)
        if len(self.membership.current().members) > 1 or self.settings.membership == "kafka":
            self.health = PeerHealth(self.membership, peer_states, verify=peer_verify(self.settings))
            self.health.start()

    def _membership(self) -> Membership:
        """Return the membership the settings ask for."""
        try:
            return membership_for(self.settings, self.app, self.bootstrap_servers, self._replicas)
        except ValueError as exc:
            raise NodeStartError(str(exc)) from None

    def _replicas(self) -> dict[tuple[str, int], tuple[str, int | None]]:
        """Return the state and lag of every hosted partition of a grouped topic (none before they open)."""
        local, runner = self.local, self.runner
        if local is None or runner is None:
            return {}
        grouped = {t.name for t in self.app.topics if not t.global_table}
        hosted = [(t, p) for t, ps in list(runner.partitions.items()) if t in grouped for p in list(ps)]
        return {(t, p): found for t, p in hosted if (found := local.replica(t, p)) is not None}

    def _pipeline(self) -> PipelineInfo | None:
        """Return how the streaming queries are doing: STARTING until they run, then the supervisor's account."""
        if self.runner is None or not self.runner.started or self.supervisor is None:
            return PipelineInfo("STARTING")
        return self.supervisor.status()

    def _live_stats(self) -> dict[str, int]:
        live = self.live
        return {
            "feed_subscriptions": self.change_feed.stats().subscriptions,
            "upstreams": 0 if live is None else len(live.relays),
            "change_upstreams": 0 if live is None else len(live.broadcasts),
        }

    def _local_lag(self, topic: str, partition: int) -> int | None:
        found = None if self.local is None else self.local.replica(topic, partition)
        return None if found is None else found[1]

    def _role(self, topic: str, partition: int) -> str:
        owners = self.membership.current().owners_of(topic, partition) if self.membership else None
        return "standby" if owners is not None and owners.active != self.settings.node_id else "active"

    def _look_again(self) -> None:
        if self.membership is not None:
            self._on_new_map(self.membership.current())

    def _fenced_since(self, topic: str, partition: int) -> float | None:
        return None if self.runner is None else self.runner.hosted.fenced_since(topic, partition)

    def _hosted_in(self, cmap: ClusterMap) -> dict[str, list[int]]:
        """Return the partitions this node hosts in cmap, with the co-partitioned tables its joins read."""
        return with_joined_tables(cmap.hosted_partitions(self.settings.node_id), self.app.copartitioned_joins())

    def _on_new_map(self, cmap: ClusterMap) -> None:
        """Restart the streaming queries when the partitions hosted here, or those whose pipeline runs here, change."""
        self.placement.track_down(cmap)
        hosted = {t: sorted(ps) for t, ps in self._hosted_in(cmap).items()}
        pipelines = self.placement.pipelines(hosted)
        unchanged = hosted == self._hosted and pipelines == self._running
        if unchanged or self.runner is None or self.state is not NodeState.RUNNING:
            return
        if hosted == self._hosted:
            log.warning("pipelines move: now applying %s (generation %d)", pipelines, cmap.generation)
            self._running = pipelines
            threading.Thread(target=self.runner.reassign, args=(hosted,), name="reassign", daemon=True).start()
            return
        self._running = pipelines
        log.warning("partitions move: now hosting %s (generation %d)", hosted, cmap.generation)
        self._hosted = hosted
        threading.Thread(target=self.runner.reassign, args=(hosted,), name="reassign", daemon=True).start()

    def watch_restore(self, progress: Progress, interval: float = 2.0) -> threading.Thread:
        """Say how the restore goes until every partition is queryable and the pipeline runs (``watch_restore``)."""
        return watch_restore(
            lambda: None if self.local is None else self.local.node(),
            lambda: self.state in (NodeState.STARTING, NodeState.RUNNING),
            self.ready_in,
            [t.name for t in self.app.topics if t.global_table],
            progress,
            interval,
        )

    def ready_in(self) -> str:
        """Return how long the node took to be ready, and where the time went when it was slow (``ready_in``)."""
        return ready_in(self.timings, time.monotonic())

    def _spark(self) -> SparkSession:
        from iqgraph.streaming.session import build_spark_session, ship_module

        spark = build_spark_session(
            self.settings.spark_master,
            shuffle_partitions=self.settings.shuffle_partitions,
            driver_memory=self.settings.driver_memory,
            app_name=f"iqgraph-{self.app.name}-{self.settings.node_id}",
            extra_conf=self.settings.spark_conf,
            kafka_connector=self.settings.kafka_source == "kafka",
        )
        if not self.settings.spark_master.startswith("local") and self.settings.app:
            ship_module(spark, self.settings.app.partition(":")[0])  # the user's functions, for the executors
        return spark

    def _runner_settings(self) -> RunnerSettings:
        return RunnerSettings(
            self.bootstrap_servers,
            kafka_config={**self.app.kafka.config, **self.settings.kafka},
            max_records_per_batch=self.settings.max_records_per_batch,
            source=self.settings.kafka_source,
            rebuild_lost=self.settings.rebuild_lost_partitions,
            changelog=self.settings.changelog,
            follow_changelog=self.settings.changelog,  # standbys follow it; a promoted one runs the pipeline
        )

    def ready(self, info: NodeInfo | None = None) -> bool:
        """Return whether the node answers fresh: its pipeline runs, and every partition is RUNNING, not stalled.
        While Kafka is away, a pipeline dead or stalled for it does not count: no node has anything newer to apply,
        and the stores answer (all nodes out of their load balancer at once would answer nothing).

        info: the node as ``local.node()`` just returned it (read again when not given).
        """
        if self.state is not NodeState.RUNNING or self.local is None:
            return False
        info = info or self.local.node()
        away = self.kafka_watch is not None and not self.kafka_watch.status().reachable
        if info.pipeline is not None and not info.pipeline.healthy and not away:
            return False
        return all(p.state == PartitionState.RUNNING.value and (away or not p.stalled) for p in info.partitions)

    def stop(self) -> None:
        """Stop the streaming queries, close every store cleanly, stop Spark (once started, if it is starting)."""
        with self._start_lock:
            if self.state in (NodeState.STOPPING, NodeState.STOPPED):
                return  # stopped already (a start that failed stops the node)
            self.state = NodeState.STOPPING
        if self.kafka_watch is not None:
            self.kafka_watch.stop()
        if self.supervisor is not None:
            self.supervisor.stop()  # before the queries stop on purpose
        if self.health is not None:
            self.health.stop()
        if self.topic_watch is not None:
            self.topic_watch.stop()
        if self.membership is not None:
            self.membership.stop()
        if self.runner is not None:
            self.runner.stop()
        spark = self.spark
        if spark is None and self._spark_future is not None:  # Spark still starting, or started and not used
            if not self._spark_future.done():
                log.warning("Spark is still starting: it is stopped as soon as it has started")
            spark = None if self._spark_future.exception() is not None else self._spark_future.result()
        if spark is not None:
            spark.stop()
        self.spark = None
        self.state = NodeState.STOPPED
