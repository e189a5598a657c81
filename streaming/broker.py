"""Kafka helpers for the demo, the tests and the benchmarks: produce records, and run broker subprocesses.

The brokers themselves are Apache Kafka (``streaming.apache_kafka``: ``KafkaBroker``, ``KafkaCluster``).
Producers batch as Kafka producers do; ``JAVA_PARTITIONER`` places keyed records as Kafka's Java client does.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import socket
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

from confluent_kafka import KafkaError, Message, Producer

from iqgraph.stores import UserError

__all__ = [
    "BATCHING",
    "JAVA_PARTITIONER",
    "BrokerError",
    "exit_with_parent",
    "Record",
    "free_port",
    "free_ports",
    "produce",
]

log = logging.getLogger(__name__)

#: Ordinary producer batching (a short linger; every record acknowledged by the in-sync replicas, once).
BATCHING: Final[Mapping[str, Any]] = MappingProxyType({"linger.ms": 5, "acks": "all", "enable.idempotence": True})
#: Partition keyed records the way Kafka's Java client does (murmur2), which is what routing assumes.
JAVA_PARTITIONER: Final[Mapping[str, Any]] = MappingProxyType({"partitioner": "murmur2_random"})

#: A record to produce: (key, value, partition); partition None lets the partitioner choose.
Record = tuple[bytes | None, bytes | None, int | None]

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# looked up here, in the parent: between fork and exec the child only calls it (no dlopen, no lock to wait for)
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


class BrokerError(UserError, RuntimeError):
    """The embedded broker could not be started, or a request to it failed."""


def exit_with_parent() -> None:
    """Ask Linux to SIGTERM this (child) process when its parent dies: a killed parent leaves no orphan.

    Meant as a ``Popen(preexec_fn=…)``; elsewhere than Linux it does nothing (the parent's clean stop remains).
    """
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on host that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, taken: Collection[int] = (), host: str = "127.0.0.1") -> list[int]:
    """Return count distinct TCP ports on host that are free right now, none of them in taken (the kernel may hand
    out a port it just freed again: ports taken one at a time can collide)."""
    ports: list[int] = []
    avoid = set(taken)
    while len(ports) < count:
        port = free_port(host)
        if port not in avoid:
            avoid.add(port)
            ports.append(port)
    return ports


def produce(bootstrap: str, topic: str, records: Iterable[Record], config: Mapping[str, Any] | None = None) -> int:
    """Produce records (batched), wait until all are delivered and return how many were sent."""
    producer = Producer({**JAVA_PARTITIONER, **BATCHING, **(config or {}), "bootstrap.servers": bootstrap})
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    count = 0
    for key, value, partition in records:
        _produce_one(producer, topic, key, value, partition, on_delivery)
        count += 1
    undelivered = producer.flush(30.0)
    if errors or undelivered:
        raise BrokerError(f"{len(errors)} records failed, {undelivered} undelivered: {errors[:3]}")
    return count


def _produce_one(
    producer: Producer,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    partition: int | None,
    on_delivery: Callable[[KafkaError | None, Message], None],
) -> None:
    """Enqueue one record, serving delivery reports while the local queue is full."""
    kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery}
    if partition is not None:
        kwargs["partition"] = partition
    while True:
        try:
            producer.produce(topic, **kwargs)
        except BufferError:
            producer.poll(0.1)
            continue
        producer.poll(0)
        return
