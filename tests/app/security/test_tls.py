"""TLS: the server's certificate checks, how peers are verified, and two real nodes over HTTPS with a test CA."""

from __future__ import annotations

import functools
import itertools
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
import uvicorn
from cryptography.hazmat.primitives import serialization
from prometheus_client.parser import text_string_to_metric_families
from ruamel.yaml import YAML

from iqgraph.app.security.tls import peer_verify, server_options
from iqgraph.app.settings import ENV_PREFIX, Settings, SettingsError
from iqgraph.examples.shop import build_app
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port
from iqgraph.streaming.partitioner import partition_for
from tests.conftest import MakeTopic
from tests.support.compose import COMPOSE, check_jsonschema
from tests.support.ground_truth import Expected, expected
from tests.support.nodes import ROOT, NodeProcess, Scrape, start_node, write_app_module
from tests.support.pipeline import START_MS, send
from tests.support.servers import serve_in_thread


@dataclass(frozen=True)
class Pki:
    """Files of a test CA, of another CA that signed nothing here, and of one certificate per node."""

    home: Path
    ca: Path
    other_ca: Path

    def client(self, ca: Path | None = None) -> httpx.Client:
        """Return a client that trusts the test CA (or the bundle ca) only."""
        return httpx.Client(verify=ssl.create_default_context(cafile=ca or self.ca), timeout=60)

    def cert(self, name: str) -> Path:
        return self.home / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.home / f"{name}.key"

    def flags(self, name: str, trusted: Path) -> list[str]:
        """Return a node's flags to serve name's certificate and trust the bundle trusted."""
        return ["--tls-cert", str(self.cert(name)), "--tls-key", str(self.key(name)), "--tls-ca", str(trusted)]


def make_pki(home: Path, names: tuple[str, ...]) -> Pki:
    """Write a test CA, an unrelated CA, and for each name a chain and key for 127.0.0.1/localhost in home."""
    ca, other = trustme.CA(), trustme.CA()
    pki = Pki(home, home / "ca.pem", home / "other-ca.pem")
    ca.cert_pem.write_to_path(pki.ca)
    other.cert_pem.write_to_path(pki.other_ca)
    for name in names:
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        pki.cert(name).write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(pki.key(name))
    return pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path, ("node", "other"))


def test_plain_http_has_no_server_options_and_peers_are_verified_against_the_system_store() -> None:
    assert server_options(Settings()) == {}
    assert peer_verify(Settings()) is True


def test_a_certificate_and_its_key_are_uvicorns_ssl_options(pki: Pki) -> None:
    options = server_options(Settings(tls_cert=pki.cert("node"), tls_key=pki.key("node")))
    assert options == {"ssl_certfile": str(pki.cert("node")), "ssl_keyfile": str(pki.key("node"))}
    config = uvicorn.Config(_hello, **options)
    config.load()
    assert isinstance(config.ssl, ssl.SSLContext)


def test_peers_are_verified_against_the_ca_bundle_with_one_context_per_file(pki: Pki) -> None:
    context = peer_verify(Settings(tls_ca=pki.ca))
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert peer_verify(Settings(tls_ca=pki.ca, node_id="node-1")) is context  # the PeerClient's and PeerHealth's
    assert peer_verify(Settings(tls_ca=pki.other_ca)) is not context


def _encrypt(key: Path, into: Path) -> Path:
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    encryption = serialization.BestAvailableEncryption(b"secret")
    into.write_bytes(loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return into


@pytest.mark.parametrize(
    ("cert", "key", "message"),
    [
        ("missing.pem", "node.key", "--tls-cert missing.pem: No such file or directory"),
        ("node.pem", "missing.key", "--tls-key missing.key: No such file or directory"),
        ("node.key", "node.pem", "--tls-cert node.key is not a PEM certificate chain"),
        ("node.pem", "node.pem", "--tls-key node.pem is not an unencrypted PEM private key"),
        ("node.pem", "other.key", "--tls-key other.key is not the private key of --tls-cert node.pem"),
        ("ca.pem", "node.key", "is not the private key"),  # the CA's certificate instead of the node's
        ("node.pem", "encrypted.key", "--tls-key encrypted.key is encrypted; give the key unencrypted"),
    ],
)
def test_a_bad_certificate_or_key_is_a_settings_error_naming_the_flag(
    pki: Pki, cert: str, key: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _encrypt(pki.key("node"), pki.home / "encrypted.key")
    monkeypatch.chdir(pki.home)
    with pytest.raises(SettingsError, match=message):
        server_options(Settings(tls_cert=Path(cert), tls_key=Path(key)))


@pytest.mark.parametrize("bundle", ["missing.pem", "node.key", "empty.pem"])
def test_a_ca_bundle_that_is_missing_or_holds_no_certificate_is_a_settings_error(pki: Pki, bundle: str) -> None:
    (pki.home / "empty.pem").write_text("")
    with pytest.raises(SettingsError, match=f"--tls-ca {pki.home / bundle}"):
        peer_verify(Settings(tls_ca=pki.home / bundle))


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


@contextmanager
def https_server(settings: Settings) -> Iterator[str]:
    """Serve a hello app in a thread with the settings' server options; yield its https URL."""
    with serve_in_thread(_hello, lifespan="off", log_level="critical", **server_options(settings)) as url:
        yield url


def test_a_server_with_a_test_ca_certificate_is_trusted_by_peers_that_trust_the_ca_only(pki: Pki) -> None:
    with https_server(Settings(tls_cert=pki.cert("node"), tls_key=pki.key("node"))) as url:
        with httpx.Client(verify=peer_verify(Settings(tls_ca=pki.ca))) as peer:
            assert peer.get(url).text == "hello"
            assert peer.get(url.replace("127.0.0.1", "localhost")).text == "hello"
        for verify in (peer_verify(Settings(tls_ca=pki.other_ca)), True):
            with httpx.Client(verify=verify) as stranger, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY"):
                stranger.get(url)
        with pytest.raises(httpx.TransportError):
            httpx.get(url.replace("https:", "http:"), timeout=5)


# --- the docker-compose overlay ------------------------------------------------------------------------------

OVERLAY = ROOT / "docker-compose.tls.yml"


@pytest.fixture(scope="module")
def overlay() -> dict[str, Any]:
    loaded: dict[str, Any] = YAML(typ="safe").load(OVERLAY.read_text())
    return loaded


def test_the_compose_tls_overlay_is_valid_and_gives_the_nodes_a_certificate_a_key_and_a_ca(
    overlay: dict[str, Any],
) -> None:
    result = check_jsonschema(OVERLAY)
    assert result.returncode == 0, result.stdout + result.stderr
    node = overlay["services"]["node"]
    assert {name.removeprefix(ENV_PREFIX).lower() for name in node["environment"]} == {"tls_cert", "tls_key", "tls_ca"}
    assert node["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    assert (
        '--advertised-url "https://' in node["command"][0]
        and "https://localhost:8000/" in node["healthcheck"]["test"][3]
    )
    assert "docker-compose.tls.yml" in COMPOSE.read_text()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the overlay's scripts run openssl")
def test_the_overlays_scripts_make_certificates_the_node_serves_and_peers_and_health_check_verify(
    overlay: dict[str, Any], tmp_path: Path
) -> None:
    here = {
        "/certs": str(tmp_path / "certs"),
        "/var/lib/iqgraph": str(tmp_path / "var"),
        "exec iqgraph": "echo iqgraph",
    }

    def local(text: str) -> str:  # the container's paths in tmp_path; compose's $$ is $
        return functools.reduce(lambda t, pair: t.replace(*pair), here.items(), text.replace("$$", "$"))

    def run(script: str) -> str:
        done = subprocess.run(["/bin/sh", "-c", local(script)], cwd=here["/certs"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    (tmp_path / "certs").mkdir()
    services = overlay["services"]
    run(services["certs"]["command"][0])
    ca = (tmp_path / "certs" / "ca.pem").read_bytes()
    run(services["certs"]["command"][0])
    assert (tmp_path / "certs" / "ca.pem").read_bytes() == ca  # made once, kept across restarts
    assert "--advertised-url https://" in run(services["node"]["command"][0])
    env = {name.removeprefix(ENV_PREFIX).lower(): Path(local(v)) for name, v in services["node"]["environment"].items()}
    settings = Settings(**env)
    strict = ssl.create_default_context(cafile=settings.tls_ca)
    strict.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default
    with https_server(settings) as url, httpx.Client(verify=strict) as peer:
        assert peer.get(url).text == "hello"
        port = url.rsplit(":", 1)[1]
        check = local(services["node"]["healthcheck"]["test"][3]).replace("localhost:8000", f"localhost:{port}")
        assert subprocess.run([sys.executable, "-c", check], capture_output=True, timeout=30).returncode == 0


# --- two real nodes over HTTPS ---------------------------------------------------------------------------------

PARTITIONS = 4
EVENTS = 1_000
GET_MANY = "query($k: [String!]!) { orderCount { getMany(keys: $k) } }"


@dataclass(frozen=True)
class TlsCluster:
    """node-0 trusts the test CA that signed both nodes' certificates; node-1 trusts another CA only."""

    nodes: list[NodeProcess]
    pki: Pki
    truth: Expected

    def keys_of(self, owner: str) -> list[str]:
        """Return the keys of order_count whose partition is active on owner (partition p on node-(p % 2))."""
        counts = self.truth.kv["order_count"]
        return [k for k in sorted(counts) if f"node-{partition_for(k, PARTITIONS, 'string', 'murmur2') % 2}" == owner]


@pytest.fixture(scope="module")
def tls_cluster(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsCluster]:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(17, START_MS), EVENTS))
    send(broker, topic, events)
    home = tmp_path_factory.mktemp("tls")
    pki = make_pki(home, ("node-0", "node-1"))
    write_app_module(home, "tlsapp", topic, PARTITIONS, broker.bootstrap_servers)
    ports = [free_port(), free_port()]
    peers = ",".join(f"node-{i}=https://127.0.0.1:{port}" for i, port in enumerate(ports))
    nodes = []
    for i, (port, trusted) in enumerate(zip(ports, (pki.ca, pki.other_ca), strict=True)):
        flags = ["--peers", peers, *pki.flags(f"node-{i}", trusted)]
        node = start_node(home, "tlsapp", f"node-{i}", port, flags)
        nodes.append(replace(node, url=f"https://127.0.0.1:{port}"))
    try:
        with pki.client() as client:
            _wait_ready(client, nodes)
        yield TlsCluster(nodes, pki, expected(app, events))
    finally:
        for node in nodes:
            node.kill()


def _wait_ready(client: httpx.Client, nodes: list[NodeProcess], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(_ready(client, node) for node in nodes):
        exited = [node for node in nodes if node.process.poll() is not None]
        if exited or time.monotonic() > deadline:
            raise AssertionError("\n".join(f"{n.id}:\n{n.log.read_text()[-3000:]}" for n in exited or nodes))
        time.sleep(0.5)


def _ready(client: httpx.Client, node: NodeProcess) -> bool:
    try:
        return client.get(f"{node.url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _post(client: httpx.Client, node: NodeProcess, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = client.post(f"{node.url}/graphql", json={"query": query, "variables": variables}).json()
    return body


def _scrape(client: httpx.Client, node: NodeProcess) -> Scrape:
    families = text_string_to_metric_families(client.get(f"{node.url}/metrics").text)
    return Scrape({(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples})


@pytest.mark.slow
def test_a_client_trusting_the_test_ca_reads_forwarded_keys_over_https_equal_to_the_truth(
    tls_cluster: TlsCluster,
) -> None:
    node0, node1 = tls_cluster.nodes
    counts = tls_cluster.truth.kv["order_count"]
    remote = tls_cluster.keys_of("node-1")
    assert remote and tls_cluster.keys_of("node-0")
    with tls_cluster.pki.client() as client:
        before = _scrape(client, node1).value("iqgraph_forwarded_received_total", peer="node-0")
        body = _post(client, node0, GET_MANY, {"k": remote})
        assert body == {"data": {"orderCount": {"getMany": [counts[k] for k in remote]}}}
        body = _post(client, node0, GET_MANY, {"k": sorted(counts)})
        assert body["data"]["orderCount"]["getMany"] == [counts[k] for k in sorted(counts)]
        after = _scrape(client, node1).value("iqgraph_forwarded_received_total", peer="node-0")
        assert after - before == 2  # each read of node-1's keys went to node-1, over HTTPS
        nodes = _post(client, node0, "{ nodes { id url state } }", {})["data"]["nodes"]
    assert nodes == [{"id": n.id, "url": n.url, "state": "RUNNING"} for n in tls_cluster.nodes]


@pytest.mark.slow
def test_clients_without_the_ca_and_plain_http_are_refused_on_both_listeners(tls_cluster: TlsCluster) -> None:
    url = tls_cluster.nodes[0].url
    with tls_cluster.pki.client() as trusted:
        peer_url = f"{url.rsplit(':', 1)[0]}:{trusted.get(f'{url}/healthz').json()['peerPort']}"  # HTTPS as well
        assert peer_url.startswith("https://127.0.0.1:") and peer_url != url
        unsigned = trusted.post(f"{peer_url}/internal/graphql", json={"query": "{ node { id } }"})
        assert unsigned.status_code == 401  # reached over HTTPS with the CA; refused for lack of a signature
    for address, path in ((url, "/readyz"), (peer_url, "/internal/graphql")):
        for client in (httpx.Client(), tls_cluster.pki.client(tls_cluster.pki.other_ca)):
            with client, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                client.post(f"{address}{path}")
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{address.replace('https:', 'http:')}{path}", timeout=5)


@pytest.mark.slow
def test_a_node_that_cannot_verify_its_peer_fails_forwarded_reads_with_a_code_never_a_wrong_answer(
    tls_cluster: TlsCluster,
) -> None:
    node1 = tls_cluster.nodes[1]
    counts = tls_cluster.truth.kv["order_count"]
    local, remote = tls_cluster.keys_of("node-1"), tls_cluster.keys_of("node-0")
    failed = {"name": "iqgraph_peer_errors_total", "peer": "node-0", "code": "NODE_UNAVAILABLE"}
    with tls_cluster.pki.client() as client:
        own = _post(client, node1, GET_MANY, {"k": local})
        body = _post(client, node1, GET_MANY, {"k": remote[:3]})
        before = _scrape(client, node1).value(**failed)
        nodes = _post(client, node1, "{ nodes { id state } }", {})["data"]["nodes"]
        after = _scrape(client, node1).value(**failed)
    assert own == {"data": {"orderCount": {"getMany": [counts[k] for k in local]}}}
    assert body["data"] == {"orderCount": {"getMany": [None, None, None]}}, body
    # node-1's health checks cannot verify node-0 either: node-0 is down to it, its partitions not available
    # (a read sent before the first check fails the handshake: NODE_UNAVAILABLE).
    assert {e["extensions"]["code"] for e in body["errors"]} <= {"STORE_NOT_AVAILABLE", "NODE_UNAVAILABLE"}, body
    assert len(body["errors"]) == 3, body
    assert nodes == [{"id": "node-0", "state": "DOWN"}, {"id": "node-1", "state": "RUNNING"}]
    assert after - before == 1  # the sub-request asking node-0 about itself failed the handshake
