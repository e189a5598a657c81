"""Cost per key of the key-value store view against raw rocksdict, on the same data, in one run.

Two operations, each measured through our view and through rocksdict directly on an equivalent
database (same options, a column family holding the same encoded bytes):

- multi_get: ``KeyValueStore.multi_get(keys)`` (encode keys, check state, one RocksDB multi-get,
  decode + finalize values) vs ``Rdict.get([encoded keys])`` (bytes out).
- merge: ``KeyValueStore.merge`` inside a ``PartitionTransaction`` + commit (read-modify-write of
  count states, with the offset) vs a raw ``WriteBatch`` put of precomputed values + write.

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
from pathlib import Path

import orjson
from rocksdict import Options, Rdict, WriteBatch

# This file is bench/stores.py: run as a script, its own directory comes first on sys.path and
# `import stores` would import this file. Put the repository (the stores package) ahead of it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stores import (  # noqa: E402
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


def timed(fn: Callable[[], object]) -> int:
    """Return the wall time of fn() in ns, with the garbage collector paused (as timeit does)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        fn()
        return time.perf_counter_ns() - start
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

    def merge(self, items: list[tuple[str, int]]) -> None:
        start = self.stores.db.next_offset()
        tx = self.stores.db.begin(start, start + len(items))
        assert tx is not None
        self.kv.merge(tx, items)
        tx.commit()

    def raw_put(self, encoded: list[tuple[bytes, bytes]]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in encoded:
            batch.put(key, value, self.raw_handle)
        self.raw.write(batch)

    def raw_read_modify_write(self, encoded: list[tuple[bytes, int]]) -> None:
        stored = self.raw_cf.get([k for k, _ in encoded])
        batch = WriteBatch(raw_mode=True)
        for (key, partial), raw in zip(encoded, stored, strict=True):
            old = 0 if raw is None else orjson.loads(raw[1:])
            batch.put(key, b"\x01" + orjson.dumps(old + partial), self.raw_handle)
        self.raw.write(batch)


def median_ns_per_key(samples: list[int], size: int) -> float:
    return statistics.median(samples) / size


def measure(bench: Bench, sizes: list[int], repeats: int) -> dict[str, dict[str, dict[str, float]]]:
    """Return {operation: {batch size: {variant: median ns per key}}}, variants interleaved per repeat."""
    results: dict[str, dict[str, dict[str, float]]] = {"multi_get": {}, "merge": {}}
    for size in sizes:
        get: dict[str, list[int]] = {"ours": [], "partition_db": [], "raw": []}
        put: dict[str, list[int]] = {"ours": [], "raw": [], "raw_read_modify_write": []}
        for rep in range(repeats + 1):  # the first round warms caches and is dropped
            keys = bench.sample(size)
            encoded = [k.encode() for k in keys]
            times = {
                "ours": timed(lambda keys=keys: bench.kv.multi_get(keys)),  # type: ignore[misc]
                "partition_db": timed(lambda e=encoded: bench.stores.db.multi_get(STORE, e)),  # type: ignore[misc]
                "raw": timed(lambda e=encoded: bench.raw_cf.get(e)),  # type: ignore[misc]
            }
            items = [(k, 1) for k in bench.sample(size)]
            precomputed = [(k.encode(), encode_value(bench.rng.randint(1, 1000))) for k, _ in items]
            partials = [(k.encode(), p) for k, p in items]
            merges = {
                "ours": timed(lambda items=items: bench.merge(items)),  # type: ignore[misc]
                "raw": timed(lambda p=precomputed: bench.raw_put(p)),  # type: ignore[misc]
                "raw_read_modify_write": timed(lambda p=partials: bench.raw_read_modify_write(p)),  # type: ignore[misc]
            }
            if rep:
                for name, ns in times.items():
                    get[name].append(ns)
                for name, ns in merges.items():
                    put[name].append(ns)
        results["multi_get"][str(size)] = {name: median_ns_per_key(s, size) for name, s in get.items()}
        results["merge"][str(size)] = {name: median_ns_per_key(s, size) for name, s in put.items()}
    return results


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_1min": round(os.getloadavg()[0], 2),
    }


def report(results: dict[str, dict[str, dict[str, float]]], n_keys: int, repeats: int, seconds: float) -> None:
    info = machine()
    print(f"stores bench: {n_keys:,} keys, {repeats} repetitions per size, medians; {info}")
    print(f"{'operation':<10} {'batch':>6} {'ours ns/key':>12} {'raw ns/key':>11} {'ours/raw':>9}   breakdown")
    summary: dict[str, object] = {"keys": n_keys, "repeats": repeats, "goal_ratio": GOAL, "machine": info}
    for operation, by_size in results.items():
        figures: dict[str, dict[str, float]] = {}
        for size, ns in by_size.items():
            ratio = ns["ours"] / ns["raw"]
            extra = {k: v for k, v in ns.items() if k not in ("ours", "raw")}
            shown = ", ".join(f"{k} {v:,.0f}" for k, v in extra.items())
            flag = "" if ratio <= GOAL else "  > goal"
            row = f"{operation:<10} {int(size):>6,} {ns['ours']:>12,.0f} {ns['raw']:>11,.0f} {ratio:>8.2f}x"
            print(f"{row}   {shown}{flag}")
            figures[size] = {
                "ours_ns_per_key": round(ns["ours"], 1),
                "raw_ns_per_key": round(ns["raw"], 1),
                "ratio": round(ratio, 2),
                **{f"{k}_ns_per_key": round(v, 1) for k, v in extra.items()},
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
