"""Session-wide fixtures: one Apache Kafka broker, one SparkSession, uniquely named topics."""

from __future__ import annotations

import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from iqgraph.streaming.apache_kafka import KafkaBroker

#: make_topic(partitions=1, config=None, prefix="t") -> the name of a new topic on the session's broker.
MakeTopic = Callable[..., str]


@pytest.fixture(scope="session")
def broker() -> Iterator[KafkaBroker]:
    """Run one Apache Kafka broker (KRaft) for the whole test session."""
    from iqgraph.streaming.apache_kafka import KafkaBroker

    with KafkaBroker() as running:
        yield running


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> None:
    """Build Spark's class archive unless it is there (`iqgraph.streaming.jvm_archive`: ~45 s once per machine):
    each of the suite's ~100 Spark starts then maps it, ~5 s less each. Without it they start as before."""
    from iqgraph.streaming.jvm_archive import ArchiveError, build

    try:
        build()
    except (ArchiveError, subprocess.TimeoutExpired) as exc:  # test_jvm_archive fails on it; the rest runs
        warnings.warn(f"no class archive for Spark's JVM: {exc}", stacklevel=1)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Start one local[2] SparkSession for the whole test session (a JVM costs ~1 GB and ~8 s)."""
    from iqgraph.streaming.session import build_spark_session

    session = build_spark_session("local[2]", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def make_topic(broker: KafkaBroker) -> MakeTopic:
    """Return a factory that creates a uniquely named topic on the session's broker."""

    def make(partitions: int = 1, config: Mapping[str, str] | None = None, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        broker.create_topics({name: partitions}, config)
        return name

    return make
