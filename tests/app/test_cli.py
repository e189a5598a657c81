"""The command line: clear one-line errors for what a user can fix, and `produce` into a real broker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from iqgraph.app.cli import main
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port
from tests.conftest import MakeTopic
from tests.support.cli import iqgraph


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iqgraph: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_a_bad_app_path_is_one_clear_line(tmp_path: Path) -> None:
    assert_one_line_error(iqgraph("serve", "--app", "nowhere.module:app"), "cannot import module 'nowhere.module'")
    assert_one_line_error(iqgraph("serve", "--app", "iqgraph.examples.shop"), "package.module:attribute")
    assert_one_line_error(iqgraph("serve", "--app", "iqgraph.examples.shop:ITEMS"), "not an iqgraph App")
    assert_one_line_error(iqgraph("serve"), "--app")


def test_an_app_module_that_fails_or_defines_badly_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import iqgraph\n\napp = undefined_name\n")
    assert_one_line_error(
        iqgraph("serve", "--app", "broken:app", cwd=tmp_path), "module 'broken' failed", "broken.py:3", "NameError"
    )
    (tmp_path / "typo.py").write_text("app = (\n")
    assert_one_line_error(iqgraph("serve", "--app", "typo:app", cwd=tmp_path), "typo.py:1", "SyntaxError")
    (tmp_path / "badrel.py").write_text(
        textwrap.dedent("""
        from iqgraph import App, Relation, Topic, key_value_store, latest
        app = App("x", [Topic("t", schema="c STRING")],
                  [key_value_store("s", "t", latest(), relations=[Relation("c", "Nobody", column="c")])])
    """)
    )
    assert_one_line_error(iqgraph("serve", "--app", "badrel:app", cwd=tmp_path), "unknown entity 'Nobody'")


def test_any_user_error_is_its_own_message_in_one_line(tmp_path: Path) -> None:
    """The command line catches iqgraph.UserError, not a list: a subclass it has never heard of is one line too."""
    (tmp_path / "licensed.py").write_text(
        textwrap.dedent("""
        import iqgraph

        class LicenceError(iqgraph.UserError):
            pass

        raise LicenceError("no licence key: set LICENCE_KEY")
    """)
    )
    result = iqgraph("schema", "--app", "licensed:app", cwd=tmp_path)
    assert_one_line_error(result)
    assert result.stderr.strip() == "iqgraph: error: no licence key: set LICENCE_KEY"


def test_a_taken_port_is_one_clear_line_before_anything_starts(tmp_path: Path) -> None:
    import socket
    import time

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = iqgraph("serve", "--app", "iqgraph.examples.shop:app", "--port", str(port))
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}", "choose another --port")
    assert time.monotonic() - started < 20  # no Kafka check, no Spark: the port is bound first
    assert "Spark" not in result.stdout
    with socket.socket() as taken:  # the peers' listener's port, taken: as clear, as early
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        peer_port = taken.getsockname()[1]
        peers = ["--peers", "http://127.0.0.1:8000", "--peer-port", str(peer_port), "--port", str(free_port())]
        env = {"IQGRAPH_CLUSTER_SECRET": "a-test-cluster-secret"}
        result = iqgraph("serve", "--app", "iqgraph.examples.shop:app", *peers, env=env)
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{peer_port}", "choose another --peer-port")
    assert "Spark" not in result.stdout


def test_serve_help_shows_a_nodes_flags_in_groups(capsys: pytest.CaptureFixture[str]) -> None:
    """``iqgraph serve --help`` lists every flag once, under the group it belongs to; only --app, --config and
    --verbose stand outside a group."""
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    groups: dict[str, list[str]] = {}
    heading = None
    for line in capsys.readouterr().out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line.removesuffix(":").split(" (")[0]
            groups[heading] = []
        elif heading is not None and line.startswith("  -"):
            groups[heading].append(re.findall(r"--[a-z-]+", line)[0])
    assert list(groups) == ["options", "HTTP", "query limits", "Kafka", "storage", "Spark", "cluster", "security"]
    assert groups["options"] == ["--help", "--app", "--config", "--verbose"]
    assert all(len(flags) >= 2 for flags in groups.values()), groups
    every = [flag for flags in groups.values() for flag in flags]
    assert len(every) == len(set(every)) == 53
    assert {"--kafka-source", "--spark-conf"} <= set(groups["Spark"])
    assert {"--peers", "--standbys", "--max-lag", "--peer-port"} <= set(groups["cluster"])
    assert {"--bootstrap-servers", "--create-topics"} == set(groups["Kafka"])
    assert {"--state-dir", "--no-changelog", "--rebuild-lost-partitions"} == set(groups["storage"])
    assert {"--auth", "--tls-cert", "--trusted-documents"} <= set(groups["security"])


def test_the_peer_listener_must_have_a_port_of_its_own_in_range() -> None:
    env = {"IQGRAPH_CLUSTER_SECRET": "a-test-cluster-secret"}
    cluster = ["serve", "--app", "iqgraph.examples.shop:app", "--peers", "http://127.0.0.1:8000"]
    same = iqgraph(*cluster, "--port", "8000", "--peer-port", "8000", env=env)
    assert_one_line_error(same, "peer_port 8000 is the client port", "--peer-port")
    past = iqgraph(*cluster, "--port", "60000", env=env)  # the default, port + 10000, is past 65535
    assert_one_line_error(past, "port 70000 (port + 10000) is out of range", "--peer-port")


def test_bad_settings_say_what_to_fix(tmp_path: Path) -> None:
    assert_one_line_error(iqgraph("serve", "--app", "iqgraph.examples.shop:app", "--port", "70000"), "port 70000")
    config = tmp_path / "node.toml"
    config.write_text("[iqgraph]\nport = 'eight'\n")
    assert_one_line_error(iqgraph("serve", "--app", "iqgraph.examples.shop:app", "--config", str(config)), "port")
    env = {"IQGRAPH_MAX_KEYS": "-3"}
    assert_one_line_error(iqgraph("serve", "--app", "iqgraph.examples.shop:app", env=env), "max_keys")
    spark_conf = iqgraph("serve", "--app", "iqgraph.examples.shop:app", "--spark-conf", "spark.executor.memory")
    assert_one_line_error(spark_conf, "--spark-conf wants KEY=VALUE", "'spark.executor.memory'")
    stall = iqgraph("serve", "--app", "iqgraph.examples.shop:app", "--stall-timeout-s", "0")
    assert_one_line_error(stall, "stall_timeout_s must be positive")


def test_an_unreachable_broker_is_one_clear_line(tmp_path: Path) -> None:
    result = iqgraph(
        "serve",
        "--app",
        "iqgraph.examples.shop:app",
        "--bootstrap-servers",
        "127.0.0.1:9",
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert_one_line_error(result, "127.0.0.1:9", "--bootstrap-servers")


def test_a_state_dir_that_is_not_ours_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("do not touch")
    result = iqgraph("serve", "--app", "iqgraph.examples.shop:app", "--state-dir", str(tmp_path))
    assert_one_line_error(result, "not an iqgraph state directory")


def test_a_locked_state_dir_is_one_clear_line(broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path) -> None:
    topic = make_topic(2, prefix="orders")
    module = tmp_path / "lockapp.py"
    module.write_text(
        textwrap.dedent(f"""
        from iqgraph.examples.shop import build_app
        from iqgraph.streaming.definitions import KafkaSettings
        app = build_app({topic!r}, 2, KafkaSettings(bootstrap_servers={broker.bootstrap_servers!r}))
    """)
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from iqgraph.stores import StateDirectory
            from lockapp import app
            held = StateDirectory({str(tmp_path / "state")!r}, 'shop').open({topic!r}, 1, app.specs({topic!r}))
            print('holding', flush=True)
            time.sleep(60)
        """),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        result = iqgraph(
            "serve",
            "--app",
            "lockapp:app",
            "--state-dir",
            str(tmp_path / "state"),
            cwd=tmp_path,
            env={"PYTHONPATH": str(tmp_path)},
        )
        assert_one_line_error(result, "in use by another process")
    finally:
        holder.kill()
        holder.wait()


def test_produce_sends_count_generated_events(broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path) -> None:
    topic = make_topic(3, prefix="orders")
    module = f"from iqgraph.examples.shop import build_app\napp = build_app({topic!r}, 3)\n"
    (tmp_path / "prodapp.py").write_text(module)
    result = iqgraph(
        "produce",
        "--app",
        "prodapp:app",
        "--count",
        "250",
        "--seed",
        "3",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert f"produced 250 events into {topic}" in result.stdout
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{topic}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    seen = 0
    try:
        for _ in range(40):
            seen += sum(1 for m in consumer.consume(500, timeout=0.5) if m.error() is None)
            if seen >= 250:
                break
    finally:
        consumer.close()
    assert seen == 250


def test_a_trusted_documents_manifest_that_cannot_be_used_stops_the_start_in_one_line(tmp_path: Path) -> None:
    serve = ["serve", "--app", "iqgraph.examples.shop:app", "--port", str(free_port())]
    alone = iqgraph(*serve, "--only-trusted-documents")
    assert_one_line_error(alone, "only_trusted_documents needs", "--trusted-documents FILE")
    missing = iqgraph(*serve, "--trusted-documents", str(tmp_path / "missing.json"))
    assert_one_line_error(missing, "cannot read the trusted documents manifest")
    wrong = tmp_path / "persisted-documents.json"
    wrong.write_text('{"0000000000000000000000000000000000000000000000000000000000000000": "{ orderCount { count } }"}')
    assert_one_line_error(iqgraph(*serve, "--trusted-documents", str(wrong)), "is not the one that hashes to it")
    assert "Spark" not in alone.stdout + missing.stdout


@pytest.mark.parametrize("command", ["demo", "dev"])
def test_dev_and_demo_run_on_iqgraph_port(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import iqgraph.app.dev.run as dev_run

    started = []
    monkeypatch.setattr(dev_run, "run_dev", lambda options: started.append(options) or 0)
    monkeypatch.setenv("IQGRAPH_PORT", "47199")
    app = ["--app", "iqgraph.examples.shop:app"] if command == "dev" else []
    assert main([command, *app]) == 0
    assert main([command, *app, "--port", "47198"]) == 0
    assert [options.port for options in started] == [47199, 47198]
    monkeypatch.setenv("IQGRAPH_PORT", "eighty")
    assert main([command, *app]) == 2
    assert capsys.readouterr().err.strip() == "iqgraph: error: port must be an integer, got 'eighty'"
