"""The ``iqgraph`` command line: serve, dev, demo, schema, produce.

Every command turns the errors a user can fix (``iqgraph.UserError``) into one line on stderr and exit code 2 —
never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from iqgraph.app.dev.data_file import BadLine
from iqgraph.app.loading import AppLoadError, load_app
from iqgraph.app.settings import Settings, SettingsError, first_port, load_settings
from iqgraph.stores import StoreError, UserError
from iqgraph.streaming.definitions import App

#: Turned into one line on stderr and exit code 2: every error a user can fix at start (iqgraph.UserError: the
#: app, its settings, the broker, the topics, …), and what the stores or Kafka refuse while a node starts.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, StoreError, KafkaException)


def _node_flags(parser: argparse.ArgumentParser) -> None:
    """Add a node's flags (``iqgraph serve``), in the groups its ``--help`` shows."""
    parser.add_argument("--app", help="the app to run, as package.module:attribute (e.g. iqgraph.examples.shop:app)")
    parser.add_argument("--config", type=Path, help="a TOML settings file")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    _http_flags(parser)
    _limit_flags(parser)
    _kafka_flags(parser)
    _storage_flags(parser)
    _spark_flags(parser)
    _cluster_flags(parser)
    _security_flags(parser)


def _http_flags(parser: argparse.ArgumentParser) -> None:
    http = parser.add_argument_group("HTTP", "the clients' listener, its connections and requests")
    http.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    http.add_argument("--port", type=int, help="port to listen on (default 8000)")
    http.add_argument("--advertised-url", help="the URL clients reach this node at")
    http.add_argument("--request-timeout-ms", type=int, help="a request's deadline (default 30000)")
    http.add_argument(
        "--header-timeout-s", type=float, help="a connection's request headers must arrive within this (default 10)"
    )
    http.add_argument("--keep-alive-timeout-s", type=int, help="an idle kept-alive connection's life (default 5)")
    http.add_argument(
        "--max-connections", type=int, help="open client connections at most; one more gets 503 (default 4096)"
    )
    http.add_argument("--max-body-bytes", type=int, help="request body bytes at most (default 4 MiB)")
    http.add_argument("--max-header-bytes", type=int, help="request header bytes at most (default 32 KiB)")
    http.add_argument(
        "--federation",
        action="store_true",
        default=None,
        help="serve an Apollo Federation v2 subgraph: entities with @key, _service and _entities",
    )


def _limit_flags(parser: argparse.ArgumentParser) -> None:
    limits = parser.add_argument_group("query limits", "what one GraphQL document or subscription may ask")
    limits.add_argument("--max-keys", type=int, help="keys per getMany at most (default 1000)")
    limits.add_argument("--max-page-size", type=int, help="page size at most (default 1000)")
    limits.add_argument("--max-aliases", type=int, help="aliased fields per document at most (default 100)")
    limits.add_argument("--max-depth", type=int, help="nested selections per operation at most (default 20)")
    limits.add_argument("--max-tokens", type=int, help="tokens per GraphQL document at most (default 20000)")
    limits.add_argument(
        "--max-subscriptions", type=int, help="live watches followed at once; one more is refused (default 16384)"
    )


def _kafka_flags(parser: argparse.ArgumentParser) -> None:
    kafka = parser.add_argument_group("Kafka", "the cluster the app's topics are read from")
    kafka.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (default: the app's)")
    kafka.add_argument(
        "--create-topics",
        action="store_true",
        default=None,
        help="create the app's input topics if missing (off: production topics are provisioned)",
    )


def _storage_flags(parser: argparse.ArgumentParser) -> None:
    storage = parser.add_argument_group("storage", "the node's RocksDB stores, and how a copy is restored")
    storage.add_argument("--state-dir", type=Path, help="where the node keeps its RocksDB stores (default ./state)")
    storage.add_argument(
        "--no-changelog",
        dest="changelog",
        action="store_false",
        default=None,
        help="keep no changelog topics: a copy rebuilds its stores by replaying the input topics (what they still "
        "hold), and standbys run the pipeline",
    )
    storage.add_argument(
        "--rebuild-lost-partitions",
        action="store_true",
        default=None,
        help="rebuild a partition from the topic's earliest offset when Kafka deleted records it had not applied "
        "(retention); without it the partition answers DATA_LOST",
    )


def _spark_flags(parser: argparse.ArgumentParser) -> None:
    spark = parser.add_argument_group("Spark", "the node's streaming queries")
    spark.add_argument("--spark-master", help="Spark master (default local[*])")
    spark.add_argument("--driver-memory", help="Spark driver memory (default 1g)")
    spark.add_argument(
        "--spark-conf",
        action="append",
        metavar="KEY=VALUE",
        help="a Spark setting for the node's session, e.g. spark.executor.memory=2g (repeat for more)",
    )
    spark.add_argument("--max-records-per-batch", type=int, help="records per micro-batch at most")
    spark.add_argument(
        "--kafka-source", choices=["kafka", "iqkafka"], help="Spark's Kafka connector (default) or the Python source"
    )
    spark.add_argument(
        "--stall-timeout-s",
        type=int,
        help="not ready (/readyz 503) when records wait and no batch was applied for this many seconds (default 60)",
    )


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("cluster", "the nodes, who serves which partition, and the peers' listener")
    cluster.add_argument("--node-id", help="this node's id (default node-0)")
    cluster.add_argument(
        "--peer-port", type=int, help="port of the peers' listener, /internal/* only (default: --port + 10000)"
    )
    cluster.add_argument(
        "--advertised-peer-url", help="the URL peers reach the peer listener at (default: the advertised URL's host)"
    )
    cluster.add_argument("--membership", choices=["static", "kafka"], help="how nodes find each other (default static)")
    cluster.add_argument("--peers", help="static membership: every node as id=URL (or URLs: node-0, node-1, …)")
    cluster.add_argument("--standbys", type=int, help="standby copies of each partition on other nodes (default 0)")
    cluster.add_argument(
        "--max-lag",
        type=int,
        help="default staleness bound: a standby may answer (when the active cannot) if at most this many records "
        "behind; a query's maxLag overrides it (default: standbys do not answer)",
    )
    cluster.add_argument("--group-session-timeout-ms", type=int, help="kafka membership: session timeout (10000)")
    cluster.add_argument(
        "--group-protocol",
        choices=["classic", "consumer"],
        help="kafka membership: the group's rebalance protocol, classic (default) or consumer (KIP-848, Kafka 4.0+)",
    )


def _security_flags(parser: argparse.ArgumentParser) -> None:
    security = parser.add_argument_group("security (docs/security.md; secrets: prefer the IQGRAPH_* variables)")
    security.add_argument("--auth", help="client authentication: none (default), jwt, api-key or jwt,api-key")
    security.add_argument("--jwt-jwks", help="RS256/ES256: the JWKS file or URL of the token issuer's keys")
    security.add_argument("--jwt-issuer", help="the iss every token must have")
    security.add_argument("--jwt-audience", help="the aud every token must have")
    security.add_argument("--jwt-leeway-s", type=int, help="clock skew allowed on exp/nbf/iat (default 30)")
    security.add_argument("--scope-claim", help="the claim with the caller's scopes read:<store> (default scope)")
    security.add_argument("--api-keys", type=Path, help="TOML file of API keys: [keys.<name>] sha256, scopes")
    security.add_argument(
        "--introspection", choices=["true", "false"], help="whether the schema can be introspected (default true)"
    )
    security.add_argument(
        "--trusted-documents",
        type=Path,
        help="JSON manifest of {sha256: document} (GraphQL Code Generator, Relay, Apollo): clients send documentId",
    )
    security.add_argument(
        "--only-trusted-documents",
        action="store_true",
        default=None,
        help="run no document but the trusted ones (production lock-down; GraphiQL then runs only those)",
    )
    security.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate chain (PEM)")
    security.add_argument("--tls-key", type=Path, help="the certificate's private key (PEM)")
    security.add_argument("--tls-ca", type=Path, help="CA bundle to verify peers' certificates (PEM)")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``iqgraph`` command."""
    parser = argparse.ArgumentParser(prog="iqgraph", description="GraphQL interactive queries over PySpark state.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a node: its streaming queries and the GraphQL API")
    _node_flags(serve)
    dev = commands.add_parser("dev", help="run an app on the embedded broker: topics, data, 1 or N nodes, GraphiQL")
    dev.add_argument("--app", required=True, help="package.module:attribute (your module, from this directory)")
    dev.add_argument("--data", type=Path, help='JSON lines to produce first: {"key": …, "value": {…}, "timestamp": …}')
    _dev_flags(dev)
    demo = commands.add_parser("demo", help="iqgraph dev with the shop example (generated orders)")
    _dev_flags(demo)
    schema = commands.add_parser("schema", help="print the GraphQL SDL of an app (for codegen)")
    schema.add_argument("--app", required=True, help="package.module:attribute")
    broker = commands.add_parser("broker", help="run a throwaway Apache Kafka broker with an app's topics")
    broker.add_argument("--app", help="package.module:attribute whose topics to create (default: none)")
    broker.add_argument("--port", type=int, default=9092, help="the broker's port on 127.0.0.1 (default 9092)")
    broker.add_argument("--data-dir", type=Path, help="keep the broker's data here (default: deleted at the end)")
    produce = commands.add_parser("produce", help="produce a JSON-lines file, or an app's generated events")
    produce.add_argument("--app", required=True, help="package.module:attribute")
    produce.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (default: the app's)")
    produce.add_argument("--file", help='JSON lines {"key": …, "value": {…}, "timestamp": …}; - for stdin')
    produce.add_argument("--count", type=int, help="how many generated events (default: until Ctrl-C)")
    produce.add_argument("--rate", type=_positive, help="events per second (default: as fast as possible)")
    produce.add_argument("--seed", type=int, default=1, help="generator seed (same seed, same events)")
    produce.add_argument("--start-ms", type=int, help="event time of the first event (default: now)")
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0")
    return value


def _dev_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1, help="how many nodes (default 1; 3 shows forwarding)")
    parser.add_argument("--rate", type=_positive, default=200.0, help="generated events per second (default 200)")
    parser.add_argument("--port", type=int, help="port of the first node (default: IQGRAPH_PORT, else 8000)")
    parser.add_argument("--state-dir", type=Path, help="stores and node logs (default: a new temporary directory)")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (default: Ctrl-C)")


def _key_values(flag: str, given: list[str] | None) -> dict[str, str] | None:
    """Return KEY=VALUE flags as a mapping; raise SettingsError naming the one without '='."""
    if not given:
        return None
    found = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"{flag} wants KEY=VALUE (e.g. {flag} spark.executor.memory=2g), got {item!r}")
        found[key.strip()] = value
    return found


def _settings(args: argparse.Namespace) -> Settings:
    flags: dict[str, Any] = {k: v for k, v in vars(args).items() if k not in ("command", "config", "verbose")}
    flags["spark_conf"] = _key_values("--spark-conf", flags.get("spark_conf"))
    settings = load_settings(flags, config=args.config)
    if not settings.app:
        raise SettingsError("no app to run: pass --app package.module:attribute (or set IQGRAPH_APP)")
    return settings


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        return _serve(args)
    if args.command in ("dev", "demo"):
        from iqgraph.app.dev.run import DEMO_APP, DevOptions, run_dev

        options = {k: getattr(args, k) for k in ("nodes", "rate", "state_dir", "duration")}
        options["port"] = first_port(args.port)
        if args.command == "demo":
            return run_dev(DevOptions(app=DEMO_APP, prefix="iqgraph demo", **options))
        return run_dev(DevOptions(app=args.app, data=args.data, **options))
    if args.command == "schema":
        from iqgraph.app.http.sdl import print_schema

        return print_schema(load_app(args.app))
    if args.command == "broker":
        from iqgraph.app.dev.broker import run_broker

        return run_broker(load_app(args.app) if args.app else None, args.port, args.data_dir)
    return _produce(args)


def _serve(args: argparse.Namespace) -> int:
    from iqgraph.app.http.server import serve

    settings = _settings(args)
    return serve(settings, load_app(settings.app))


def _produce(args: argparse.Namespace) -> int:
    from iqgraph.app.dev.producer import produce_events, producer_config

    app = load_app(args.app)
    config = producer_config(app, args.bootstrap_servers or app.kafka.bootstrap_servers)
    if args.file is not None:
        return _produce_file(app, config, args.file)
    if app.generator is None:
        raise AppLoadError(
            f"app {app.name!r} has no event generator: pass --file data.jsonl (one JSON object per line: "
            '{"key": …, "value": {…}, "timestamp": …}), or - to read them from stdin'
        )
    sent = produce_events(app, config, count=args.count, rate=args.rate, seed=args.seed, start_ms=args.start_ms)
    print(f"produced {sent} events into {app.topics[0].name}")
    return 0


def _produce_file(app: App, config: dict[str, Any], file: str) -> int:
    from iqgraph.app.dev.data_file import read_records
    from iqgraph.app.dev.producer import produce_records

    def bad_line(bad: BadLine) -> None:
        print(f"iqgraph: skipped {file}: {bad}", file=sys.stderr)

    try:
        lines = sys.stdin.buffer if file == "-" else open(file, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise AppLoadError(f"--file {file}: {exc.strerror}") from None
    with lines:
        sent, bad = produce_records(config, read_records(lines, app), bad_line)
    print(f"produced {sent} records from {file}" + (f"; skipped {bad} bad lines (see above)" if bad else ""))
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("iqgraph: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        print(f"iqgraph: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
