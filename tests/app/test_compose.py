"""docker-compose.yml: valid against the compose specification (check-jsonschema's vendored compose-spec
schema; no Docker engine runs here), and its iqgraph settings are settings a node knows."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from iqgraph.app.loading import load_app
from iqgraph.app.settings import ENV_PREFIX, Settings
from tests.support.compose import COMPOSE, ROOT, check_jsonschema


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = YAML(typ="safe").load(COMPOSE.read_text())
    return loaded


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    result = check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_refuses_an_invalid_compose_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("    deploy:\n", "    deploy:\n      replica_count: 3\n", 1))
    result = check_jsonschema(broken)
    assert result.returncode != 0 and "replica_count" in result.stdout + result.stderr


def test_every_iqgraph_variable_is_a_node_setting(compose: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(Settings)}
    names = [k for service in compose["services"].values() for k in service.get("environment", {})]
    settings = [n[len(ENV_PREFIX) :].lower() for n in names if n.startswith(ENV_PREFIX)]
    assert settings and set(settings) <= known, set(settings) - known


def test_nodes_are_parameterised_by_app_and_count_and_join_as_a_kafka_group(compose: dict[str, Any]) -> None:
    node = compose["services"]["node"]
    assert node["deploy"]["replicas"] == "${IQGRAPH_NODES:-3}"
    assert node["environment"]["IQGRAPH_MEMBERSHIP"] == "kafka"
    assert node["environment"]["IQGRAPH_CREATE_TOPICS"] == "true"
    assert "iqgraph serve" in node["command"][0]
    default_app = re.fullmatch(r"\$\{IQGRAPH_APP:-(.+)\}", node["environment"]["IQGRAPH_APP"])
    assert default_app is not None and load_app(default_app.group(1)).name == "shop"
    assert "${IQGRAPH_APP:-" in compose["services"]["producer"]["command"][0]
    assert (ROOT / "examples").is_dir()  # the default APP_DIR


def test_the_compose_broker_is_the_embedded_brokers_release_with_its_settings(compose: dict[str, Any]) -> None:
    from iqgraph.streaming.apache_kafka import KAFKA_VERSION, ONE_MACHINE_PROPERTIES

    kafka = compose["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    environment = {k: str(v).lower() for k, v in kafka["environment"].items()}
    for key, value in ONE_MACHINE_PROPERTIES.items():
        assert environment.get("KAFKA_" + key.replace(".", "_").upper()) == value.lower(), key
