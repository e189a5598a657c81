"""Fixtures of the stores tests: a state directory in tmp_path, the store specs, an open partition."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from iqgraph.stores import (
    AVG,
    COUNT,
    LATEST,
    MAX,
    MIN,
    SUM,
    BloomSpec,
    PartitionState,
    PartitionStores,
    PartitionTransaction,
    StateDirectory,
    StoreKind,
    StoreSpec,
    WindowSpec,
)

APP_ID = "test-app"
TOPIC = "events"

#: Tumbling windows of 10 ms, 5 ms of grace, kept 100 ms after their start.
TUMBLING = WindowSpec(size_ms=10, grace_ms=5, retention_ms=100)
#: Hopping windows of 10 ms every 5 ms (each timestamp falls into two windows).
HOPPING = WindowSpec(size_ms=10, advance_ms=5, grace_ms=0, retention_ms=1_000)

SPECS: tuple[StoreSpec, ...] = (
    StoreSpec("latest", StoreKind.KEY_VALUE, "string", LATEST),
    StoreSpec("latest_int", StoreKind.KEY_VALUE, "int", LATEST),
    StoreSpec("counts", StoreKind.KEY_VALUE, "string", COUNT),
    StoreSpec("sums", StoreKind.KEY_VALUE, "string", SUM),
    StoreSpec("mins", StoreKind.KEY_VALUE, "string", MIN),
    StoreSpec("maxes", StoreKind.KEY_VALUE, "string", MAX),
    StoreSpec("avgs", StoreKind.KEY_VALUE, "string", AVG),
    StoreSpec("tumbling", StoreKind.WINDOW, "string", COUNT, window=TUMBLING),
    StoreSpec("hopping", StoreKind.WINDOW, "string", COUNT, window=HOPPING),
    StoreSpec("tumbling_int", StoreKind.WINDOW, "int", SUM, window=TUMBLING),
    StoreSpec("seen", StoreKind.BLOOM, "string", bloom=BloomSpec(capacity=50_000, error_rate=0.01)),
    StoreSpec("seen_int", StoreKind.BLOOM, "int", bloom=BloomSpec(capacity=1_000, error_rate=0.01)),
)

Apply = Callable[[PartitionStores, Callable[[PartitionTransaction], object]], None]


@pytest.fixture
def state_dir(tmp_path: Path) -> StateDirectory:
    """Return a fresh state directory of APP_ID in tmp_path."""
    return StateDirectory(tmp_path / "state", APP_ID)


@pytest.fixture
def specs() -> tuple[StoreSpec, ...]:
    """Return the specs of every store the tests use."""
    return SPECS


@pytest.fixture
def open_partition(state_dir: StateDirectory) -> Iterator[Callable[..., PartitionStores]]:
    """Return a function that opens partition p of TOPIC in RUNNING state; close all at teardown."""
    opened: list[PartitionStores] = []

    def open_(partition: int = 0, specs: tuple[StoreSpec, ...] = SPECS, running: bool = True) -> PartitionStores:
        stores = state_dir.open(TOPIC, partition, specs)
        if running:
            stores.db.set_state(PartitionState.RUNNING)
        opened.append(stores)
        return stores

    yield open_
    for stores in opened:
        stores.close()


@pytest.fixture
def partition(open_partition: Callable[..., PartitionStores]) -> PartitionStores:
    """Return partition 0 of TOPIC, open and RUNNING."""
    return open_partition()


@pytest.fixture
def apply() -> Apply:
    """Return a function that applies one one-record batch at the partition's next offset and commits it."""

    def apply_(stores: PartitionStores, write: Callable[[PartitionTransaction], object]) -> None:
        start = stores.db.next_offset()
        tx = stores.db.begin(start, start + 1)
        assert tx is not None
        with tx:
            write(tx)

    return apply_
