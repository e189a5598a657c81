"""The partition database: offsets applied exactly once, atomic batches, crashes, lifecycle, locking."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import iqgraph.stores as stores_pkg
from iqgraph.stores import (
    OffsetError,
    OffsetGapError,
    PartitionState,
    PartitionStores,
    StateDirectory,
    StateDirLockedError,
    StoreNotReadyError,
    UnknownStoreError,
)
from iqgraph.stores.partition import META_CF, NEXT_OFFSET_KEY
from tests.stores.conftest import APP_ID, TOPIC, Apply
from tests.support.crash_writer import REPO, WRITER, dump, python, run_writer

HOLDER = r"""
import sys
from pathlib import Path
from iqgraph.stores import StateDirectory
stores = StateDirectory(Path(sys.argv[1]), sys.argv[2]).open(sys.argv[3], 0, [])
print("ready", flush=True)
sys.stdin.readline()
stores.close()
"""


def next_offset(content: dict[str, dict[bytes, bytes]]) -> int:
    return int.from_bytes(content[META_CF][NEXT_OFFSET_KEY], "big") - (1 << 63)


# -- offsets -------------------------------------------------------------------------------------------


def test_the_next_offset_is_read_from_rocksdb_once_per_write_of_it(
    partition: PartitionStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = partition.db
    reads: list[bytes] = []
    meta = db.meta
    monkeypatch.setattr(db, "meta", lambda key: reads.append(key) or meta(key))
    assert [db.next_offset() for _ in range(3)] == [0, 0, 0] and reads == [NEXT_OFFSET_KEY]
    tx = db.begin(0, 5)
    assert tx is not None
    tx.commit()
    assert [db.next_offset() for _ in range(3)] == [5, 5, 5] and reads == [NEXT_OFFSET_KEY] * 2
    partition.close()
    with pytest.raises(StoreNotReadyError):  # closed: not answered from what it remembered
        db.next_offset()


def test_new_partition_starts_at_offset_zero(partition: PartitionStores) -> None:
    assert partition.db.next_offset() == 0
    assert partition.db.meta(NEXT_OFFSET_KEY) is None


def test_commit_writes_data_and_next_offset(partition: PartitionStores) -> None:
    counts = partition.kv("counts")
    tx = partition.db.begin(0, 25)
    assert tx is not None
    counts.merge(tx, [("a", 2), ("b", 3)])
    assert counts.multi_get(["a", "b"]) == [None, None]  # nothing visible before commit
    assert partition.db.next_offset() == 0
    tx.commit()
    assert counts.multi_get(["a", "b"]) == [2, 3]
    assert partition.db.next_offset() == 25


def test_a_failing_commit_writes_neither_data_nor_offset(partition: PartitionStores, apply: Apply) -> None:
    counts = partition.kv("counts")
    apply(partition, lambda tx: counts.merge(tx, [("a", 1)]))
    aborted: list[bool] = []

    def fail() -> None:
        raise OSError("disk full")

    tx = partition.db.begin(1, 2)
    assert tx is not None
    counts.merge(tx, [("a", 1), ("b", 1)])
    tx.before_commit(fail)
    tx.after_abort(lambda: aborted.append(True))
    with pytest.raises(OSError, match="disk full"):
        tx.commit()
    assert aborted == [True]
    assert counts.multi_get(["a", "b"]) == [1, None]
    assert partition.db.next_offset() == 1


def test_applying_the_same_batch_twice_changes_nothing(partition: PartitionStores) -> None:
    counts = partition.kv("counts")
    for _ in range(2):
        tx = partition.db.begin(0, 10)
        if tx is None:
            continue
        with tx:
            counts.merge(tx, [("a", 10)])
    assert partition.db.begin(0, 10) is None
    assert partition.db.begin(3, 7) is None  # a slice already inside the applied range
    assert partition.db.begin(10, 10) is None  # an empty batch
    assert counts.get("a") == 10
    assert partition.db.next_offset() == 10


def test_a_batch_that_leaves_a_gap_is_refused(partition: PartitionStores, apply: Apply) -> None:
    apply(partition, lambda tx: None)
    with pytest.raises(OffsetGapError, match="next offset is 1"):
        partition.db.begin(2, 5)
    assert partition.db.next_offset() == 1


def test_an_overlapping_batch_is_refused(partition: PartitionStores) -> None:
    tx = partition.db.begin(0, 10)
    assert tx is not None
    tx.commit()
    with pytest.raises(OffsetError, match="start it at 10") as raised:
        partition.db.begin(5, 15)
    assert not isinstance(raised.value, OffsetGapError)
    assert partition.db.next_offset() == 10


def test_an_exception_inside_the_transaction_aborts_it(partition: PartitionStores, apply: Apply) -> None:
    counts, latest = partition.kv("counts"), partition.kv("latest")
    apply(partition, lambda tx: (counts.merge(tx, [("a", 1)]), latest.put(tx, "x", "old")))
    tx = partition.db.begin(1, 2)
    assert tx is not None
    with pytest.raises(ZeroDivisionError), tx:
        counts.merge(tx, [("a", 5), ("b", 5)])
        latest.put(tx, "x", "new")
        latest.delete(tx, "x")
        _ = 1 / 0
    assert counts.multi_get(["a", "b"]) == [1, None]
    assert latest.get("x") == "old"
    assert partition.db.next_offset() == 1
    # the batch can be applied afresh after the abort
    apply(partition, lambda tx: counts.merge(tx, [("a", 5)]))
    assert counts.get("a") == 6


def test_a_finished_transaction_cannot_commit_again(partition: PartitionStores) -> None:
    tx = partition.db.begin(0, 1)
    assert tx is not None
    tx.commit()
    with pytest.raises(OffsetError, match="already finished"):
        tx.commit()
    aborted = partition.db.begin(1, 2)
    assert aborted is not None
    aborted.abort()
    with pytest.raises(OffsetError, match="already finished"):
        aborted.commit()
    assert partition.db.next_offset() == 1


def test_transaction_reads_see_its_own_pending_writes(partition: PartitionStores, apply: Apply) -> None:
    counts = partition.kv("counts")

    def twice(tx: stores_pkg.PartitionTransaction) -> None:
        counts.merge(tx, [("a", 1)])
        counts.merge(tx, [("a", 2), ("b", 1)])
        counts.delete(tx, "b")
        counts.merge(tx, [("b", 7)])

    apply(partition, twice)
    assert counts.multi_get(["a", "b"]) == [3, 7]


def test_two_transactions_begun_at_the_same_offset_apply_once(partition: PartitionStores) -> None:
    counts = partition.kv("counts")
    first, second = partition.db.begin(0, 1), partition.db.begin(0, 1)
    assert first is not None and second is not None
    counts.merge(first, [("a", 1)])
    counts.merge(second, [("a", 1)])
    first.commit()
    with pytest.raises(OffsetError):
        second.commit()
    assert counts.get("a") == 1


# -- crashes (real processes, SIGKILL) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "exit_code", "applied"),
    [
        ("exit-before-commit", 1, 2),
        ("kill-before-commit", -signal.SIGKILL, 2),
        ("kill-in-commit", -signal.SIGKILL, 2),
        ("kill-after-commit", -signal.SIGKILL, 3),
    ],
)
def test_a_crash_leaves_the_state_of_the_last_commit(tmp_path: Path, mode: str, exit_code: int, applied: int) -> None:
    assert run_writer(tmp_path / "crashed", mode, 3) == exit_code
    assert run_writer(tmp_path / "clean", "clean", applied) == 0
    crashed, clean = dump(tmp_path / "crashed"), dump(tmp_path / "clean")
    assert next_offset(crashed) == applied * 10
    assert crashed == clean
    # restarting from the stored offset reaches the state of a run that never crashed
    assert run_writer(tmp_path / "crashed", "clean", 5) == 0
    assert run_writer(tmp_path / "clean", "clean", 5) == 0
    assert dump(tmp_path / "crashed") == dump(tmp_path / "clean")


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_at_any_moment_then_restart_equals_a_run_without_crash(tmp_path: Path, seed: int) -> None:
    crashed = tmp_path / "crashed"
    with subprocess.Popen(python(WRITER, crashed, "forever", 0), cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for _ in range(random.Random(seed).randint(5, 40)):  # let it commit a few batches first
            proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)  # the writer is between, inside or after a commit
        proc.wait(timeout=10)
    applied = next_offset(dump(crashed)) // 10
    assert applied >= 5
    assert run_writer(tmp_path / "clean", "clean", applied) == 0
    assert dump(crashed) == dump(tmp_path / "clean")
    assert run_writer(crashed, "clean", applied + 3) == 0
    assert run_writer(tmp_path / "clean", "clean", applied + 3) == 0
    assert dump(crashed) == dump(tmp_path / "clean")


# -- lifecycle -------------------------------------------------------------------------------------------


def _reads(stores: PartitionStores) -> list[Callable[[], object]]:
    kv, window, bloom = stores.kv("latest"), stores.window("tumbling"), stores.bloom("seen")
    return [
        lambda: kv.get("a"),
        lambda: kv.multi_get(["a", "b"]),
        lambda: kv.range("a", "z"),
        lambda: kv.prefix("a"),
        lambda: kv.all(),
        lambda: kv.approximate_num_entries(),
        lambda: window.fetch("a", 0, 100),
        lambda: window.fetch_all(0, 100),
        lambda: window.fetch_range("a", "z", 0, 100),
        lambda: bloom.might_contain("a"),
        lambda: bloom.might_contain_many(["a"]),
        lambda: bloom.approximate_count(),
    ]


def test_state_machine_and_reads_in_each_state(open_partition: Callable[..., PartitionStores], apply: Apply) -> None:
    stores = open_partition(running=False)
    assert stores.db.state is PartitionState.CREATED
    reads = _reads(stores)
    for state in (PartitionState.CREATED, PartitionState.RESTORING):
        stores.db.set_state(state)
        for read in reads:
            with pytest.raises(StoreNotReadyError) as raised:
                read()
            assert raised.value.state == state.value
            assert raised.value.retry_after_ms > 0
    # a restoring partition takes writes, it only refuses reads
    apply(stores, lambda tx: stores.kv("latest").put(tx, "a", 1))
    stores.db.set_state(PartitionState.RUNNING)
    for read in reads:
        read()
    assert stores.kv("latest").get("a") == 1
    stores.close()
    assert stores.db.state is PartitionState.CLOSED
    for read in reads:
        with pytest.raises(StoreNotReadyError) as raised:
            read()
        assert raised.value.state == "CLOSED"
    with pytest.raises(StoreNotReadyError):
        stores.db.begin(1, 2)
    assert repr(stores.db) == f"PartitionDB({TOPIC}-0, CLOSED)"


def test_unknown_store(partition: PartitionStores) -> None:
    for lookup in (
        lambda: partition.store("nope"),
        lambda: partition.kv("nope"),
        lambda: partition.db.spec("nope"),
        lambda: partition.db.family("nope"),
        lambda: partition.db.handle("nope"),
        lambda: stores_pkg.KeyValueStore(partition.db, "nope"),
        lambda: stores_pkg.WindowStore(partition.db, "nope"),
        lambda: stores_pkg.BloomStore(partition.db, "nope"),
    ):
        with pytest.raises(UnknownStoreError, match="nope"):
            lookup()
    tx = partition.db.begin(0, 1)
    assert tx is not None
    with pytest.raises(UnknownStoreError):
        tx.put("nope", b"k", b"v")


def test_a_view_of_the_wrong_kind_is_refused(partition: PartitionStores) -> None:
    with pytest.raises(TypeError):
        partition.kv("tumbling")
    with pytest.raises(TypeError):
        partition.window("seen")
    with pytest.raises(TypeError):
        partition.bloom("latest")
    with pytest.raises(TypeError):
        stores_pkg.KeyValueStore(partition.db, "tumbling")


def test_close_then_reopen_in_the_same_process(open_partition: Callable[..., PartitionStores], apply: Apply) -> None:
    stores = open_partition()
    kv, window, bloom = stores.kv("latest"), stores.window("tumbling"), stores.bloom("seen")

    def write(tx: stores_pkg.PartitionTransaction) -> None:
        kv.put(tx, "a", {"v": 1})
        window.aggregate(tx, [("a", 5, 1)])
        bloom.add(tx, ["a"])

    apply(stores, write)
    # handles used by reads, pages, windows and the filter are still referenced by the test
    page, windows = kv.all(limit=1), window.fetch_all(0, 100, limit=1)
    assert bloom.might_contain("a")
    stores.close()
    stores.close()  # idempotent
    again = open_partition()
    assert again.kv("latest").get("a") == {"v": 1}
    assert [w.value for w in again.window("tumbling").fetch("a", 0, 100)] == [1]
    assert again.bloom("seen").might_contain("a")
    assert again.db.next_offset() == 1
    assert page.items and windows.items


def test_a_second_handle_in_the_same_process_is_locked_out(
    partition: PartitionStores, state_dir: StateDirectory
) -> None:
    with pytest.raises(StateDirLockedError):
        state_dir.open(TOPIC, 0, ())
    assert partition.kv("latest").get("a") is None  # the first handle is unharmed


def test_a_partition_held_by_another_process_is_locked_out(state_dir: StateDirectory) -> None:
    holder = python(HOLDER, state_dir.root, APP_ID, TOPIC)
    with subprocess.Popen(holder, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "ready"
            with pytest.raises(StateDirLockedError):
                state_dir.open(TOPIC, 0, ())
        finally:
            proc.stdin.write("\n")
            proc.stdin.close()
            proc.wait(timeout=10)
    assert proc.returncode == 0
    state_dir.open(TOPIC, 0, ()).close()  # free once the other process closed it


def test_delete_removes_the_directory(open_partition: Callable[..., PartitionStores], apply: Apply) -> None:
    stores = open_partition(partition=3)
    apply(stores, lambda tx: stores.kv("latest").put(tx, "a", 1))
    assert stores.db.path.is_dir()
    stores.db.delete()
    assert not stores.db.path.exists()
    assert stores.db.state is PartitionState.CLOSED
    fresh = open_partition(partition=3)
    assert fresh.db.next_offset() == 0
    assert fresh.kv("latest").get("a") is None


def test_killed_writer_left_no_lock_behind(tmp_path: Path) -> None:
    assert run_writer(tmp_path, "kill-after-commit", 1) == -signal.SIGKILL
    stores = StateDirectory(tmp_path, "crash-test").open("events", 0, ())
    assert stores.db.next_offset() == 10
    stores.close()
    assert os.path.exists(tmp_path / "events-0" / "LOCK")
