"""The function a Spark task's Python worker runs for the partials (``arrow_partials.task_partials``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_worker_freezes_what_it_holds_after_its_first_task_and_answers_as_partials_of() -> None:
    # PySpark's daemon collects garbage after every task of a reused worker: what the worker holds after its first
    # task — its imports and what that task imported lazily — is frozen out of those collections, so a collection
    # walks next to nothing. In a process of its own: a freeze is for the process's life.
    script = textwrap.dedent("""
        import gc
        import orjson
        import pyarrow as pa
        from iqgraph.streaming.arrow_partials import StorePlan, partials_of, task_partials

        n = 4
        table = pa.table({
            "store": pa.array(["s"] * n, pa.string()),
            "partition": pa.array([0, 0, 1, 1], pa.int32()),
            "offset": pa.array([0, 1, 0, 1], pa.int64()),
            "event_ms": pa.array([0, 1, 0, 1], pa.int64()),
            "key": pa.array(["a", "b", "a", "a"], pa.string()),
            "payload": pa.array([orjson.dumps({}).decode()] * n, pa.string()),
            "error": pa.nulls(n, pa.string()),
            "raw_key": pa.nulls(n, pa.binary()),
            "raw_value": pa.nulls(n, pa.binary()),
        })
        plans = [StorePlan("s", "key_value", "count")]
        rows = lambda fn: [r for b in fn(iter(table.to_batches()), plans) for r in b.to_pylist()]
        held = len(gc.get_objects())  # what a collection walks (the frozen generation is not in it)
        first = rows(task_partials)
        frozen, left = gc.get_freeze_count(), len(gc.get_objects())
        second = rows(task_partials)
        assert first == second == rows(partials_of) and first, first
        assert held > 10_000 and frozen > held and left < 100, (held, frozen, left)
        assert gc.get_freeze_count() == frozen  # once per process
        print("ok", held, frozen, left)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]
