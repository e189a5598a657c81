"""The weblog example: a web access log keyed by host.

Stores: accesses per host, accesses per host per minute, and a bloom filter of the hosts seen.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from iqgraph import App, Event, Topic, bloom_store, count, iso_timestamp, key_value_store, tumbling, window_store

ACCESS_SCHEMA = "host STRING, method STRING, path STRING, status INT, bytes LONG, ts TIMESTAMP"
PATHS = ["/", "/login", "/cart", "/search", "/product/1", "/product/2", "/api/v1/items", "/static/app.js"]
STATUSES = [200] * 16 + [301, 304, 404, 500]


def generate_accesses(seed: int, start_ms: int) -> Iterator[Event]:
    """Yield access-log lines forever from a few hundred hosts, ~10 ms apart."""
    rng = random.Random(seed)
    now = start_ms
    for _ in range(1 << 62):
        now += rng.randint(1, 20)
        host = f"10.{rng.randint(0, 3)}.{rng.randint(0, 9)}.{int(rng.expovariate(0.05)) % 250}"
        line = {
            "host": host,
            "method": rng.choice(["GET"] * 9 + ["POST"]),
            "path": rng.choice(PATHS),
            "status": rng.choice(STATUSES),
            "bytes": rng.randint(200, 90_000),
            "ts": iso_timestamp(now),
        }
        yield host, line


app = App(
    name="weblog",
    description="A web access log keyed by host",
    topics=[Topic("access_log", schema=ACCESS_SCHEMA, event_time="ts", partitions=6)],
    stores=[
        key_value_store("access_count", "access_log", count(), description="Requests per host"),
        window_store(
            "accesses_per_minute",
            "access_log",
            count(),
            tumbling(minutes=1),
            description="Requests per host per minute",
        ),
        bloom_store("hosts_seen", "access_log", description="Has this host ever made a request?"),
    ],
    generator=generate_accesses,
)
