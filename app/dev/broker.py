"""``iqgraph broker``: a throwaway Apache Kafka broker on a given port with an app's topics, until Ctrl-C.

For users' own tests and drills: the same broker ``iqgraph dev`` and the test suite run (``KafkaBroker``:
KRaft, one combined controller and broker), on loopback. ``--data-dir`` keeps its data for a later run;
without it the data is deleted when it stops.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

from iqgraph.app.cluster.topics import create_topics
from iqgraph.streaming.apache_kafka import KAFKA_VERSION, KafkaBroker
from iqgraph.streaming.definitions import App


def run_broker(app: App | None, port: int, data_dir: Path | None) -> int:
    """Start a broker on port, create app's topics, print where it is, and stop it on Ctrl-C or SIGTERM."""
    stopping: list[int] = []  # a plain flag: an Event set in a signal handler deadlocks with its own wait()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    started = time.monotonic()
    with KafkaBroker(port=port, data_dir=data_dir) as broker:
        print(f"iqgraph broker: Apache Kafka {KAFKA_VERSION} at {broker.bootstrap_servers}, "
              f"ready in {time.monotonic() - started:.1f} s", flush=True)  # fmt: skip
        if app is not None:
            created = create_topics({"bootstrap.servers": broker.bootstrap_servers}, app)
            shown = ", ".join(f"{name} ({n} partitions)" for name, n in created.items()) or "none missing"
            print(f"iqgraph broker: topics of {app.name}: {shown}", flush=True)
        print("iqgraph broker: Ctrl-C stops it", flush=True)
        while not stopping:
            time.sleep(0.2)
        print("iqgraph broker: stopping", flush=True)
    return 0
