"""Exactly once across crashes with the changelog (issue 41): a writer SIGKILLed at a random point of a random batch
(before anything is sent, mid-send, before the transaction's commit, after it, after the local write) and started
again leaves its stores, and a copy restored from the changelog, equal to a run that never crashed. 20 runs."""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from pathlib import Path

from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.changelog import CHANGELOG_CONFIG, Changelogs, changelog_topic
from tests.stores.conftest import SPECS, TOPIC
from tests.support.changelog_batches import POINTS, batch_rng, contents, write_batch

BATCHES = 8
RUNS = 20


def child(bootstrap: str, app: str, state: Path, *crash: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.support.changelog_batches", "--bootstrap", bootstrap, "--app", app]
    command += ["--state", str(state), "--batches", str(BATCHES), *crash]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603


def test_sigkill_at_random_points_of_a_batch_leaves_stores_and_changelog_equal_to_the_truth(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    truth_stores = StateDirectory(tmp_path / "truth", "test-app").open(TOPIC, 0, SPECS)
    for index in range(BATCHES):
        write_batch(truth_stores, None, batch_rng(index))
    truth = contents(truth_stores)
    truth_stores.close()
    bootstrap = broker.bootstrap_servers
    rng = random.Random(41)
    for run in range(RUNS):
        point, at = POINTS[run % len(POINTS)], rng.randrange(BATCHES)
        app = f"crash{uuid.uuid4().hex[:8]}"
        broker.create_topics({changelog_topic(app, TOPIC): 1}, CHANGELOG_CONFIG)
        state = tmp_path / f"run{run}"
        crashed = child(bootstrap, app, state, "--crash", point, "--at", str(at))
        assert crashed.returncode == -9, (point, at, crashed.stdout, crashed.stderr[-2000:])
        again = child(bootstrap, app, state)
        assert again.returncode == 0, (point, at, again.stderr[-2000:])
        stores = StateDirectory(state, "test-app").open(TOPIC, 0, SPECS)
        assert contents(stores) == truth, (point, at)
        stores.close()
        restored = StateDirectory(tmp_path / f"restored{run}", "test-app").open(TOPIC, 0, SPECS)
        Changelogs({"bootstrap.servers": bootstrap}, app).restore(TOPIC, restored)
        assert contents(restored) == truth, (point, at)
        restored.close()
