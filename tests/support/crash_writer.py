"""A writer process for the crash tests of the stores: it applies batches of 10 offsets each to every kind of store
and crashes on demand; and a dump of its database, byte for byte, to compare two runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rocksdict import Options, Rdict

import iqgraph.stores as stores_pkg
from iqgraph.stores.partition import COMMITTED_AT_KEY

REPO = Path(stores_pkg.__file__).resolve().parents[1]

# A writer process: applies batches of 10 offsets each to every kind of store, and crashes on demand.
# argv: state root, mode, number of batches. Batch b is a pure function of b, so two runs that apply the
# same batches must leave byte-identical databases.
WRITER = r"""
import os, signal, sys
from pathlib import Path
from iqgraph.stores import BloomSpec, COUNT, StateDirectory, StoreKind, StoreSpec, WindowSpec

root, mode, batches = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
SPECS = [
    StoreSpec("counts", StoreKind.KEY_VALUE, "string", COUNT),
    StoreSpec("latest", StoreKind.KEY_VALUE, "int"),
    StoreSpec("windows", StoreKind.WINDOW, "string", COUNT, window=WindowSpec(100, grace_ms=50, retention_ms=1000)),
    StoreSpec("seen", StoreKind.BLOOM, "string", bloom=BloomSpec(capacity=1000, error_rate=0.01)),
]
BATCH = 10
stores = StateDirectory(root, "crash-test").open("events", 0, SPECS)
db = stores.db


def kill():
    os.kill(os.getpid(), signal.SIGKILL)


def build(b):
    tx = db.begin(b * BATCH, (b + 1) * BATCH)
    keys = [f"k{(b * 7 + i) % 50}" for i in range(BATCH)]
    stores.kv("counts").merge(tx, [(k, 1) for k in keys])
    stores.kv("latest").merge(tx, [(b * BATCH + i, {"batch": b, "i": i}) for i in range(BATCH)])
    records = [(k, b * 37 + i - (i % 3) * 60, 1) for i, k in enumerate(keys)]
    stores.window("windows").aggregate(tx, records)
    stores.bloom("seen").add(tx, keys)
    return tx


b = db.next_offset() // BATCH
while mode == "forever" or b < batches:
    tx = build(b)
    last = b == batches - 1
    if last and mode == "exit-before-commit":
        os._exit(1)
    if last and mode == "kill-before-commit":
        kill()
    if last and mode == "kill-in-commit":
        tx.before_commit(kill)  # runs after the views flushed into the batch, before the write
    tx.commit()
    if last and mode == "kill-after-commit":
        kill()
    b += 1
    if mode == "forever":
        print(db.next_offset(), flush=True)
stores.close()
"""


def python(script: str, *args: object) -> list[str]:
    """Return the command line that runs script with args in the repository's interpreter."""
    return [sys.executable, "-c", script, *map(str, args)]


def run_writer(root: Path, mode: str, batches: int) -> int:
    """Run the writer to completion (or its crash) and return its exit code."""
    done = subprocess.run(python(WRITER, root, mode, batches), cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0 or not done.stderr.strip(), done.stderr.decode()
    return done.returncode


def dump(root: Path) -> dict[str, dict[bytes, bytes]]:
    """Return every column family of the writer's database, as raw bytes (not the wall-clock time of the last
    commit, which differs between any two runs)."""
    path = str(root / "events-0")
    names = Rdict.list_cf(path, Options(raw_mode=True))
    db = Rdict(path, Options(raw_mode=True), column_families={n: Options(raw_mode=True) for n in names})
    try:
        out: dict[str, dict[bytes, bytes]] = {}
        for name in names:
            family = db.get_column_family(name)
            out[name] = {k: v for k, v in family.items() if k != COMMITTED_AT_KEY}
            del family
        return out
    finally:
        db.close()
