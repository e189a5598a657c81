"""What a micro-batch's Spark plan costs to build and to run, on a 20-row in-memory batch of the shop example.

Two ways side by side in one run: the decode and partials expressions built again for every batch (as the
sink did before), and built once (``Decoder`` + ``PartialsPlan``, as the sink does). Prints the median build
and run times in ms and a digest of the partial rows (equal for both: the same output).

Usage: ``.venv/bin/python bench/batch_plan.py`` (starts a local[*] Spark session; no broker needed).
"""

from __future__ import annotations

import datetime as dt
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iqgraph.examples.shop import build_app  # noqa: E402
from iqgraph.streaming.decode import Decoder, decode, value_schema  # noqa: E402
from iqgraph.streaming.kafka_source import SCHEMA  # noqa: E402
from iqgraph.streaming.partials import PartialsPlan, partials_frame  # noqa: E402
from iqgraph.streaming.session import build_spark_session  # noqa: E402


def main() -> None:
    spark = build_spark_session("local[*]", shuffle_partitions=2)
    app = build_app("orders", 6)
    topic = app.topic("orders")
    events = list(itertools.islice(app.generator(1, 1_700_000_000_000), 20)) if app.generator else []
    rows = [
        (k.encode(), orjson.dumps(v), "orders", i % 6, i, dt.datetime(2026, 1, 1)) for i, (k, v) in enumerate(events)
    ]
    base = spark.createDataFrame(rows, SCHEMA).coalesce(1).cache()
    base.count()
    schema = value_schema(topic)
    decoder, plan = Decoder(topic, schema), PartialsPlan(app.stores, 2)
    ways: dict[str, Callable[[], object]] = {
        "built every batch": lambda: partials_frame(decode(base, topic, schema), app.stores, {}, 2),
        "built once": lambda: plan.frame(decoder(base), {}),
    }
    for name, build in ways.items():
        built, ran, out = [], [], None
        for _ in range(15):
            started = time.perf_counter()
            frame = build()
            middle = time.perf_counter()
            out = frame.toArrow()  # type: ignore[attr-defined]
            built.append((middle - started) * 1000)
            ran.append((time.perf_counter() - middle) * 1000)
        partials = sorted(map(str, out.to_pylist())) if out is not None else []
        print(
            f"{name:>18}: build {statistics.median(built[3:]):.0f} ms, run {statistics.median(ran[3:]):.0f} ms,"
            f" {len(partials)} partial rows, digest {hash(tuple(partials)) % 10**8}"
        )
    spark.stop()


if __name__ == "__main__":
    main()
