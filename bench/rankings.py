"""Rankings: the sink's cost of keeping a ranking index beside its store, and top-5 per genre on 1 and 3 nodes.

One run, all on this machine, on the music example (``iqgraph.examples.music``):

1. the sink, in-process (no Spark): the same crafted batches applied by two ``StoreSink``s over two state
   directories of 6 partitions each: (a) ``plain``, the music app's ``song_plays`` (a count per song, joined
   with the catalogue) only; (b) ``ranked``, the same plus ``top_songs``, its ranking per genre, kept in the
   same WriteBatch. A batch is ``--batch-records`` plays (20,000) over ``--songs`` songs (2,000, popularity
   1 / n ** --skew, Zipf: a few songs get most plays, most songs some), spread over the partitions by murmur2, as
   Spark's partials bring them: one partial per song and partition, its count, and for the ranking its genre.
   After ``--sink-warmups`` batches of each, ``--sink-rounds`` rounds, each applying one new batch to both
   sinks, the order alternating every round; per sink the wall clock and the thread's CPU time of
   ``StoreSink.apply``, per record. Reported: the median µs per record of each, and ranked / plain (the ratio
   of the medians, and the median of the per-round ratios). ``--profile N`` then profiles N more batches of
   the ranked sink (cProfile) and prints where the time goes;
2. the queries: produce the example's catalogue and ``--plays`` plays, batched, into two 6-partition topics of
   an embedded Apache Kafka broker (``streaming.apache_kafka.KafkaBroker``); two setups, one after the other
   (2 cores: never both at once), of ``iqgraph serve`` subprocesses with ``local[1]`` Spark and 768 MB of driver
   memory as the cluster tests have them: (a) ONE node; (b) a static cluster of 3 nodes (node i active for the
   partitions p with p % 3 == i; the catalogue, a global table, on every node). Each time wait until node-0's
   top 5 of every genre and over all equal a sort of the ground truth, then time ``--samples`` sequential requests of
   ``topSongs { top(group: $g, first: 5) { member value rank } }`` to node-0 after ``--warmups``, the genre
   rotating, every answer checked; p50, p90, p99 and the node CPU per query;
3. a summary, and as the last line one JSON object with every figure.

Targets (printed, not asserted; issue 10's): ranked ≤ 1.5× plain per record (the sink with the index beside
the sink without); top-N p50 ≤ 10 ms on one node.

Usage: ``make bench-rankings`` or, on this machine (others run Spark; the lock serialises),
``flock /tmp/iqgraph-spark.lock .venv/bin/python bench/rankings.py [--plays N] [--samples S] [--only sink]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import random
import signal
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(ROOT))

from bench.cluster import machine, percentile  # noqa: E402 - the cluster bench's figures, shared
from bench.entities import Client, _terminated, cpu_ms, log_tail, stop_nodes  # noqa: E402 - the entities bench's
from iqgraph.examples.music import GENRES, build_app, catalogue  # noqa: E402
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import free_port, produce  # noqa: E402
from iqgraph.streaming.definitions import App, ranking_store  # noqa: E402
from iqgraph.streaming.partitioner import partition_for  # noqa: E402
from iqgraph.streaming.sink import PartitionBatch, StoreSink  # noqa: E402
from tests.support.nodes import NodeProcess, start_node, start_nodes, wait_ready  # noqa: E402

PARTITIONS = 6
NODES = 3
SEED = 29
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
APP_MODULE = "bench_rankings_app"
TARGET_SINK_RATIO = 1.5
TARGET_P50_MS = 10.0
TOP = 5

CHART = "query($g: String) { topSongs { top(group: $g, first: 5) { member value rank } } }"

Chart = list[dict[str, Any]]

# -- the sink --------------------------------------------------------------------------------------------


def sink_apps() -> dict[str, App]:
    """Return the two apps of the sink bench: the example's song_plays alone, and with its ranking per genre."""
    music = build_app()
    stores = {store.name: store for store in music.stores}
    catalogue_, song_plays = stores["catalogue"], stores["song_plays"]  # song_plays joins the catalogue
    top_songs = ranking_store("top_songs", song_plays, group="genre")  # the example's, without its relation
    return {
        "plain": App("music_plain", music.topics, [catalogue_, song_plays]),
        "ranked": App("music_ranked", music.topics, [catalogue_, song_plays, top_songs]),
    }


def play_batches(songs: int, records: int, skew: float, seed: int) -> Iterator[list[str]]:
    """Yield batches of records songs played, skewed: the n-th most popular song is played in proportion to
    1 / n ** skew (Zipf; the example's own generator, Pareto over 240 songs, would touch a few hundred songs
    per batch: 2,000 songs at Zipf 1 touch most of them, the index's heavier case)."""
    rng = random.Random(seed)
    ids = [f"song-{n:05d}" for n in range(songs)]
    rng.shuffle(ids)  # popularity unrelated to the key order
    cumulative = list(itertools.accumulate(1 / (n + 1) ** skew for n in range(songs)))
    while True:
        yield rng.choices(ids, cum_weights=cumulative, k=records)


class SinkBatches:
    """Turns a batch of plays into each partition's PartitionBatch, as Spark's partials bring it."""

    def __init__(self, songs: int, seed: int) -> None:
        rng = random.Random(seed)
        self.genre = {f"song-{n:05d}": rng.choice(GENRES) for n in range(songs)}
        self.partition = {song: int(partition_for(song, PARTITIONS, "string", "murmur2")) for song in self.genre}
        self.offsets = dict.fromkeys(range(PARTITIONS), 0)

    def batches(self, plays: list[str]) -> dict[int, PartitionBatch]:
        """Return the partitions' batches of plays (the offsets follow on from the previous batch's)."""
        per_song = Counter(plays)
        records = Counter(self.partition[song] for song in plays)
        found: dict[int, PartitionBatch] = {}
        for p, n in records.items():
            found[p] = PartitionBatch(first_offset=self.offsets[p], last_offset=self.offsets[p] + n - 1)
            self.offsets[p] += n
        for song, n in per_song.items():
            partials = found[self.partition[song]].partials
            partials["song_plays"].append((song, None, n, n))
            partials["top_songs"].append((song, None, {"genre": self.genre[song]}, n))
        return found


@dataclass
class SinkTimes:
    """The wall clock and thread CPU time of each timed apply, in µs per record."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def open_partitions(root: Path, app: App) -> dict[int, PartitionStores]:
    """Open every partition of app's plays topic in a new state directory under root, running."""
    directory = StateDirectory(root, app.name)
    opened = {p: directory.open("plays", p, app.specs("plays")) for p in range(PARTITIONS)}
    for stores in opened.values():
        stores.db.set_state(PartitionState.RUNNING)
    return opened


def bench_sink(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Apply the same batches to the plain and the ranked sink, alternating; return their costs per record."""
    apps = sink_apps()
    hosted = {name: open_partitions(root / name, app) for name, app in apps.items()}
    sinks = {name: StoreSink(app, app.topic("plays"), hosted[name]) for name, app in apps.items()}
    makers = {name: SinkBatches(args.songs, SEED) for name in apps}  # same genres, each its own offsets
    plays = play_batches(args.songs, args.batch_records, args.skew, SEED)
    times = {name: SinkTimes() for name in apps}
    distinct: list[int] = []
    profile_text = ""
    try:
        for round_ in range(args.sink_warmups + args.sink_rounds):
            batch = next(plays)
            distinct.append(len(set(batch)))
            order = list(apps) if round_ % 2 == 0 else list(reversed(apps))
            for name in order:
                partition_batches = makers[name].batches(batch)
                wall, cpu = time.perf_counter(), time.thread_time()
                applied = sinks[name].apply(partition_batches)
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                if applied.records != len(batch):
                    raise RuntimeError(f"{name}: applied {applied.records} records of {len(batch)}")
                if round_ >= args.sink_warmups:
                    times[name].wall.append(wall * 1e6 / len(batch))
                    times[name].cpu.append(cpu * 1e6 / len(batch))
        check_sink(hosted, makers["ranked"])
        if args.profile:
            profile_text = profile_sink(sinks["ranked"], makers["ranked"], plays, args.profile)
    finally:
        for partitions in hosted.values():
            for stores in partitions.values():
                stores.close()
    return sink_figures(args, times, distinct[args.sink_warmups :], profile_text)


def check_sink(hosted: dict[str, dict[int, PartitionStores]], maker: SinkBatches) -> None:
    """Raise unless both sinks hold the same counts and the ranked one's top 5 per genre is a sort of them."""
    counts: dict[str, Any] = {}
    for name, partitions in hosted.items():
        found: dict[str, Any] = {}
        for stores in partitions.values():
            kv = stores.kv("song_plays")
            songs = [s for s, p in maker.partition.items() if partitions[p] is stores]
            found |= {s: v for s, v in zip(songs, kv.multi_get(songs), strict=True) if v is not None}
        counts[name] = found
    if counts["plain"] != counts["ranked"]:
        raise RuntimeError("the plain and the ranked sink hold different counts")
    ranked = hosted["ranked"]
    for genre in GENRES:
        entries = [e for stores in ranked.values() for e in stores.ranking("top_songs").top(genre, TOP).items]
        got = sorted((-e.value, e.member) for e in entries)[:TOP]
        want = sorted((-n, s) for s, n in counts["ranked"].items() if maker.genre[s] == genre)[:TOP]
        if got != want:
            raise RuntimeError(f"top {TOP} of {genre}: the index has {got}, the counts give {want}")


def profile_sink(sink: StoreSink, maker: SinkBatches, plays: Iterator[list[str]], batches: int) -> str:
    """Return cProfile's top functions (own time, then cumulative) over batches more applies of sink."""
    prepared = [maker.batches(next(plays)) for _ in range(batches)]
    profiler = cProfile.Profile()
    profiler.enable()
    for partition_batches in prepared:
        sink.apply(partition_batches)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(25)
    return out.getvalue()


def sink_figures(
    args: argparse.Namespace, times: dict[str, SinkTimes], distinct: list[int], profile_text: str
) -> dict[str, Any]:
    """Return the medians per record of each sink, and ranked / plain."""
    per: dict[str, Any] = {
        name: {
            "us_per_record": round(statistics.median(t.wall), 3),
            "cpu_us_per_record": round(statistics.median(t.cpu), 3),
            "p90_us_per_record": round(percentile(t.wall, 90), 3),
        }
        for name, t in times.items()
    }
    plain, ranked = times["plain"], times["ranked"]
    median_keys = statistics.median(distinct)
    for name in per:
        per[name]["us_per_distinct_key"] = round(per[name]["us_per_record"] * args.batch_records / median_keys, 2)
    figures = {
        "batch_records": args.batch_records,
        "songs": args.songs,
        "skew": args.skew,
        "distinct_songs_per_batch": median_keys,
        "rounds": args.sink_rounds,
        "warmups": args.sink_warmups,
        **per,
        "ratio": round(per["ranked"]["us_per_record"] / per["plain"]["us_per_record"], 3),
        "cpu_ratio": round(per["ranked"]["cpu_us_per_record"] / per["plain"]["cpu_us_per_record"], 3),
        "paired_median_ratio": round(statistics.median(r / p for r, p in zip(ranked.wall, plain.wall, strict=True)), 3),
        "index_us_per_record": round(per["ranked"]["us_per_record"] - per["plain"]["us_per_record"], 3),
    }
    if profile_text:
        figures["profile_batches"] = args.profile
        figures["_profile"] = profile_text
    return figures


# -- the queries -----------------------------------------------------------------------------------------


@dataclass
class Truth:
    """The charts the plays give: each genre's top 5, and over every genre (None)."""

    charts: dict[str | None, Chart]
    plays: int


def produce_events(bootstrap: str, plays: str, songs: str, count: int) -> Truth:
    """Produce the example's catalogue and count plays into the two topics; return the charts they give."""
    app = build_app(plays, songs, PARTITIONS)
    assert app.generator is not None
    entries = catalogue(SEED)
    records: dict[str, list[tuple[bytes, bytes | None, None]]] = {plays: [], songs: []}
    played: Counter[str] = Counter()
    for event in itertools.islice(app.generator(SEED, START_MS), len(entries) + count):
        topic, key, value = app.addressed(event)
        records[topic.name].append((str(key).encode(), orjson.dumps(value), None))
        if topic.name == plays:
            played[str(key)] += 1
    for topic_name in (songs, plays):
        produce(bootstrap, topic_name, records[topic_name])
    charts: dict[str | None, Chart] = {}
    for genre in [*GENRES, None]:
        kept = sorted((-n, s) for s, n in played.items() if genre is None or entries[s]["genre"] == genre)
        charts[genre] = [{"member": s, "value": -n, "rank": i} for i, (n, s) in enumerate(kept[:TOP], start=1)]
    return Truth(charts, count)


def write_app_module(home: Path, plays: str, songs: str, bootstrap: str) -> None:
    """Write the module whose `app` the nodes serve: the music example on the bench's topics."""
    home.mkdir(parents=True, exist_ok=True)
    (home / f"{APP_MODULE}.py").write_text(
        textwrap.dedent(f"""
        from iqgraph.examples.music import build_app
        from iqgraph.streaming.definitions import KafkaSettings
        app = build_app({plays!r}, {songs!r}, {PARTITIONS}, KafkaSettings(bootstrap_servers={bootstrap!r}))
    """)
    )


def chart(client: Client, url: str, genre: str | None) -> Chart:
    """Return node url's top 5 of genre."""
    found: Chart = client.data(url, CHART, {"g": genre})["topSongs"]["top"]
    return found


def wait_caught_up(client: Client, url: str, truth: Truth, timeout: float) -> None:
    """Wait until url answers every chart as the plays give it."""
    deadline = time.monotonic() + timeout
    answer: Any = None
    while time.monotonic() < deadline:
        answer = {genre: client.graphql(url, CHART, {"g": genre}) for genre in truth.charts}
        if all(not a.get("errors") and a["data"]["topSongs"]["top"] == truth.charts[g] for g, a in answer.items()):
            return
        time.sleep(0.5)
    raise TimeoutError(f"node-0 did not catch up in {timeout:.0f} s: {str(answer)[:500]}")


def time_charts(args: argparse.Namespace, client: Client, nodes: list[NodeProcess], truth: Truth) -> dict[str, Any]:
    """Time the top 5 of each genre in turn on node-0, each answer checked; return ms and node CPU per query."""
    url = nodes[0].url
    genres = itertools.cycle(GENRES)
    for _ in range(args.warmups):
        genre = next(genres)
        if chart(client, url, genre) != truth.charts[genre]:
            raise RuntimeError(f"wrong top {TOP} of {genre}")
    ms: list[float] = []
    cpu: list[float] = []
    for _ in range(args.samples):
        genre = next(genres)
        cpu_before = cpu_ms(nodes)
        started = time.perf_counter()
        found = chart(client, url, genre)
        ms.append((time.perf_counter() - started) * 1000)
        cpu.append(cpu_ms(nodes) - cpu_before)
        if found != truth.charts[genre]:
            raise RuntimeError(f"wrong top {TOP} of {genre}: {found}, expected {truth.charts[genre]}")
    return {
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "node_cpu_ms": round(statistics.fmean(cpu), 2),
        "samples": len(ms),
    }


def run_setup(args: argparse.Namespace, home: Path, count: int, topics: tuple[str, str, str], truth: Truth) -> Any:
    """Start count nodes, wait for them, time the charts on node-0; stop the nodes whatever happens."""
    write_app_module(home, *topics)
    started = time.perf_counter()
    if count == 1:
        nodes = [start_node(home, APP_MODULE, "node-0", free_port())]
    else:
        nodes = start_nodes(home, APP_MODULE, count)
    client = Client()
    try:
        wait_ready(nodes, timeout=args.timeout)
        wait_caught_up(client, nodes[0].url, truth, args.timeout)
        ready_s = round(time.perf_counter() - started, 1)
        print(f"{count} node(s) ready and caught up in {ready_s} s; timing", flush=True)
        latency = time_charts(args, client, nodes, truth)
    except (httpx.HTTPError, RuntimeError, TimeoutError, AssertionError, OSError):
        for node in nodes:
            print(f"--- {node.id} log tail ---\n{log_tail(node)}", file=sys.stderr)
        raise
    finally:
        client.close()
        stop_nodes(nodes)
    return {"nodes": count, "ready_s": ready_s, **latency}


def bench_queries(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Produce the plays, then time the charts on one node, then on three."""
    tag = uuid.uuid4().hex[:8]
    plays, songs = f"plays-{tag}", f"songs-{tag}"
    setups: dict[str, Any] = {}
    with KafkaBroker() as broker:
        broker.create_topics({plays: PARTITIONS, songs: PARTITIONS})
        truth = produce_events(broker.bootstrap_servers, plays, songs, args.plays)
        print(f"produced {len(catalogue(SEED))} songs and {args.plays:,} plays", flush=True)
        topics = (plays, songs, broker.bootstrap_servers)
        for name, count in (("one_node", 1), ("three_nodes", NODES)):
            if args.only in (None, "queries", name):
                setups[name] = run_setup(args, root / name, count, topics, truth)
                print(f"{name}: {json.dumps(setups[name], separators=(',', ':'))}", flush=True)
    return setups


# -- report ----------------------------------------------------------------------------------------------


def met(figures: dict[str, Any]) -> dict[str, bool]:
    """Return which targets the figures meet."""
    found = {}
    if "sink" in figures:
        found["sink_ranked_over_plain"] = figures["sink"]["ratio"] <= TARGET_SINK_RATIO
    if "one_node" in figures.get("queries", {}):
        found["one_node_top5_p50"] = figures["queries"]["one_node"]["p50_ms"] <= TARGET_P50_MS
    return found


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Print the human-readable summary, then the JSON summary as the last line."""
    print(f"\nrankings bench, {machine()}")
    sink = figures.get("sink")
    if sink is not None:
        print(
            f"\nsink: {sink['rounds']} rounds (+{sink['warmups']} warm-ups) of {sink['batch_records']:,} plays "
            f"over {PARTITIONS} partitions, {sink['songs']:,} songs, Zipf {sink['skew']:g} "
            f"(median {sink['distinct_songs_per_batch']:g} distinct per batch), the order alternating"
        )
        print(f"{'':<48}{'µs/record':>10}{'p90':>8}{'cpu µs':>8}{'µs/key':>8}")
        labels = {"plain": "plain: song_plays", "ranked": "ranked: song_plays + top_songs (per genre)"}
        for name, label in labels.items():
            r = sink[name]
            print(
                f"{label:<48}{r['us_per_record']:>10.3f}{r['p90_us_per_record']:>8.3f}"
                f"{r['cpu_us_per_record']:>8.3f}{r['us_per_distinct_key']:>8.2f}"
            )
        print(
            f"ranked / plain: {sink['ratio']:.2f}× (CPU {sink['cpu_ratio']:.2f}×, paired median "
            f"{sink['paired_median_ratio']:.2f}×), the index {sink['index_us_per_record']:.3f} µs/record; "
            f"target ≤ {TARGET_SINK_RATIO:g}×"
        )
        if "_profile" in sink:
            print(f"\ncProfile of {sink['profile_batches']} more batches of the ranked sink:\n{sink.pop('_profile')}")
    queries = figures.get("queries", {})
    if queries:
        print(f"\ntopSongs {{ top(group: $g, first: {TOP}) {{ member value rank }} }} to node-0, genres in turn:")
        print(f"{'':<14}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}{'mean':>8}{'cpu ms':>8}{'n':>6}{'ready s':>9}")
        for name, r in queries.items():
            print(
                f"{name:<14}{r['p50_ms']:>8.2f}{r['p90_ms']:>8.2f}{r['p99_ms']:>8.2f}{r['mean_ms']:>8.2f}"
                f"{r['node_cpu_ms']:>8.2f}{r['samples']:>6}{r['ready_s']:>9}"
            )
    found = met(figures)
    print("\nmet: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in found.items()))
    summary = {
        "partitions": PARTITIONS,
        "plays": args.plays if queries else None,
        **figures,
        "targets": {"sink_ranked_over_plain_max": TARGET_SINK_RATIO, "one_node_top5_p50_ms_max": TARGET_P50_MS},
        "met": found,
        "machine": machine(),
        "seconds": round(time.perf_counter() - args.started, 1),
    }
    print(json.dumps(summary, separators=(",", ":")))


# -- the run ---------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Return the command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-records", type=int, default=20_000, help="plays per sink batch")
    parser.add_argument("--songs", type=int, default=2_000, help="distinct songs of the sink batches")
    parser.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of the songs' popularity")
    parser.add_argument("--sink-rounds", type=int, default=40, help="timed sink batches of each sink")
    parser.add_argument("--sink-warmups", type=int, default=4, help="untimed sink batches of each sink first")
    parser.add_argument("--profile", type=int, default=0, help="then profile this many ranked batches (cProfile)")
    parser.add_argument("--plays", type=int, default=10_000, help="plays to produce before the nodes start")
    parser.add_argument("--samples", type=int, default=300, help="timed top-5 queries per setup")
    parser.add_argument("--warmups", type=int, default=20, help="untimed top-5 queries per setup first")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for the nodes to start and catch up")
    parser.add_argument("--only", choices=["sink", "queries", "one_node", "three_nodes"], help="run one part only")
    parser.add_argument("--workdir", type=Path, help="keep the state and the nodes' logs here (default: temporary)")
    args = parser.parse_args()
    args.started = time.perf_counter()
    return args


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, _terminated)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="iqgraph-bench-rankings-") as tmp:
        home = args.workdir or Path(tmp)
        if args.only in (None, "sink"):
            figures["sink"] = bench_sink(args, home / "sink")
            timed = {k: v for k, v in figures["sink"].items() if k != "_profile"}
            print(f"sink: {json.dumps(timed, separators=(',', ':'))}", flush=True)
        if args.only != "sink":
            figures["queries"] = bench_queries(args, home)
    report(args, figures)


if __name__ == "__main__":
    main()
