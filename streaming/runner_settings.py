"""How a node's streaming queries run and its hosted partitions are kept (`RunnerSettings`).

Read by the partition lifecycle (``streaming.hosted_partitions``: changelogs, retention, rebuilds) and the query
runner (``streaming.runner``: the source, batch sizes, the trigger).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from iqgraph.streaming.kafka_client_config import java_consumer_options


@dataclass(frozen=True)
class RunnerSettings:
    """How the streaming queries run."""

    bootstrap_servers: str
    kafka_config: Mapping[str, str] | None = None
    producer_config: Mapping[str, str] | None = None
    max_records_per_batch: int = 200_000
    trigger_interval: str = "0 seconds"
    source: str = "kafka"  # Spark's JVM connector (its jars in the session), or "iqkafka": the Python Data Source
    rebuild_lost: bool = False  # rebuild a partition whose unapplied records Kafka deleted (else: DATA_LOST)
    changelog: bool = True  # batches go to the changelog topics; copies restore from them
    # standbys apply the changelog instead of running the pipeline (False: they run it, writing nothing to it)
    follow_changelog: bool = False

    def __post_init__(self) -> None:
        if self.source not in ("iqkafka", "kafka"):
            raise ValueError(f"source must be 'iqkafka' (ours) or 'kafka' (Spark's JVM connector), not {self.source!r}")
        if self.source == "kafka":  # a setting the JVM client cannot take fails now, in one line, not at a query
            java_consumer_options(self.client_config)

    @property
    def client_config(self) -> dict[str, str]:
        """Return the Python Kafka clients' configuration: the app's and user's settings, the bootstrap servers."""
        return {**(self.kafka_config or {}), "bootstrap.servers": self.bootstrap_servers}
