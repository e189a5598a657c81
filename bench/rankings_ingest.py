"""The whole sink's cost of a ranking, with Spark: the music example's plays ingested with and without its ranking.

``bench/rankings.py`` times the sink's merge alone (in process, no Spark): the strictest reading of "the sink's
cost per record". This bench times what a node spends per record in its foreachBatch — Spark's partials (the
ranking's group partial included) and the merge with the index — on the same plays:

1. produce ``--plays`` plays of the music example (skewed popularity) and its catalogue to an embedded broker;
2. ingest them ``--rounds`` times into fresh state directories, alternating the app without the ranking
   (``song_plays`` joined with the catalogue) and with it (``+ top_songs`` per genre), each batch's duration
   heard by the runner's observer (``BatchReport.duration_s``: Spark job and merge);
3. print µs per record of each (median over rounds, the first round of each dropped as warm-up) and the ratio.

Usage: ``flock /tmp/iqgraph-spark.lock .venv/bin/python bench/rankings_ingest.py [--plays N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cluster import machine  # noqa: E402
from iqgraph.examples.music import build_app  # noqa: E402
from iqgraph.stores import StateDirectory  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import produce  # noqa: E402
from iqgraph.streaming.definitions import App  # noqa: E402
from iqgraph.streaming.runner import RunnerSettings, StreamRunner  # noqa: E402
from iqgraph.streaming.session import build_spark_session  # noqa: E402
from iqgraph.streaming.sink import BatchReport  # noqa: E402

PARTITIONS = 6
KEPT = ("catalogue", "song_plays", "top_songs")


def apps(plays: str, songs: str) -> dict[str, App]:
    """Return the music app cut to its catalogue and play counts, without and with the ranking of them."""
    full = build_app(plays, songs, PARTITIONS)
    ranked = [s for s in full.stores if s.name in KEPT]
    ranked = [dataclasses.replace(s, relations=()) if s.name == "top_songs" else s for s in ranked]
    plain = [s for s in ranked if s.name != "top_songs"]
    return {
        "plain": dataclasses.replace(full, stores=plain, entities=[], fields=[]),
        "ranked": dataclasses.replace(full, stores=ranked, entities=[], fields=[]),
    }


def ingest(app: App, spark: object, bootstrap: str, root: Path) -> tuple[float, int]:
    """Ingest every record of the app's topics into fresh stores; return the batches' seconds and play records."""
    reports: list[BatchReport] = []
    settings = RunnerSettings(bootstrap, max_records_per_batch=20_000)
    runner = StreamRunner(app, spark, StateDirectory(root, app.name), settings, observer=reports.append)  # type: ignore[arg-type]
    try:
        runner.start({t.name: list(range(PARTITIONS)) for t in app.topics})
        runner.wait_until_caught_up(timeout=600)
    finally:
        runner.stop()
    plays = [r for r in reports if r.topic == app.topics[0].name]
    return sum(r.duration_s for r in plays), sum(r.records for r in plays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plays", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each app (after one warm-up)")
    args = parser.parse_args()
    spark = build_spark_session("local[2]", shuffle_partitions=2)
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="iqgraph-rank-ingest-") as tmp:
        plays_topic, songs_topic = "plays", "songs"
        broker.create_topics({plays_topic: PARTITIONS, songs_topic: PARTITIONS})
        variants = apps(plays_topic, songs_topic)
        generator = variants["ranked"].generator
        assert generator is not None  # noqa: S101 - the example has one
        events = list(itertools.islice(generator(7, 1_767_225_600_000), 240 + args.plays))
        for topic in (songs_topic, plays_topic):
            records = [(str(k).encode(), orjson.dumps(v), None) for t, k, v in events if t == topic]
            produce(broker.bootstrap_servers, topic, records)
        seconds: dict[str, list[float]] = {"plain": [], "ranked": []}
        for round_ in range(args.rounds + 1):
            for name in ("plain", "ranked") if round_ % 2 == 0 else ("ranked", "plain"):
                took, records = ingest(variants[name], spark, broker.bootstrap_servers, Path(tmp) / f"{name}-{round_}")
                print(f"round {round_} {name}: {records} plays in {took:.2f} s of batches", flush=True)
                if round_:
                    seconds[name].append(took / records * 1e6)
    figures = {name: round(statistics.median(us), 2) for name, us in seconds.items()}
    ratio = round(figures["ranked"] / figures["plain"], 3)
    print(f"foreachBatch µs per play: plain {figures['plain']}, ranked {figures['ranked']}: ranked / plain {ratio}×")
    print(
        json.dumps(
            {
                "plays": args.plays,
                "us_per_record": figures,
                "rounds": seconds,
                "ratio": ratio,
                "machine": machine(),
                "at": time.time(),
            }
        )
    )


if __name__ == "__main__":
    main()
