"""Start real `iqgraph serve` node processes on loopback for cluster tests (and the cluster benchmark)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from iqgraph.streaming.broker import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scrape:
    """One scrape of a node's /metrics (Prometheus text format): each sample's value by name and labels."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        """Return the sample's value, 0 when the node has not reported it."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def labels(self, name: str) -> list[dict[str, str]]:
        """Return the label sets of every sample called name."""
        return [dict(labels) for sample, labels in self.samples if sample == name]


def scrape(url: str) -> Scrape:
    """Return the parsed /metrics of the node at url."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    families = text_string_to_metric_families(response.text)
    return Scrape({(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples})


@dataclass
class NodeProcess:
    """One node: its id, URL, process and log."""

    id: str
    url: str
    process: subprocess.Popen[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)  # what the node's environment adds to ours
    headers: dict[str, str] = field(default_factory=dict)  # what post() sends (e.g. its credentials)

    def post(self, query: str, variables: dict[str, Any] | None = None, **headers: str) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": variables or {}},
            headers={**self.headers, **headers},
            timeout=60,
        )
        result: dict[str, Any] = response.json()
        return result

    def metrics(self) -> Scrape:
        return scrape(self.url)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


#: The secret the test clusters' nodes authenticate each other with (app.peer_auth).
CLUSTER_SECRET = "test-cluster-secret"  # noqa: S105 - a test cluster's


def write_app_module(home: Path, name: str, topic: str, partitions: int, bootstrap: str) -> None:
    """Write a module `name` in home whose `app` is the shop example on topic."""
    (home / f"{name}.py").write_text(
        textwrap.dedent(f"""
        from iqgraph.examples.shop import build_app
        from iqgraph.streaming.definitions import KafkaSettings
        app = build_app({topic!r}, {partitions}, KafkaSettings(bootstrap_servers={bootstrap!r}))
    """)
    )


def start_node(
    home: Path,
    module: str,
    node_id: str,
    port: int,
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> NodeProcess:
    """Start one `iqgraph serve` node of app module:app on port, its state and log in home.

    env: more environment for the node; headers: what the returned NodeProcess's post() sends.
    """
    log = home / f"{node_id}.log"
    command = [
        sys.executable, "-m", "iqgraph.app.cli", "serve", "--app", f"{module}:app", "--port", str(port),
        "--node-id", node_id, "--state-dir", str(home / f"state-{node_id}"),
        "--spark-master", "local[1]", "--driver-memory", "768m", *flags,
    ]  # fmt: skip
    added = {"PYTHONPATH": str(home), "IQGRAPH_CLUSTER_SECRET": CLUSTER_SECRET, **(env or {})}
    process = subprocess.Popen(
        command, cwd=home, env={**os.environ, **added}, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return NodeProcess(node_id, f"http://127.0.0.1:{port}", process, log, added, dict(headers or {}))


def start_nodes(
    home: Path,
    module: str,
    count: int,
    extra: Sequence[Sequence[str]] = (),
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> list[NodeProcess]:
    """Start count nodes of one static cluster (extra[i]: more flags for node i; env, headers: start_node's)."""
    ports = [free_port() for _ in range(count)]
    peers = ",".join(f"node-{i}=http://127.0.0.1:{port}" for i, port in enumerate(ports))
    return [
        start_node(
            home, module, f"node-{i}", port, ["--peers", peers, *(extra[i] if i < len(extra) else [])], env, headers
        )
        for i, port in enumerate(ports)
    ]


def wait_ready(nodes: Sequence[NodeProcess], timeout: float = 300) -> None:
    """Wait until every node answers /readyz with 200."""
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending and time.monotonic() < deadline:
        for node in list(pending):
            if node.process.poll() is not None:
                raise AssertionError(f"{node.id} exited {node.process.returncode}:\n{node.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{node.url}/readyz", timeout=2).status_code == 200:
                    pending.remove(node)
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    if pending:
        raise AssertionError(
            f"not ready after {timeout} s: {[n.id for n in pending]}\n"
            + "\n".join(n.log.read_text()[-2000:] for n in pending)
        )


def restart_node(node: NodeProcess) -> NodeProcess:
    """Start a stopped node again: the same command (port, peers, state directory, flags), its log appended."""
    home = node.log.parent
    process = subprocess.Popen(
        node.process.args, cwd=home, env={**os.environ, **node.env}, stdout=node.log.open("a"),
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return NodeProcess(node.id, node.url, process, node.log, node.env, node.headers)
