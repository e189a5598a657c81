"""A node's memory under unsigned floods: six concurrent 60 MiB POSTs to /internal/graphql, first on the peers'
listener (refused 401 on the signed head, before the body is read), then on the clients' listener (which serves
no /internal/*: 413 on the Content-Length, nothing read). A 2-node shop cluster on Apache Kafka; node-0's RSS from
/proc/<pid>/status every 20 ms: before, the peak, after.

    .venv/bin/python bench/unsigned_posts.py

The goal (issue 27): no growth beyond the public body limit (4 MiB) per connection. A memory figure, not a speed
ratio: it needs no side-by-side run.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, bench/ comes first on sys.path

from iqgraph.schema.wire import INTERNAL_PATH  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from tests.support.nodes import start_nodes, wait_ready, write_app_module  # noqa: E402

POSTS, BODY_MIB = 6, 60


def rss_mib(pid: int) -> int:
    """Return the resident memory of process pid in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def flood(url: str, pid: int) -> str:
    """POST POSTS unsigned BODY_MIB bodies to url's internal endpoint at once; return statuses and RSS figures."""
    peak, stop = [0], threading.Event()

    def probe() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.02)

    before = rss_mib(pid)
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    body, statuses = b"x" * (BODY_MIB << 20), []

    def post() -> None:
        try:
            headers = {"content-type": "application/json"}
            statuses.append(httpx.post(f"{url}{INTERNAL_PATH}", content=body, headers=headers, timeout=60).status_code)
        except httpx.HTTPError as exc:
            statuses.append(type(exc).__name__)

    posts = [threading.Thread(target=post) for _ in range(POSTS)]
    started = time.monotonic()
    for thread in posts:
        thread.start()
    for thread in posts:
        thread.join()
    took = time.monotonic() - started
    time.sleep(1)
    stop.set()
    prober.join()
    return (
        f"statuses {statuses}; RSS before {before} MiB, peak {peak[0]} MiB (+{peak[0] - before}), "
        f"after {rss_mib(pid)} MiB; {took:.2f} s"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, KafkaBroker() as broker:
        home = Path(tmp)
        broker.create_topics({"orders": 4})
        write_app_module(home, "benchapp", "orders", 4, broker.bootstrap_servers)
        nodes = start_nodes(home, "benchapp", 2)
        try:
            wait_ready(nodes)
            node = nodes[0]
            time.sleep(3)  # settled after start-up
            print(f"peers' listener ({node.peer_url}): {flood(node.peer_url, node.process.pid)}", flush=True)
            print(f"clients' listener ({node.url}): {flood(node.url, node.process.pid)}", flush=True)
        finally:
            for each in nodes:
                each.kill()


if __name__ == "__main__":
    main()
