"""Node settings: tables of another system's settings (kafka, spark_conf) add up over file, environment, flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from iqgraph.app.settings import SettingsError, first_port, load_settings


def test_spark_conf_adds_up_over_file_environment_and_flags_the_flag_winning(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        '[iqgraph]\nspark_master = "spark://10.0.0.5:7077"\n'
        '[iqgraph.spark_conf]\n"spark.driver.host" = "10.0.0.1"\n"spark.executor.memory" = "1g"\n'
    )
    env = {"IQGRAPH_SPARK_CONF_SPARK_CORES_MAX": "2", "IQGRAPH_KAFKA_SOCKET_TIMEOUT_MS": "5000"}
    settings = load_settings({"spark_conf": {"spark.executor.memory": "2g"}}, env=env, config=config)
    assert settings.spark_master == "spark://10.0.0.5:7077"
    assert settings.spark_conf == {
        "spark.driver.host": "10.0.0.1",
        "spark.executor.memory": "2g",
        "spark.cores.max": "2",
    }
    assert settings.kafka == {"socket.timeout.ms": "5000"}


def test_a_spark_conf_that_is_not_a_table_says_so(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[iqgraph]\nspark_conf = "spark.executor.memory=2g"\n')
    with pytest.raises(
        SettingsError, match=r"spark_conf must be a table of Spark settings, e.g. \[iqgraph.spark_conf\]"
    ):
        load_settings({}, env={}, config=config)


def test_security_settings_say_what_to_fix_and_describe_themselves() -> None:
    jwt_flags = {"auth": "jwt", "jwt_secret": "s" * 32, "jwt_issuer": "https://i", "jwt_audience": "a"}
    on = load_settings({**jwt_flags, "introspection": "false", "tls_cert": "c.pem", "tls_key": "k.pem"}, env={})
    assert on.auth_methods == {"jwt"}
    assert on.describe_security() == "auth on (jwt): clients need credentials; introspection off; HTTPS"
    assert on.url == "https://127.0.0.1:8000"
    assert load_settings({}, env={}).describe_security().startswith("auth off: any client may read every store")
    refused = {
        "auth must be 'none', 'jwt'": {"auth": "ldap"},
        "needs one of jwt_secret": {"auth": "jwt", "jwt_issuer": "i", "jwt_audience": "a"},
        "issuer and audience": {"auth": "jwt", "jwt_secret": "s" * 32},
        "needs a keys file": {"auth": "api-key"},
        "IQGRAPH_CLUSTER_SECRET": {"peers": "node-0=http://a:1,node-1=http://b:1"},
        "both a certificate and its key": {"tls_cert": "c.pem"},
        "at least 16 characters": {"peers": "node-0=http://a:1", "cluster_secret": "short"},
        "docker-compose.yml's example": {**jwt_flags, "cluster_secret": "change-me-dev-only"},
        "Consumer.poll\\(long\\).*remove the setting": {
            "spark_conf": {"spark.sql.streaming.kafka.useDeprecatedOffsetFetching": "true"}
        },
    }
    for message, flags in refused.items():
        with pytest.raises(SettingsError, match=message):
            load_settings(flags, env={})
    secret = "x" * 16
    assert load_settings({"membership": "kafka"}, env={"IQGRAPH_CLUSTER_SECRET": secret}).cluster_secret == secret


def test_the_group_protocol_comes_from_flag_or_environment_and_names_its_choices() -> None:
    assert load_settings({}, env={}).group_protocol == "classic"
    assert load_settings({}, env={"IQGRAPH_GROUP_PROTOCOL": "consumer"}).group_protocol == "consumer"
    assert load_settings({"group_protocol": "classic"}, env={"IQGRAPH_GROUP_PROTOCOL": "consumer"}).group_protocol == (
        "classic"
    )
    with pytest.raises(SettingsError, match="'classic' or 'consumer' .*IQGRAPH_GROUP_PROTOCOL"):
        load_settings({}, env={"IQGRAPH_GROUP_PROTOCOL": "eager"})


def test_dev_and_demo_take_their_port_from_the_flag_else_iqgraph_port_else_8000() -> None:
    assert first_port(None, {}) == 8000
    assert first_port(None, {"IQGRAPH_PORT": "47100"}) == 47100
    assert first_port(9000, {"IQGRAPH_PORT": "47100"}) == 9000
    with pytest.raises(SettingsError, match="IQGRAPH_PORT"):
        first_port(None, {"IQGRAPH_PORT": "70000"})
    with pytest.raises(SettingsError, match="port must be an integer"):
        first_port(None, {"IQGRAPH_PORT": "eighty"})
