"""The dev producer's librdkafka log: a warning it retries by itself is not shown, others are."""

from __future__ import annotations

import logging

import pytest

from iqgraph.app.dev.producer import log


def test_a_just_started_brokers_coordinator_loading_is_not_shown_other_warnings_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    retried = (
        "Failed to acquire idempotence PID from broker 127.0.0.1:48641/1: Broker: Coordinator load in progress: "
        "retrying"
    )
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("%s [%s] %s", "GETPID", "rdkafka#producer-3", retried)  # as confluent-kafka logs it
        log.warning("%s [%s] %s", "FAIL", "rdkafka#producer-3", "127.0.0.1:48641/1: Connect failed")

    assert [r.getMessage() for r in caplog.records] == ["FAIL [rdkafka#producer-3] 127.0.0.1:48641/1: Connect failed"]
