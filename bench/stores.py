"""Cost per key of the key-value store view against raw rocksdict, on the same data, in one run.

Two operations, each measured through our view and through rocksdict directly on an equivalent
database (same options, a column family holding the same encoded bytes):

- multi_get: ``KeyValueStore.multi_get(keys)`` (encode keys, check state, one RocksDB multi-get,
  decode + finalize values) vs ``Rdict.get([encoded keys])`` (bytes out).
- merge: ``KeyValueStore.merge`` inside a ``PartitionTransaction`` + commit (read-modify-write of
  count states, with the offset and, as the sink merges, each changed key's position) vs a raw
  ``WriteBatch`` put of precomputed values + write.

Two more lines decompose the gap: the partition layer alone (``PartitionDB.multi_get`` on encoded keys)
and a raw read-modify-write written by hand (rocksdict get + orjson + WriteBatch), i.e. the least any
merge must do. Prints a table and, as its last line, one JSON object with the figures.

Usage: ``make bench-stores`` or ``.venv/bin/python bench/stores.py [--keys N] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import orjson
from rocksdict import Options, Rdict, WriteBatch

# This file is bench/stores.py: run as a script, its own directory comes first on sys.path and
# `import stores` would import this file. Put the repository (the stores package) ahead of it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iqgraph.stores import (  # noqa: E402
    COUNT,
    KeyValueStore,
    PartitionState,
    PartitionStores,
    StateDirectory,
    StoreKind,
    StoreSpec,
    encode_value,
)

STORE = "counts"
GOAL = 1.5
RMW_GOAL = 1.2  # the ingest-speed issue: merge within 1.2x of a read-modify-write by hand on raw rocksdict


def timed(fn: Callable[[], object]) -> tuple[int, int]:
    """Return (wall, CPU time of this thread) of fn() in ns, the garbage collector paused (as timeit does).

    The CPU time is what the call cost this thread, whatever else the machine runs: on a shared
    2-core machine the wall time also counts the time other processes held the cores.
    """
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        return time.perf_counter_ns() - wall, time.thread_time_ns() - cpu
    finally:
        gc.enable()


class Bench:
    """Our partition database and a raw rocksdict database holding the same bytes."""

    def __init__(self, root: Path, n_keys: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.keys = [f"user-{i:08d}" for i in range(n_keys)]
        self.stores: PartitionStores = StateDirectory(root / "state", "bench").open(
            "bench", 0, [StoreSpec(STORE, StoreKind.KEY_VALUE, "string", COUNT)]
        )
        self.stores.db.set_state(PartitionState.RUNNING)
        self.kv: KeyValueStore = self.stores.kv(STORE)
        for i in range(0, n_keys, 10_000):
            self.merge([(k, self.rng.randint(1, 100)) for k in self.keys[i : i + 10_000]])
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        self.raw = Rdict(str(root / "raw"), options, column_families={STORE: Options(raw_mode=True)})
        self.raw_cf = self.raw.get_column_family(STORE)
        self.raw_handle = self.raw.get_column_family_handle(STORE)
        batch = WriteBatch(raw_mode=True)
        for key, value in self.stores.db.family(STORE).items():
            batch.put(key, value, self.raw_handle)
        self.raw.write(batch)
        # both on disk (SST files, block cache), as a store that has run a while
        self.stores.db.family(STORE).flush()
        self.raw_cf.flush()
        assert self.raw_cf.get(b"user-00000000") == self.stores.db.family(STORE).get(b"user-00000000")

    def close(self) -> None:
        del self.raw_cf, self.raw_handle
        self.raw.close()
        self.stores.close()

    def sample(self, size: int) -> list[str]:
        return self.rng.sample(self.keys, size)

    # -- the four ways of doing it ----------------------------------------------------------------

    def merge(self, items: list[tuple[str, int]], positions: bool = True) -> None:
        """Merge items in one transaction; positions: as the sink does, each changed key's position too."""
        start = self.stores.db.next_offset()
        tx = self.stores.db.begin(start, start + len(items))
        assert tx is not None
        self.kv.merge(tx, items, positions=range(start, start + len(items)) if positions else None)
        tx.commit()

    def raw_put(self, encoded: list[tuple[bytes, bytes]]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in encoded:
            batch.put(key, value, self.raw_handle)
        self.raw.write(batch)

    def raw_read_modify_write(self, encoded: list[tuple[bytes, int]]) -> None:
        stored = self.raw_cf.get([k for k, _ in encoded])
        batch = WriteBatch(raw_mode=True)
        for (key, increment), raw in zip(encoded, stored, strict=True):
            old = 0 if raw is None else orjson.loads(raw[1:])
            batch.put(key, b"\x01" + orjson.dumps(old + increment), self.raw_handle)
        self.raw.write(batch)


Figures = dict[str, dict[str, dict[str, dict[str, float]]]]  # operation -> size -> variant -> clock -> ns/key


def measure(bench: Bench, sizes: list[int], repeats: int) -> Figures:
    """Return the median ns per key of each variant, the variants interleaved within each repetition."""
    results: Figures = {"multi_get": {}, "merge": {}}
    for size in sizes:
        samples: dict[str, dict[str, list[tuple[int, int]]]] = {
            "multi_get": {"ours": [], "raw": [], "partition_db": []},
            "merge": {"ours": [], "raw": [], "raw_read_modify_write": [], "without_positions": []},
        }
        for rep in range(repeats + 1):  # the first round warms caches and is dropped
            keys = bench.sample(size)
            encoded = [k.encode() for k in keys]
            items = [(k, 1) for k in bench.sample(size)]
            others = [(k, 1) for k in bench.sample(size)]  # other keys: not read back from the memtable
            precomputed = [(k.encode(), encode_value(bench.rng.randint(1, 1000))) for k, _ in items]
            increments = [(k.encode(), p) for k, p in items]
            runs: dict[str, dict[str, Callable[[], object]]] = {
                "multi_get": {
                    "ours": partial(bench.kv.multi_get, keys),
                    "raw": partial(bench.raw_cf.get, encoded),
                    "partition_db": partial(bench.stores.db.multi_get, STORE, encoded),
                },
                # The read-modify-write runs before the blind put of the same keys: after it, they would be
                # read from the memtable, not from the SST files ours read them from (an unfair 1.5x).
                "merge": {
                    "ours": partial(bench.merge, items),
                    "raw_read_modify_write": partial(bench.raw_read_modify_write, increments),
                    "raw": partial(bench.raw_put, precomputed),
                    "without_positions": partial(bench.merge, others, positions=False),  # the positions' cost
                },
            }
            for operation, variants in runs.items():
                for name, run in variants.items():
                    took = timed(run)
                    if rep:
                        samples[operation][name].append(took)
        for operation, by_variant in samples.items():
            results[operation][str(size)] = {
                name: {
                    "wall": statistics.median(w for w, _ in times) / size,
                    "cpu": statistics.median(c for _, c in times) / size,
                }
                for name, times in by_variant.items()
            }
    return results


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_1min": round(os.getloadavg()[0], 2),
    }


def report(results: Figures, n_keys: int, repeats: int, seconds: float) -> None:
    """Print the table, then the JSON summary as the last line."""
    info = machine()
    print(f"stores bench: {n_keys:,} keys, medians of {repeats} repetitions, ns per key; {info}")
    print(
        f"{'operation':<10} {'batch':>6} | {'ours':>7} {'raw':>7} {'ratio':>6} | {'ours':>7} {'raw':>7} {'ratio':>6}"
        " | other variants (wall)"
    )
    print(f"{'':<17} | {'wall clock':^22} | {'CPU time of the thread':^22} |")
    summary: dict[str, object] = {"keys": n_keys, "repeats": repeats, "goal_ratio": GOAL, "machine": info}
    for operation, by_size in results.items():
        figures: dict[str, dict[str, float]] = {}
        for size, ns in by_size.items():
            ours, raw = ns["ours"], ns["raw"]
            ratio, cpu_ratio = ours["wall"] / raw["wall"], ours["cpu"] / raw["cpu"]
            others = {k: v for k, v in ns.items() if k not in ("ours", "raw")}
            shown = ", ".join(f"{k} {v['wall']:,.0f}" for k, v in others.items())
            flag = "" if max(ratio, cpu_ratio) <= GOAL else f"  (> {GOAL}x)"
            print(
                f"{operation:<10} {int(size):>6,} | {ours['wall']:>7,.0f} {raw['wall']:>7,.0f} {ratio:>5.2f}x"
                f" | {ours['cpu']:>7,.0f} {raw['cpu']:>7,.0f} {cpu_ratio:>5.2f}x | {shown}{flag}"
            )
            rmw = ns.get("raw_read_modify_write")
            if rmw is not None:
                vs_rmw = ours["cpu"] / rmw["cpu"]
                print(f"{'':<17} | merge / raw_read_modify_write, CPU time: {vs_rmw:.2f}x (goal <= {RMW_GOAL}x)")
            figures[size] = {
                "ours_ns_per_key": round(ours["wall"], 1),
                "raw_ns_per_key": round(raw["wall"], 1),
                "ratio": round(ratio, 2),
                "ours_cpu_ns_per_key": round(ours["cpu"], 1),
                "raw_cpu_ns_per_key": round(raw["cpu"], 1),
                "cpu_ratio": round(cpu_ratio, 2),
                **{f"{k}_ns_per_key": round(v["wall"], 1) for k, v in others.items()},
                **{f"{k}_cpu_ns_per_key": round(v["cpu"], 1) for k, v in others.items()},
                **({"vs_raw_rmw_cpu_ratio": round(ours["cpu"] / rmw["cpu"], 2)} if rmw is not None else {}),
            }
        summary[operation] = figures
    summary["seconds"] = round(seconds, 1)
    print(f"took {seconds:.1f} s")
    print(json.dumps(summary, separators=(",", ":")))


def profile(bench: Bench, size: int, rounds: int) -> None:
    """Print where our multi_get and merge spend their time (cProfile, top functions by own time)."""
    for name, run in (
        ("multi_get", lambda: bench.kv.multi_get(bench.sample(size))),
        ("merge", lambda: bench.merge([(k, 1) for k in bench.sample(size)])),
    ):
        profiler = cProfile.Profile()
        for _ in range(rounds):
            profiler.runcall(run)
        print(f"--- profile of {name}, {rounds} x {size:,} keys (sample() of the keys included) ---")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="print cProfile tables instead of timing")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="iqgraph-bench-") as tmp:
        bench = Bench(Path(tmp), args.keys, args.seed)
        try:
            if args.profile:
                profile(bench, max(args.sizes), 10)
                return
            results = measure(bench, args.sizes, args.repeats)
        finally:
            bench.close()
    report(results, args.keys, args.repeats, time.perf_counter() - started)


if __name__ == "__main__":
    main()
