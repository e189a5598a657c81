"""Node settings: frozen, typed, built once from flags, environment variables and an optional TOML file.

Precedence: command-line flags, then ``IQGRAPH_*`` environment variables, then the TOML file
(``--config`` or ``IQGRAPH_CONFIG``; keys as below, in a top-level table or under ``[iqgraph]``),
then defaults. Every environment variable name lives in this module.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from iqgraph.stores import UserError
from iqgraph.streaming.kafka_jars import unrunnable_spark_conf

ENV_PREFIX = "IQGRAPH_"
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
#: Settings that are tables of another system's settings; each source adds to (or overrides keys of) the last.
#: From the environment: IQGRAPH_KAFKA_SOCKET_TIMEOUT_MS=… is kafka's socket.timeout.ms,
#: IQGRAPH_SPARK_CONF_SPARK_EXECUTOR_MEMORY=… is spark_conf's spark.executor.memory (lower-case keys only).
MAPPINGS = {"kafka": "librdkafka settings", "spark_conf": "Spark settings"}


#: The request limits (schema.limits.Limits) a node takes from its settings, beside max_keys and the page sizes.
LIMITS = ("max_aliases", "max_depth", "max_tokens", "max_body_bytes", "max_header_bytes", "request_timeout_ms")


#: The shortest cluster secret accepted, and the example one docker-compose.yml sets (refused with auth on).
MIN_CLUSTER_SECRET = 16
#: HS256's key is at least as long as its hash (RFC 7518 §3.2).
MIN_JWT_SECRET_BYTES = 32
EXAMPLE_CLUSTER_SECRET = "change-me-dev-only"  # noqa: S105 - refused, not used
#: Where the peers' listener is by default: the client port + this (8000: 18000), out of the way of the ports
#: Kafka's tools use (8081-8088, 9000-9100).
PEER_PORT_OFFSET = 10_000


class SettingsError(UserError, ValueError):
    """Settings that cannot be used; the message says which one and how to fix it."""


@dataclass(frozen=True)
class Settings:
    """Everything a node needs to run."""

    app: str = ""
    host: str = "127.0.0.1"
    port: int = 8000
    state_dir: Path = Path("state")
    bootstrap_servers: str | None = None
    node_id: str = "node-0"
    advertised_url: str | None = None
    peer_port: int | None = None  # peers' listener (/internal/* only); None: port + PEER_PORT_OFFSET
    advertised_peer_url: str | None = None  # the URL peers reach the peer listener at (default: url's host)
    spark_master: str = "local[*]"
    driver_memory: str = "1g"
    shuffle_partitions: int = 2
    max_records_per_batch: int = 200_000
    kafka_source: str = "kafka"  # Spark's connector; "iqkafka": the Python Data Source (streaming.kafka_source)
    max_keys: int = 1_000
    max_page_size: int = 1_000
    default_page_size: int = 100
    max_aliases: int = 100  # aliased fields in one document
    max_depth: int = 20  # nested selections of one operation
    max_tokens: int = 20_000  # tokens of one GraphQL document
    max_body_bytes: int = 4 << 20  # a request body (4 MiB)
    max_header_bytes: int = 32 << 10  # a request's headers and query string (32 KiB)
    request_timeout_ms: int = 30_000  # a request's deadline
    header_timeout_s: float = 10.0  # a connection's request head (line and headers) must arrive within this
    keep_alive_timeout_s: int = 5  # an idle kept-alive connection is closed after this
    max_connections: int = 4_096  # open connections of the listener at most (one more: 503, closed)
    max_subscriptions: int = 16_384  # live watches the node follows at once (one more: LIMIT_EXCEEDED)
    not_ready_deadline_ms: int = 2_000
    raw_endpoint: bool = False
    compiled: bool = True  # queries a compiled plan covers skip graphql-core's executor (IQGRAPH_COMPILED=false: off)
    membership: str = "static"  # "static" (--peers) or "kafka" (consumer group, as Kafka Streams)
    peers: str | None = None  # id=URL,… (or URL,… named node-0, node-1, … in order); None: a single node
    standbys: int = 0
    max_lag: int | None = None  # records a standby may be behind and still answer; None: no stale reads
    stall_timeout_s: int = 60  # not ready when records wait and no batch was applied for this long
    group_session_timeout_ms: int = 10_000  # kafka membership: Kafka refuses < 6000 by default
    # kafka membership: "classic" (any broker) or "consumer" (KIP-848: Kafka 4.0+; its session timeout is the
    # group's config on the broker, which refuses < 45000 by default; README "Kafka-group membership")
    group_protocol: str = "classic"
    tracing: bool = False  # spans through every hop over OTLP (schema.tracing), with the tracing extra installed
    federation: bool = False  # an Apollo Federation v2 subgraph: entities with @key, _service, _entities
    tracing_documents: bool = False  # a request's span carries its GraphQL document (documents may hold literals)
    create_topics: bool = False  # create missing input topics at start (production topics are provisioned)
    # a partition whose unapplied records Kafka deleted (retention) is DATA_LOST (queries get the code); with this,
    # it is rebuilt from the topic's earliest offset (README: "Records Kafka deleted before a node applied them")
    rebuild_lost_partitions: bool = False
    # every batch's state changes go, in one Kafka transaction, to the app's compacted changelog topics; copies
    # restore from them and standbys follow them (streaming.changelog). False: copies replay the input topics
    changelog: bool = True
    # security (docs/security.md): client authentication, per-store authorization, peers, TLS
    auth: str = "none"  # "none", or the methods clients may use: "jwt", "api-key" or "jwt,api-key"
    jwt_secret: str | None = None  # HS256's shared secret (prefer IQGRAPH_JWT_SECRET to a flag)
    jwt_jwks: str | None = None  # RS256/ES256: a JWKS file path or http(s) URL (cached, refreshed on unknown kid)
    jwt_issuer: str | None = None  # the iss every token must have (required with jwt)
    jwt_audience: str | None = None  # the aud every token must have (required with jwt)
    jwt_leeway_s: int = 30  # clock skew allowed on exp, nbf and iat
    scope_claim: str = "scope"  # the claim holding the caller's scopes: read:<store>, read:*
    api_keys: Path | None = None  # TOML: [keys.<name>] sha256 = "<hex of the key's SHA-256>", scopes = [...]
    introspection: bool = True  # false: the schema cannot be introspected (GraphiQL, codegen need it)
    # trusted documents (schema.persisted): a manifest of {sha256: document} loaded and compiled at start;
    # with only_trusted_documents no other document runs (README "Production clients")
    trusted_documents: Path | None = None
    only_trusted_documents: bool = False
    cluster_secret: str | None = None  # peers sign sub-requests with it (required with peers or kafka)
    tls_cert: Path | None = None  # serve HTTPS with this certificate chain (PEM) ...
    tls_key: Path | None = None  # ... and its private key (PEM)
    tls_ca: Path | None = None  # verify peers' certificates against this CA bundle (PEM; default: system's)
    kafka: Mapping[str, str] = field(default_factory=dict)
    spark_conf: Mapping[str, str] = field(default_factory=dict)  # passed to the SparkSession (--spark-conf K=V)

    @property
    def url(self) -> str:
        """Return the URL peers and clients reach this node at."""
        scheme = "http" if self.tls_cert is None else "https"
        return self.advertised_url or f"{scheme}://{self.host}:{self.port}"

    @property
    def has_peers(self) -> bool:
        """Return whether the node is one of a cluster (static peers or a Kafka group): it opens a peer listener."""
        return self.peers is not None or self.membership == "kafka"

    @property
    def peer_listen_port(self) -> int:
        """Return the port of the peers' listener: --peer-port, or the client port + PEER_PORT_OFFSET."""
        return self.peer_port if self.peer_port is not None else self.port + PEER_PORT_OFFSET

    @property
    def peer_url(self) -> str:
        """Return the URL of this node's peer listener: --advertised-peer-url (which /healthz then tells peers as
        ``peerUrl``), else the node's URL's host with the peer port (peers use the host they reached it at)."""
        if self.advertised_peer_url:
            return self.advertised_peer_url.rstrip("/")
        parts = urlsplit(self.url)
        host = parts.hostname or self.host
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}:{self.peer_listen_port}"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise SettingsError(f"port {self.port} is out of range; use 1-65535 (--port / {ENV_PREFIX}PORT)")
        if self.has_peers and not 0 < self.peer_listen_port < 65536:
            raise SettingsError(
                f"the peer listener's port {self.peer_listen_port} (port + {PEER_PORT_OFFSET}) is out of range: "
                f"set --peer-port / {ENV_PREFIX}PEER_PORT (1-65535)"
            )
        if self.has_peers and self.peer_listen_port == self.port:
            raise SettingsError(
                f"peer_port {self.peer_listen_port} is the client port: peers need a listener of their own "
                "(--peer-port)"
            )
        positive = (
            "max_records_per_batch",
            "max_keys",
            "max_page_size",
            "default_page_size",
            "shuffle_partitions",
            *LIMITS,
        )
        bounds = ("stall_timeout_s", "header_timeout_s", "keep_alive_timeout_s", "max_connections", "max_subscriptions")
        for name in (*positive, *bounds):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive (--{name.replace('_', '-')})")
        if self.kafka_source not in ("kafka", "iqkafka"):
            raise SettingsError(
                f"kafka_source must be 'kafka' (Spark's connector) or 'iqkafka' (the Python source), "
                f"not {self.kafka_source!r} (--kafka-source)"
            )
        if self.membership not in ("static", "kafka"):
            raise SettingsError(f"membership must be 'static' or 'kafka', not {self.membership!r} (--membership)")
        if self.group_protocol not in ("classic", "consumer"):
            raise SettingsError(
                f"group_protocol must be 'classic' or 'consumer' (KIP-848), not {self.group_protocol!r} "
                f"(--group-protocol / {ENV_PREFIX}GROUP_PROTOCOL)"
            )
        if self.standbys < 0 or (self.max_lag is not None and self.max_lag < 0):
            raise SettingsError("standbys and max_lag must not be negative (--standbys, --max-lag)")
        if self.default_page_size > self.max_page_size:
            raise SettingsError("default_page_size must not exceed max_page_size")
        if unrunnable := unrunnable_spark_conf(self.spark_conf):
            raise SettingsError(unrunnable)
        self._check_security()

    @property
    def auth_methods(self) -> frozenset[str]:
        """Return the authentication methods clients may use (empty: authentication is off)."""
        return frozenset() if self.auth == "none" else frozenset(m.strip() for m in self.auth.split(","))

    def describe_security(self) -> str:
        """Return one line saying whether clients must authenticate, and how peers and clients connect."""
        if self.auth_methods:
            auth = f"auth on ({', '.join(sorted(self.auth_methods))}): clients need credentials"
        else:
            auth = "auth off: any client may read every store (docs/security.md turns it on)"
        introspection = "" if self.introspection else "; introspection off"
        return f"{auth}{introspection}; {'HTTPS' if self.tls_cert else 'plain HTTP'}"

    def _check_security(self) -> None:
        methods = self.auth_methods
        if not methods <= {"jwt", "api-key"} or not methods and self.auth != "none":
            raise SettingsError(f"auth must be 'none', 'jwt', 'api-key' or 'jwt,api-key', not {self.auth!r} (--auth)")
        if "jwt" in methods:
            if (self.jwt_secret is None) == (self.jwt_jwks is None):
                raise SettingsError(
                    "auth jwt needs one of jwt_secret (HS256) or jwt_jwks (RS256/ES256 keys): "
                    f"set {ENV_PREFIX}JWT_SECRET or --jwt-jwks"
                )
            if not self.jwt_issuer or not self.jwt_audience:
                raise SettingsError("auth jwt needs the tokens' issuer and audience: --jwt-issuer, --jwt-audience")
            if self.jwt_secret is not None and len(self.jwt_secret.encode()) < MIN_JWT_SECRET_BYTES:
                raise SettingsError(
                    f"jwt_secret must be at least {MIN_JWT_SECRET_BYTES} bytes ({ENV_PREFIX}JWT_SECRET)"
                )
        if "api-key" in methods and self.api_keys is None:
            raise SettingsError("auth api-key needs a keys file: --api-keys FILE (docs/security.md)")
        if self.jwt_leeway_s < 0:
            raise SettingsError("jwt_leeway_s must not be negative (--jwt-leeway-s)")
        if (self.peers is not None or self.membership == "kafka") and not self.cluster_secret:
            raise SettingsError(
                "a node with peers needs the cluster's shared secret to authenticate them: "
                f"set {ENV_PREFIX}CLUSTER_SECRET (the same on every node)"
            )
        if self.cluster_secret is not None and len(self.cluster_secret) < MIN_CLUSTER_SECRET:
            raise SettingsError(f"{ENV_PREFIX}CLUSTER_SECRET must be at least {MIN_CLUSTER_SECRET} characters")
        if methods and self.cluster_secret == EXAMPLE_CLUSTER_SECRET:
            raise SettingsError(
                f"{ENV_PREFIX}CLUSTER_SECRET is docker-compose.yml's example: with auth on, anyone could sign as a "
                "peer; set your own (e.g. in .env: openssl rand -base64 32)"
            )
        if self.only_trusted_documents and self.trusted_documents is None:
            raise SettingsError(
                "only_trusted_documents needs the manifest of the documents to trust: --trusted-documents FILE"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SettingsError("TLS needs both a certificate and its key: --tls-cert and --tls-key")


def _convert(name: str, raw: Any, kind: Any) -> Any:
    if kind in ("int | None",) and raw in (None, "", "none", "None"):
        return None
    if kind in (int, "int", "int | None"):
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if kind in (float, "float"):
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if kind in (bool, "bool"):
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise SettingsError(f"{name} must be true or false, got {raw!r}")
        return str(raw).lower() in ("1", "true", "yes")
    if kind in (Path, "Path"):
        return Path(str(raw))
    if kind in ("Path | None",):
        return None if raw in (None, "") else Path(str(raw))
    if name in MAPPINGS:
        if not isinstance(raw, Mapping):
            raise SettingsError(f"{name} must be a table of {MAPPINGS[name]}, e.g. [iqgraph.{name}]")
        return {str(k): str(v) for k, v in raw.items()}
    return None if raw is None else str(raw)


def _from_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    table = data.get("iqgraph", data)
    return {k.replace("-", "_"): v for k, v in table.items()}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in env.items():
        if key.startswith(ENV_PREFIX) and key != CONFIG_ENV:
            name = key[len(ENV_PREFIX) :].lower()
            table = next((t for t in MAPPINGS if name.startswith(f"{t}_")), None)
            if table is not None:
                values.setdefault(table, {})[name[len(table) + 1 :].replace("_", ".")] = value
            elif name in known:
                values[name] = value
    return values


def first_port(flag: int | None, env: Mapping[str, str] | None = None) -> int:
    """Return the port of `dev`'s and `demo`'s first node: --port, else IQGRAPH_PORT, else a node's default."""
    env = os.environ if env is None else env
    raw = flag if flag is not None else env.get(f"{ENV_PREFIX}PORT") or Settings().port
    return dataclasses.replace(Settings(), port=_convert("port", raw, int)).port  # Settings checks the range


def load_settings(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None, config: Path | None = None
) -> Settings:
    """Return settings from flags (None = not given), environment and config file, validated."""
    env = os.environ if env is None else env
    config = config or (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    merged: dict[str, Any] = {}
    for source in (_from_file(config), _from_env(env), {k: v for k, v in flags.items() if v is not None}):
        for name, value in source.items():
            if name in MAPPINGS and isinstance(value, Mapping) and isinstance(merged.get(name), Mapping):
                value = {**merged[name], **value}
            merged[name] = value
    kinds = {f.name: f.type for f in fields(Settings)}
    unknown = sorted(set(merged) - set(kinds))
    if unknown:
        raise SettingsError(f"unknown settings {unknown}; known: {sorted(kinds)}")
    return dataclasses.replace(Settings(), **{k: _convert(k, v, kinds[k]) for k, v in merged.items()})
