"""Start real `iqgraph serve` node processes on loopback for the node and cluster tests (and the benchmarks), with a
deadline on every wait."""

from __future__ import annotations

import os
import re
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

from iqgraph.streaming.broker import free_ports

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

    @property
    def peer_url(self) -> str:
        """Return where the node's peer listener is, as its /healthz tells peers (its port on this host)."""
        port = httpx.get(f"{self.url}/healthz", timeout=10).json()["peerPort"]
        return f"{self.url.rsplit(':', 1)[0]}:{port}"

    def kill(self, timeout: float = 60) -> None:
        """Kill the node (SIGKILL) and wait until it has exited."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout)


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


def start_serve(
    home: Path,
    module: str,
    port: int,
    flags: Sequence[str] = (),
    *,
    log: Path,
    node_id: str = "node-0",
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> NodeProcess:
    """Start `iqgraph serve --app module:app --port port *flags` in home (its modules importable), output in log.

    node_id: what the returned NodeProcess is called (the --node-id flag names the node itself); env: more
    environment for the node; headers: what the returned NodeProcess's post() sends.
    """
    command = [sys.executable, "-m", "iqgraph.app.cli", "serve", "--app", f"{module}:app", "--port", str(port), *flags]
    added = {"PYTHONPATH": str(home), **(env or {})}
    process = _spawn(command, home, added, log, "w")
    return NodeProcess(node_id, f"http://127.0.0.1:{port}", process, log, added, dict(headers or {}))


def start_node(
    home: Path,
    module: str,
    node_id: str,
    port: int,
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> NodeProcess:
    """Start one cluster node of app module:app on port, its state and log in home: local[1] Spark with 768 MB, the
    test clusters' secret.

    env: more environment for the node; headers: what the returned NodeProcess's post() sends.
    """
    node_flags = [
        "--node-id", node_id, "--state-dir", str(home / f"state-{node_id}"),
        "--spark-master", "local[1]", "--driver-memory", "768m", *flags,
    ]  # fmt: skip
    if "--peer-port" not in flags:  # the test's free ports are ephemeral ones: + 10000 may be past 65535
        node_flags += ["--peer-port", str(free_ports(1, {port})[0])]
    node_env = {"IQGRAPH_CLUSTER_SECRET": CLUSTER_SECRET, **(env or {})}
    log = home / f"{node_id}.log"
    return start_serve(home, module, port, node_flags, log=log, node_id=node_id, env=node_env, headers=headers)


def start_nodes(
    home: Path,
    module: str,
    count: int,
    extra: Sequence[Sequence[str]] = (),
    env: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> list[NodeProcess]:
    """Start count nodes of one static cluster (extra[i]: more flags for node i; env, headers: start_node's)."""
    ports = free_ports(2 * count)  # each node's, then each node's peers' listener's
    peers = ",".join(f"node-{i}=http://127.0.0.1:{port}" for i, port in enumerate(ports[:count]))
    return [
        start_node(
            home,
            module,
            f"node-{i}",
            port,
            ["--peers", peers, *_peer_port(extra[i] if i < len(extra) else [], ports[count + i])],
            env,
            headers,
        )  # fmt: skip
        for i, port in enumerate(ports[:count])
    ]


def _peer_port(flags: Sequence[str], port: int) -> list[str]:
    """Return flags with --peer-port port unless they name one."""
    return list(flags) if "--peer-port" in flags else [*flags, "--peer-port", str(port)]


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
    process = _spawn(node.process.args, node.log.parent, node.env, node.log, "a")
    return NodeProcess(node.id, node.url, process, node.log, node.env, node.headers)


#: What a clean stop never logs: a Python traceback or warning, a log line at WARN or ERROR (Python, Spark, uvicorn,
#: librdkafka), a Java exception or stack frame.
_STOP_NOISE = re.compile(
    r"Traceback|Error|Exception|Warning|never awaited|\b(WARN|WARNING|ERROR)\b|^%[0-4]\||^\s+at [\w$.]+\(|^Caused by",
    re.M,
)


def stop_noise(log: str) -> list[str]:
    """Return the lines of a node's log (from the stop signal on) that a clean stop would not have written."""
    return [line for line in log.splitlines() if _STOP_NOISE.search(line)]


def _spawn(command: Any, home: Path, env: Mapping[str, str], log: Path, mode: str) -> subprocess.Popen[str]:
    """Run command in home with env added to ours, its output and errors written (mode "w") or appended to log."""
    with log.open(mode) as out:
        return subprocess.Popen(
            command, cwd=home, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, text=True
        )
