"""The changelog producers' log: librdkafka's transient coordinator retries are not warnings; anything else is."""

from __future__ import annotations

import logging

import pytest

from iqgraph.streaming import changelog


def test_a_coordinator_still_loading_is_not_logged_and_a_real_warning_is(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=changelog.log.name):
        changelog.log.warning(
            "GETPID [rdkafka#producer-8] [thrd:main]: Failed to acquire transactional PID from broker "
            "TxnCoordinator/1: Broker: Coordinator load in progress: retrying"
        )
        changelog.log.warning(
            "GETPID [rdkafka#producer-7] [thrd:main]: Failed to acquire transactional PID from "
            "broker TxnCoordinator/1: Broker: Not coordinator: retrying"
        )
        changelog.log.warning("shop-orders-changelog[2]: emptied for a rebuild from offset 0 (3 entries)")
    assert [r.getMessage() for r in caplog.records] == [
        "shop-orders-changelog[2]: emptied for a rebuild from offset 0 (3 entries)"
    ]
