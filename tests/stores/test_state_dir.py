"""The state directory: the marker that claims it, refusal of foreign directories, partitions on disk."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from iqgraph.stores import PartitionStores, StateDirectory, StateDirError, StoreKind, StoreSpec
from iqgraph.stores.state_dir import MARKER, MARKER_FORMAT
from tests.stores.conftest import APP_ID, TOPIC


def test_a_new_directory_gets_the_marker(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "state"
    StateDirectory(root, "my-app")
    assert json.loads((root / MARKER).read_text()) == {"format": MARKER_FORMAT, "app": "my-app"}


def test_an_empty_existing_directory_is_claimed(tmp_path: Path) -> None:
    StateDirectory(tmp_path, "my-app")
    assert (tmp_path / MARKER).is_file()


def test_the_same_app_reopens_its_directory(tmp_path: Path) -> None:
    StateDirectory(tmp_path, "my-app")
    (tmp_path / "events-0").mkdir()
    again = StateDirectory(tmp_path, "my-app")
    assert again.partitions_on_disk() == [("events", 0)]


def test_a_non_empty_directory_without_the_marker_is_refused(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("not ours")
    with pytest.raises(StateDirError, match="not empty"):
        StateDirectory(tmp_path, "my-app")
    assert not (tmp_path / MARKER).exists()
    assert (tmp_path / "precious.txt").read_text() == "not ours"


def test_the_directory_of_another_app_is_refused(tmp_path: Path) -> None:
    StateDirectory(tmp_path, "other-app")
    with pytest.raises(StateDirError, match="other-app"):
        StateDirectory(tmp_path, "my-app")


@pytest.mark.parametrize(
    "content", ["not json", "[]", json.dumps({"app": "my-app"}), json.dumps({"format": 99, "app": "my-app"})]
)
def test_an_unreadable_or_newer_marker_is_refused(tmp_path: Path, content: str) -> None:
    (tmp_path / MARKER).write_text(content)
    with pytest.raises(StateDirError):
        StateDirectory(tmp_path, "my-app")


def test_a_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.write_text("")
    with pytest.raises(StateDirError, match="is a file"):
        StateDirectory(path, "my-app")


def test_partitions_on_disk_lists_what_was_opened(
    state_dir: StateDirectory, open_partition: Callable[..., PartitionStores]
) -> None:
    assert state_dir.partitions_on_disk() == []
    for partition in (10, 2, 0):
        open_partition(partition)
    other = state_dir.open("my-topic-v2", 1, [StoreSpec("latest", StoreKind.KEY_VALUE)])
    other.close()
    (state_dir.root / "not-a-partition").mkdir()
    (state_dir.root / "stray-3").write_text("a file, not a database")
    assert state_dir.partitions_on_disk() == [(TOPIC, 0), (TOPIC, 2), (TOPIC, 10), ("my-topic-v2", 1)]
    assert state_dir.partition_path(TOPIC, 2) == state_dir.root / f"{TOPIC}-2"
    assert (state_dir.root / f"{TOPIC}-2" / "CURRENT").is_file()


def test_deleted_partitions_leave_the_list(state_dir: StateDirectory) -> None:
    stores = state_dir.open(TOPIC, 4, [])
    assert state_dir.partitions_on_disk() == [(TOPIC, 4)]
    stores.db.delete()
    assert state_dir.partitions_on_disk() == []


def test_stores_added_later_are_created_and_old_ones_kept(state_dir: StateDirectory) -> None:
    first = state_dir.open(TOPIC, 0, [StoreSpec("a", StoreKind.KEY_VALUE)])
    first.db.set_state(first.db.state.RUNNING)
    tx = first.db.begin(0, 1)
    assert tx is not None
    with tx:
        first.kv("a").put(tx, "k", 1)
    first.close()
    second = state_dir.open(TOPIC, 0, [StoreSpec("b", StoreKind.KEY_VALUE)])
    second.db.set_state(second.db.state.RUNNING)
    assert second.kv("b").get("k") is None
    second.close()
    third = state_dir.open(TOPIC, 0, [StoreSpec("a", StoreKind.KEY_VALUE)])
    third.db.set_state(third.db.state.RUNNING)
    assert third.kv("a").get("k") == 1
    third.close()


def test_the_app_id_is_kept(state_dir: StateDirectory) -> None:
    assert state_dir.app_id == APP_ID
    assert json.loads((state_dir.root / MARKER).read_text())["app"] == APP_ID
