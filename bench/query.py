"""Query speed of one node: GraphQL point lookups beside a raw JSON endpoint on the same server, and getMany.

One run, all on this machine:

1. produce ``--events`` generated shop orders, batched, into a 6-partition topic of an embedded Apache Kafka
   broker (``streaming.apache_kafka.KafkaBroker``);
2. start one node (``iqgraph serve`` in a subprocess, raw endpoint on: ``GET /raw/{store}/{key}`` does the
   same RocksDB lookup through the node's LocalPartitions; GraphQL reaches the same LocalPartitions
   through the cluster layer, which on one node routes every key locally, so its cost counts against
   GraphQL) and wait until it is ready and has applied every order; check that every path answers the
   order count the events give;
3. requests per second, same load client, connections and duration for each: point lookups of one
   existing key — (a) ``POST /graphql`` ``{ orderCount { get(key: …) } }`` (compiled), (a') the same with
   ``@include(if: true)``, which no compiled plan covers (the Strawberry/graphql-core path of the same
   node), (b) ``GET /raw/order_count/<key>``, (c) ``GET /graphql?query=…`` — and a dashboard query over
   five stores, compiled and on graphql-core; and (d) ``GET /bare/order_count/<key>`` on a bare Starlette
   endpoint doing the raw endpoint's RocksDB read without the node's layers (bench/bare_lookup.py, read-only
   over the node's partition databases: the ceiling, its own process's CPU counted); runs alternate,
   ``--rounds`` times, each measured run after ``--settle`` seconds of the same load unmeasured (the run before
   it leaves garbage the collector would otherwise charge to this one), and the medians count.
   The client is wrk when it is on PATH (``make bench-query`` installs it as root), else a Python asyncio
   keep-alive client (bench/query.py's own, much lighter than httpx so that it does not cap the raw rate).
   Each run also records the node process's CPU time per request, the steadier figure on a shared machine;
4. latency of one ``getMany`` of 1,000 keys that all exist (``bench-0000``..``bench-0999``, one order each,
   produced after the generated orders), with the keys inline in the query and as a variable:
   p50 and p99 over ``--samples`` sequential requests, and the node's CPU time per request;
5. a summary, and as the last line one JSON object with every figure.

Targets (printed, not asserted): GraphQL point lookups ≥ 0.5 of the raw endpoint's rate; getMany of
1,000 local keys ≤ 5 ms p50.

Usage: ``make bench-query`` or ``.venv/bin/python bench/query.py [--events N] [--duration S] [--rounds R]``;
``--compiled TREE`` adds a second node running mypyc-compiled modules from TREE beside the first (issue 44).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(ROOT))

from iqgraph.examples.shop import generate_orders  # noqa: E402
from iqgraph.schema.persisted import sha256_of  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import free_port, produce  # noqa: E402
from tests.support.otlp import otlp_receiver  # noqa: E402

PARTITIONS = 6
SEED = 11
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STORE, FIELD = "order_count", "orderCount"
KEY = "customer-0001"  # the shop generator's most frequent customer: it always exists
TARGET_RATIO = 0.5
TARGET_TRUSTED_RATIO = 0.8  # a trusted document's lookup beside the raw endpoint (issue 31)
TARGET_RAW_OVER_BARE = 1.5  # the raw endpoint's CPU per request over a bare Starlette endpoint's (issue 31)
TARGET_GETMANY_P50_MS = 5.0
APP_MODULE = "bench_query_app"


# -- 1. produce ------------------------------------------------------------------------------------------


def orders(events: int) -> list[tuple[Any, Any]]:
    """Return the bench's generated orders, then one order of each of the 1,000 getMany keys (so all exist)."""
    generated = list(itertools.islice(generate_orders(SEED, START_MS), events))
    template = dict(generated[0][1])
    extra = [(key, {**template, "order_id": f"bench-{key}", "customer": key}) for key in many_keys()]
    return generated + extra


def produce_orders(bootstrap: str, topic: str, events: list[tuple[Any, Any]]) -> float:
    """Produce events (batched); return the seconds it took."""
    started = time.perf_counter()
    produce(bootstrap, topic, ((str(k).encode(), orjson.dumps(v), None) for k, v in events))
    return time.perf_counter() - started


# -- 2. the node -----------------------------------------------------------------------------------------


class NodeProcess:
    """One ``iqgraph serve`` subprocess with the raw endpoint on, in a process group of its own."""

    def __init__(
        self, workdir: Path, bootstrap: str, topic: str, port: int, master: str, env: dict[str, str] | None = None
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.topic = topic
        self.log_path = workdir / "node.log"
        trusted = workdir / "trusted-documents.json"  # the point lookup, sent by its documentId (graphql_trusted)
        trusted.write_text(json.dumps({sha256_of(point_query(KEY)): point_query(KEY)}))
        (workdir / f"{APP_MODULE}.py").write_text(
            "from iqgraph.examples.shop import build_app\n"
            "from iqgraph.streaming.definitions import KafkaSettings\n\n"
            f"app = build_app({topic!r}, {PARTITIONS}, KafkaSettings(bootstrap_servers={bootstrap!r}))\n"
        )
        self.command = [
            sys.executable, "-m", "iqgraph.app.cli", "serve", "--app", f"{APP_MODULE}:app",
            "--bootstrap-servers", bootstrap,
            "--port", str(port), "--state-dir", str(workdir / "state"), "--spark-master", master,
            "--trusted-documents", str(trusted),
        ]  # fmt: skip
        pythonpath = os.pathsep.join(filter(None, [str(workdir), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": pythonpath, "IQGRAPH_RAW_ENDPOINT": "true", **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the node (Spark, the streaming query, uvicorn)."""
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(  # noqa: S603
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log_tail(self, size: int = 3000) -> str:
        """Return the end of the node's output."""
        return self.log_path.read_text(errors="replace")[-size:] if self.log_path.exists() else ""

    def wait_caught_up(self, client: httpx.Client, events: int, timeout: float) -> float:
        """Wait until /readyz answers 200 and every partition has applied all events; return the seconds."""
        started = time.perf_counter()
        query = "{ node { partitions { partition state appliedOffset lag } } }"
        while time.perf_counter() - started < timeout:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"the node exited early:\n{self.log_tail()}")
            try:
                if client.get(f"{self.url}/readyz").status_code == 200:
                    parts = graphql(client, self.url, query)["node"]["partitions"]
                    if len(parts) == PARTITIONS and sum(int(p["appliedOffset"]) for p in parts) >= events:
                        return time.perf_counter() - started
            except (httpx.TransportError, KeyError, TypeError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"the node did not catch up in {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the node gracefully (SIGINT: uvicorn drains, the node stops Spark), kill its group if stuck."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class BareEndpoint:
    """bench/bare_lookup.py in a subprocess: the raw endpoint's read on a bare Starlette, read-only over the node's
    partition databases (its ceiling)."""

    def __init__(self, state_dir: Path, topic: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, str(ROOT / "bench" / "bare_lookup.py"), str(state_dir), topic, str(PARTITIONS)]
        self.process = subprocess.Popen([*command, str(port)], cwd=ROOT)  # noqa: S603
        self.pid = self.process.pid

    def __enter__(self) -> BareEndpoint:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/bare/{STORE}/{KEY}", timeout=2)
                return self
            except httpx.TransportError:
                if self.process.poll() is not None:
                    raise RuntimeError("the bare endpoint exited") from None
                time.sleep(0.2)
        raise TimeoutError("the bare endpoint did not start in 60 s")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(30)


def graphql(client: httpx.Client, url: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    """Return the data of a GraphQL POST; raise on errors."""
    response = client.post(f"{url}/graphql", json={"query": query, "variables": variables or {}})
    body = response.json()
    if response.status_code != 200 or body.get("errors"):
        raise RuntimeError(f"GraphQL {response.status_code}: {body.get('errors')}")
    return body["data"]


# -- 3. point lookups ------------------------------------------------------------------------------------


class Endpoint:
    """One request to repeat under load."""

    def __init__(
        self, name: str, method: str, path: str, body: bytes = b"", url: str | None = None, pid: int | None = None
    ) -> None:
        """url, pid: where it is served, and the process whose CPU it costs, when not the node (the bare endpoint)."""
        self.name, self.method, self.path, self.body = name, method, path, body
        self.url, self.pid = url, pid


#: A dashboard's query over five stores (20 keys of the order count and total spend).
DASHBOARD = (
    '{ orderCount { get(key: "KEY") top: getMany(keys: KEYS) } totalSpend { getMany(keys: KEYS) } '
    'latestOrder { get(key: "KEY") { orderId item amount ts } } '
    'ordersPerMinute { fetch(key: "KEY", from: 0) { start value } } '
    'itemsSold { mightContainMany(keys: ["widget", "gadget", "unicorn"]) } }'
)


def point_query(key: str) -> str:
    """Return the point lookup's document."""
    return f'{{ {FIELD} {{ get(key: "{key}") }} }}'


def endpoints(key: str) -> list[Endpoint]:
    """Return the requests under load: GraphQL POST (compiled; and, with ``@include(if: true)``, which no
    plan covers, the same lookup on the Strawberry/graphql-core path of the same node; and by its trusted
    documentId, its plan compiled at start), raw GET, GraphQL GET, and the dashboard query over five stores
    (compiled, and on graphql-core)."""
    query = point_query(key)
    core = f'{{ {FIELD} {{ get(key: "{key}") @include(if: true) }} }}'
    dashboard = DASHBOARD.replace("KEYS", json.dumps(many_keys()[:20])).replace("KEY", key)
    dashboard_core = dashboard.replace("{ orderId", "{ orderId @include(if: true)", 1)
    return [
        Endpoint("graphql_post", "POST", "/graphql", orjson.dumps({"query": query})),
        Endpoint("graphql_post_core", "POST", "/graphql", orjson.dumps({"query": core})),
        Endpoint("graphql_trusted", "POST", "/graphql", orjson.dumps({"documentId": f"sha256:{sha256_of(query)}"})),
        Endpoint("graphql_trusted_get", "GET", f"/graphql?documentId=sha256:{sha256_of(query)}"),
        Endpoint("raw", "GET", f"/raw/{STORE}/{key}"),
        Endpoint("graphql_get", "GET", f"/graphql?query={quote(query)}"),
        Endpoint("dashboard", "POST", "/graphql", orjson.dumps({"query": dashboard})),
        Endpoint("dashboard_core", "POST", "/graphql", orjson.dumps({"query": dashboard_core})),
    ]


def check_answers(client: httpx.Client, url: str, key: str, expected: int) -> None:
    """Check that every endpoint answers expected for key, so that the load measures correct answers."""
    for endpoint in endpoints(key):
        response = client.request(
            endpoint.method, url + endpoint.path, content=endpoint.body or None,
            headers={"content-type": "application/json"} if endpoint.body else None,
        )  # fmt: skip
        body = response.json()
        if endpoint.name.startswith("dashboard"):
            if response.status_code != 200 or body.get("errors"):
                raise RuntimeError(f"{endpoint.name} answered {response.status_code} {str(body)[:300]}")
            continue
        got = body.get("value") if endpoint.name == "raw" else (body.get("data") or {}).get(FIELD, {}).get("get")
        if response.status_code != 200 or got is None or int(got) != expected:
            raise RuntimeError(f"{endpoint.name} answered {response.status_code} {body}, expected {expected}")


def wrk_script(directory: Path, endpoint: Endpoint) -> Path:
    """Write the Lua script that makes wrk send endpoint's method, body and content type."""
    path = directory / f"{endpoint.name}.lua"
    lines = [f'wrk.method = "{endpoint.method}"']
    if endpoint.body:
        lines += [f"wrk.body = [==[{endpoint.body.decode()}]==]", 'wrk.headers["Content-Type"] = "application/json"']
    path.write_text("\n".join(lines) + "\n")
    return path


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def run_wrk(url: str, endpoint: Endpoint, script: Path, args: argparse.Namespace, duration: float) -> dict[str, Any]:
    """Run wrk against endpoint; return req/s, errors and latency percentiles (ms)."""
    command = [
        "wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{duration:g}s", "--latency", "-s", str(script),
        url + endpoint.path,
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout  # noqa: S603
    rate, total = re.search(r"Requests/sec:\s+([\d.]+)", out), re.search(r"(\d+) requests in", out)
    if rate is None or total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors:(.*)", out)
    latency = {f"p{q}": float(v) * _UNITS[u] for q, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)", out, re.M)}
    return {
        "rps": float(rate.group(1)),
        "requests": int(total.group(1)),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": socket_errors.group(1).strip() if socket_errors else None,
        **{k: round(v, 2) for k, v in latency.items()},
    }


async def _connection(host: str, port: int, request: bytes, deadline: float, latencies: list[float]) -> int:
    """Send request over one keep-alive connection until deadline; return how many non-2xx answers came."""
    reader, writer = await asyncio.open_connection(host, port)
    bad = 0
    try:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            latencies.append((time.perf_counter() - sent) * 1000)
            bad += not head.startswith(b"HTTP/1.1 2")
    finally:
        writer.close()
    return bad


def run_python(url: str, endpoint: Endpoint, args: argparse.Namespace, duration: float) -> dict[str, Any]:
    """Run the Python keep-alive client against endpoint; return req/s, errors and latency percentiles (ms)."""
    host, port = url.removeprefix("http://").split(":")
    head = f"{endpoint.method} {endpoint.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    if endpoint.body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(endpoint.body)}\r\n"
    request = (head + "\r\n").encode() + endpoint.body
    latencies: list[float] = []

    async def load() -> int:
        deadline = time.perf_counter() + duration
        tasks = [_connection(host, int(port), request, deadline, latencies) for _ in range(args.connections)]
        return sum(await asyncio.gather(*tasks))

    started = time.perf_counter()
    bad = asyncio.run(load())
    took = time.perf_counter() - started
    return {
        "rps": len(latencies) / took,
        "requests": len(latencies),
        "non_2xx": bad,
        "socket_errors": None,
        "p50": round(percentile(latencies, 50) or 0, 2),
        "p99": round(percentile(latencies, 99) or 0, 2),
    }


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """Return the CPU time (user + system) process pid has used so far: all its threads, or only thread (a tid;
    pid's own is its main thread, where the node's and the bare endpoint's event loops run)."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu(pid: int) -> dict[str, float]:
    """Return CPU seconds so far by thread name (summed over threads of one name) of process pid."""
    found: dict[str, float] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[(task / "comm").read_text().strip()] += cpu_seconds(pid, int(task.name))
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return found


def idle_cpu(pid: int, seconds: float) -> dict[str, Any]:
    """Measure process pid at rest for seconds: its CPU per second, all threads and its main thread's, and the
    busiest threads (librdkafka's, py4j's, the node's own): what a request's CPU share includes at any load."""
    before, main_before, named_before = cpu_seconds(pid), cpu_seconds(pid, pid), threads_cpu(pid)
    started = time.perf_counter()
    time.sleep(seconds)
    took = time.perf_counter() - started
    named = {n: (c - named_before.get(n, 0.0)) / took * 1e3 for n, c in threads_cpu(pid).items()}
    return {
        "cpu_ms_per_s": round((cpu_seconds(pid) - before) / took * 1e3, 1),
        "main_thread_cpu_ms_per_s": round((cpu_seconds(pid, pid) - main_before) / took * 1e3, 1),
        "busiest_threads_ms_per_s": {n: round(v, 1) for n, v in sorted(named.items(), key=lambda x: -x[1])[:6]},
    }


def point_lookups(
    url: str, key: str, args: argparse.Namespace, workdir: Path, pid: int, more: list[Endpoint]
) -> dict[str, list[dict[str, Any]]]:
    """Run every endpoint (and more: served elsewhere) for args.duration, alternating, args.rounds times (after a
    short warm-up each).

    Besides req/s, each run records the serving process's CPU time per request: on a shared machine the
    rate depends on what else runs, the CPU a request costs much less so.
    """
    use_wrk = args.client == "wrk"
    every = [*endpoints(key), *more]
    scripts = {e.name: wrk_script(workdir, e) for e in every} if use_wrk else {}

    def run(endpoint: Endpoint, duration: float) -> dict[str, Any]:
        serving = endpoint.pid or pid
        before, loop_before = cpu_seconds(serving), cpu_seconds(serving, serving)
        if use_wrk:
            result = run_wrk(endpoint.url or url, endpoint, scripts[endpoint.name], args, duration)
        else:
            result = run_python(endpoint.url or url, endpoint, args, duration)
        requests = max(result["requests"], 1)
        result["cpu_us"] = round((cpu_seconds(serving) - before) / requests * 1e6, 1)
        result["loop_cpu_us"] = round((cpu_seconds(serving, serving) - loop_before) / requests * 1e6, 1)
        return result

    runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for endpoint in every:
        run(endpoint, args.warmup)
    for round_ in range(args.rounds):
        for endpoint in every:
            if args.settle:  # the previous endpoint's garbage (graphql-core's, mostly) is collected off the clock
                run(endpoint, args.settle)
            result = run(endpoint, args.duration)
            runs[endpoint.name].append(result)
            print(
                f"  round {round_ + 1}: {endpoint.name:<13} {result['rps']:>9,.0f} req/s"
                f"  {result['cpu_us']:>6,.0f} µs CPU/request ({result['loop_cpu_us']:,.0f} on the event loop's thread)",
                flush=True,
            )
    return runs


# -- 4. getMany ------------------------------------------------------------------------------------------


def many_keys() -> list[str]:
    """Return the 1,000 distinct keys of getMany: customers of one order each, all existing."""
    return [f"bench-{i:04d}" for i in range(1000)]


def get_many_latency(
    client: httpx.Client,
    url: str,
    keys: list[str],
    counts: collections.Counter[str],
    samples: int,
    inline: bool,
    pid: int,
) -> tuple[list[float], float]:
    """Return the ms of samples sequential getMany requests of keys (after a warm-up), and the node's (pid)
    CPU ms per request over them; check each answer."""
    if inline:
        payload: dict[str, Any] = {"query": f"{{ {FIELD} {{ getMany(keys: {json.dumps(keys)}) }} }}"}
    else:
        payload = {"query": f"query($k: [String!]!) {{ {FIELD} {{ getMany(keys: $k) }} }}", "variables": {"k": keys}}
    body = orjson.dumps(payload)
    expected = [counts.get(k) for k in keys]
    latencies = []
    cpu_before = 0.0
    for n in range(samples + 5):
        if n == 5:
            cpu_before = cpu_seconds(pid)
        started = time.perf_counter()
        response = client.post(f"{url}/graphql", content=body, headers={"content-type": "application/json"})
        took = (time.perf_counter() - started) * 1000
        answer = orjson.loads(response.content)
        values = (answer.get("data") or {}).get(FIELD, {}).get("getMany")
        if answer.get("errors") or values is None or [None if v is None else int(v) for v in values] != expected:
            raise RuntimeError(f"getMany answered wrongly: {str(answer)[:500]}")
        if n >= 5:
            latencies.append(took)
    return latencies, (cpu_seconds(pid) - cpu_before) / samples * 1000


# -- 5. report -------------------------------------------------------------------------------------------


def percentile(values: list[float], q: int) -> float | None:
    """Return the q-th percentile of values (inclusive method), None when there are none."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def machine() -> dict[str, object]:
    """Return what the figures depend on besides the code."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_1min": round(os.getloadavg()[0], 2),
    }


def _median(runs: list[dict[str, Any]], name: str) -> float:
    return statistics.median(r[name] for r in runs)


def _latency(measured: tuple[list[float], float]) -> dict[str, float | None]:
    values, cpu_ms = measured
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "cpu_ms_per_request": round(cpu_ms, 2),
        "p50_ms": None if p50 is None else round(p50, 2),
        "p99_ms": None if p99 is None else round(p99, 2),
        "mean_ms": round(statistics.fmean(values), 2) if values else None,
        "samples": len(values),
    }


def report(args: argparse.Namespace, figures: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    """Print the human-readable summary, then the JSON summary as the last line."""
    rps = {name: round(_median(r, "rps")) for name, r in runs.items()}
    cpu = {name: _median(r, "cpu_us") for name, r in runs.items()}
    loop_cpu = {name: _median(r, "loop_cpu_us") for name, r in runs.items()}
    ratio = rps["graphql_post"] / rps["raw"] if rps.get("raw") else None
    trusted_ratio = rps["graphql_trusted"] / rps["raw"] if rps.get("raw") else None
    trusted_get_ratio = rps["graphql_trusted_get"] / rps["raw"] if rps.get("raw") else None
    cpu_ratio = cpu["raw"] / cpu["graphql_post"] if cpu.get("graphql_post") else None
    get_ratio = rps["graphql_get"] / rps["raw"] if rps.get("raw") else None
    bare_cpu_ratio = cpu["raw"] / cpu["bare"] if cpu.get("bare") else None  # the raw endpoint's cost over a bare one's
    bare_loop_ratio = loop_cpu["raw"] / loop_cpu["bare"] if loop_cpu.get("bare") else None  # the same, loop threads
    trusted_bare = rps["graphql_trusted"] / rps["bare"] if rps.get("bare") else None
    inline, variables = _latency(figures.pop("getmany_inline")), _latency(figures.pop("getmany_variables"))
    print(f"\nquery bench: {args.events:,} shop orders, {PARTITIONS} partitions, one node, {machine()}")
    print(f"client: {args.client}, {args.connections} connections, {args.threads} threads, "
          f"{args.duration:g} s per run, {args.rounds} rounds alternating, medians")  # fmt: skip
    labels = {
        "graphql_post": "GraphQL POST", "graphql_post_core": "  on g.-core", "graphql_trusted": "  documentId",
        "graphql_trusted_get": "  … by GET",
        "raw": "raw GET", "bare": "bare GET",
        "graphql_get": "GraphQL GET", "dashboard": "dashboard", "dashboard_core": "  on g.-core",
    }  # fmt: skip
    for name, label in labels.items():
        r = runs[name]
        print(f"{label:<13} {rps[name]:>9,} req/s  {cpu[name]:>6,.0f} µs CPU/req ({loop_cpu[name]:>4,.0f} loop)"
              f"   p50 {_median(r, 'p50'):6.2f} ms"
              f"  p99 {_median(r, 'p99'):6.2f} ms   runs {[round(x['rps']) for x in r]}"
              f"   per core {1e6 / cpu[name]:>7,.0f} req/s")  # fmt: skip
    print(f"compiled / graphql-core: point lookup {rps['graphql_post'] / rps['graphql_post_core']:.2f}×, "
          f"dashboard {rps['dashboard'] / rps['dashboard_core']:.2f}× (req/s)")  # fmt: skip
    print(f"ratio GraphQL POST / raw  {ratio:.3f}   target ≥ {TARGET_RATIO}   (GET: {get_ratio:.3f};"
          f" by CPU per request: {cpu_ratio:.3f})")  # fmt: skip
    print(f"ratio trusted documentId / raw  {trusted_ratio:.3f}   target ≥ {TARGET_TRUSTED_RATIO}"
          f"   (/ bare: {trusted_bare:.3f}; GET ?documentId=: {trusted_get_ratio:.3f})")  # fmt: skip
    print(f"raw endpoint / bare Starlette, CPU per request  {bare_cpu_ratio:.2f}×   target ≤ {TARGET_RAW_OVER_BARE}"
          f"   (req/s: bare {rps['bare']:,}, raw {rps['raw']:,}; the event loops' threads only:"
          f" {bare_loop_ratio:.2f}×)")  # fmt: skip
    idle = figures.get("node_idle")
    if idle:
        print(f"node at rest: {idle['cpu_ms_per_s']:g} ms CPU per second ({idle['main_thread_cpu_ms_per_s']:g} on the"
              f" event loop's thread); busiest threads {idle['busiest_threads_ms_per_s']}")  # fmt: skip
    tracing = figures.get("tracing")
    if tracing:
        print(f"tracing (point lookup, two nodes side by side): off {tracing['off_cpu_us']:.0f} µs CPU/request, "
              f"on {tracing['on_cpu_us']:.0f} µs (+{tracing['added_cpu_us']:.0f} µs); req/s off {tracing['off_rps']:,}"
              f", on {tracing['on_rps']:,}")  # fmt: skip
    compiled = figures.get("compiled")
    if compiled:
        print(f"interpreted beside compiled ({compiled['extension_modules']} extension modules), node CPU per request:")
        for point in ("graphql_post", "graphql_trusted", "raw"):
            i, c = compiled[point]["interpreted"], compiled[point]["compiled"]
            fewer = i["cpu_us"] / c["cpu_us"]
            print(f"  {point:<16} {i['cpu_us']:>6,.0f} → {c['cpu_us']:>6,.0f} µs ({fewer:.2f}× fewer)"
                  f"   req/s {i['rps']:>7,} → {c['rps']:>7,}")  # fmt: skip
        i, c = compiled["getmany_inline_interpreted"], compiled["getmany_inline_compiled"]
        print(f"  getMany 1,000 keys p50 {i['p50_ms']:.2f} → {c['p50_ms']:.2f} ms, node CPU"
              f" {i['cpu_ms_per_request']:.2f} → {c['cpu_ms_per_request']:.2f} ms/request")  # fmt: skip
    existing = figures["getmany_existing_keys"]
    print(f"getMany 1,000 keys ({existing} existing, {1000 - existing} missing), {args.samples} sequential requests:")
    for label, m in (("inline", inline), ("variables", variables)):
        target = f"   target p50 ≤ {TARGET_GETMANY_P50_MS:g}" if label == "inline" else ""
        print(f"  {label:<10} p50 {m['p50_ms']:6.2f} ms  p99 {m['p99_ms']:6.2f} ms"
              f"  node CPU {m['cpu_ms_per_request']:5.2f} ms/request{target}")  # fmt: skip
    errors = {n: sum(x["non_2xx"] for x in r) for n, r in runs.items()}
    summary = {
        "events": args.events,
        "partitions": PARTITIONS,
        "client": args.client,
        "connections": args.connections,
        "threads": args.threads,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "key": KEY,
        "rps": rps,
        "rps_runs": {n: [round(x["rps"]) for x in r] for n, r in runs.items()},
        "cpu_us_per_request": cpu,
        "loop_thread_cpu_us_per_request": loop_cpu,
        "latency_p50_ms": {n: _median(r, "p50") for n, r in runs.items()},
        "non_2xx": errors,
        "ratio_graphql_raw": None if ratio is None else round(ratio, 3),
        "ratio_graphql_get_raw": None if get_ratio is None else round(get_ratio, 3),
        "ratio_trusted_raw": None if trusted_ratio is None else round(trusted_ratio, 3),
        "ratio_trusted_get_raw": None if trusted_get_ratio is None else round(trusted_get_ratio, 3),
        "ratio_trusted_bare": None if trusted_bare is None else round(trusted_bare, 3),
        "raw_over_bare_cpu": None if bare_cpu_ratio is None else round(bare_cpu_ratio, 2),
        "raw_over_bare_loop_cpu": None if bare_loop_ratio is None else round(bare_loop_ratio, 2),
        "ratio_by_cpu": None if cpu_ratio is None else round(cpu_ratio, 3),
        "compiled_over_core": {
            "point": round(rps["graphql_post"] / rps["graphql_post_core"], 2),
            "dashboard": round(rps["dashboard"] / rps["dashboard_core"], 2),
        },
        "dashboard_per_core_rps": round(1e6 / cpu["dashboard"]),
        "getmany": {"keys": 1000, "existing": existing, "inline": inline, "variables": variables},
        **figures,
        "targets": {
            "ratio_graphql_raw": TARGET_RATIO,
            "ratio_trusted_raw": TARGET_TRUSTED_RATIO,
            "raw_over_bare_cpu": TARGET_RAW_OVER_BARE,
            "getmany_p50_ms": TARGET_GETMANY_P50_MS,
        },
        "met": {
            "ratio": ratio is not None and ratio >= TARGET_RATIO,
            "getmany_p50": (inline["p50_ms"] or 1e9) <= TARGET_GETMANY_P50_MS,
        },
        "machine": machine(),
        "seconds": round(time.perf_counter() - args.started, 1),
    }
    print(json.dumps(summary, separators=(",", ":")))


# -- the run ---------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Return the command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000, help="orders to produce before the node starts")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per endpoint")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of unmeasured load before each measured run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians are reported)")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--samples", type=int, default=50, help="sequential getMany requests")
    parser.add_argument("--master", default="local[2]", help="the node's Spark master")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the node to start and catch up")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds the node's CPU at rest is measured")
    parser.add_argument("--keep-serving", type=float, default=0.0, help="serve this many more seconds (profiling)")
    parser.add_argument(
        "--tracing", action="store_true", help="also a second node with IQGRAPH_TRACING=true: the point lookup's CPU "
        "on both, side by side (spans exported to an in-process OTLP receiver)",
    )  # fmt: skip
    parser.add_argument(
        "--compiled", type=Path, metavar="TREE", help="also a second node importing iqgraph from TREE first (the "
        "package laid out with mypyc-compiled modules beside its .py files, issue 44; checked to have loaded them): "
        "the point lookups and getMany on both nodes, side by side",
    )  # fmt: skip
    args = parser.parse_args()
    if args.client == "auto":
        args.client = "wrk" if shutil.which("wrk") else "python"
    args.started = time.perf_counter()
    return args


def measure(args: argparse.Namespace, node: NodeProcess, events: list[Any], workdir: Path) -> tuple[Any, Any]:
    """Wait for the node, check its answers, then run the point-lookup and getMany measurements."""
    counts = collections.Counter(k for k, _ in events)
    figures: dict[str, Any] = {}
    with httpx.Client(timeout=30.0) as client:
        figures["node_ready_s"] = round(node.wait_caught_up(client, len(events), args.timeout), 1)
        print(f"node ready and caught up in {figures['node_ready_s']} s at {node.url}", flush=True)
        check_answers(client, node.url, KEY, counts[KEY])
        assert node.process is not None
        with BareEndpoint(workdir / "state", node.topic) as bare:
            got = client.get(f"{bare.url}/bare/{STORE}/{KEY}").json()
            if got.get("value") != counts[KEY]:
                raise RuntimeError(f"the bare endpoint answered {got}, expected {counts[KEY]}")
            more = [Endpoint("bare", "GET", f"/bare/{STORE}/{KEY}", url=bare.url, pid=bare.pid)]
            figures["node_idle"] = idle_cpu(node.process.pid, args.idle)
            print(f"node at rest: {figures['node_idle']}", flush=True)
            runs = point_lookups(node.url, KEY, args, workdir, node.process.pid, more)
        keys = many_keys()
        figures["getmany_existing_keys"] = sum(k in counts for k in keys)
        for inline in (True, False):
            name = "getmany_inline" if inline else "getmany_variables"
            figures[name] = get_many_latency(client, node.url, keys, counts, args.samples, inline, node.process.pid)
    if args.keep_serving:
        print(f"serving {args.keep_serving:g} s more at {node.url} (pid {node.process and node.process.pid})")
        time.sleep(args.keep_serving)
    return figures, runs


def main() -> None:
    args = parse_args()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    events = orders(args.events)
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="iqgraph-bench-query-") as tmp:
        broker.create_topics({topic: PARTITIONS})
        took = produce_orders(broker.bootstrap_servers, topic, events)
        print(f"produced {len(events):,} orders in {took:.1f} s; starting the node", flush=True)
        node = NodeProcess(Path(tmp), broker.bootstrap_servers, topic, free_port(), args.master)
        node.start()
        try:
            figures, runs = measure(args, node, events, Path(tmp))
            if args.tracing:
                figures["tracing"] = tracing_side_by_side(args, node, broker.bootstrap_servers, topic, events, tmp)
            if args.compiled:
                figures["compiled"] = compiled_side_by_side(args, node, broker.bootstrap_servers, topic, events, tmp)
        finally:
            node.stop()
    report(args, figures, runs)


def alternate(
    args: argparse.Namespace, nodes: dict[str, NodeProcess], points: list[Endpoint], workdir: Path
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Run each endpoint on each node in turn, args.rounds times after a warm-up round; return per endpoint and
    node the runs, each with the node's CPU per request (cpu_us)."""
    scripts = {e.name: wrk_script(workdir, e) for e in points} if args.client == "wrk" else {}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {e.name: {name: [] for name in nodes} for e in points}
    for round_ in range(args.rounds + 1):  # the first round warms every node up
        for point in points:
            for name, node in nodes.items():
                assert node.process is not None
                before = cpu_seconds(node.process.pid)
                duration = args.warmup if round_ == 0 else args.duration
                if point.name in scripts:
                    result = run_wrk(node.url, point, scripts[point.name], args, duration)
                else:
                    result = run_python(node.url, point, args, duration)
                result["cpu_us"] = (cpu_seconds(node.process.pid) - before) / max(result["requests"], 1) * 1e6
                if round_:
                    runs[point.name][name].append(result)
                    print(f"  {point.name:<19} {name:<11} {result['rps']:>9,.0f} req/s"
                          f"  {result['cpu_us']:>6,.0f} µs CPU/req", flush=True)  # fmt: skip
    return runs


def loaded_from(pid: int, tree: Path) -> list[str]:
    """Return the extension modules (.so) process pid has mapped from under tree."""
    prefix = str(tree.resolve())
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if line.split()[-1].startswith(prefix) and ".so" in line})


def compiled_side_by_side(
    args: argparse.Namespace, interpreted: NodeProcess, bootstrap: str, topic: str, events: list[Any], tmp: str
) -> dict[str, Any]:
    """Start a second node importing iqgraph from args.compiled first (PYTHONSAFEPATH: not the repository's
    sources), check that it loaded compiled modules and answers as the first; run the point lookups (POST, trusted
    documentId, raw) on both nodes alternately, then getMany of 1,000 keys on each; return the medians."""
    workdir = Path(tmp) / "compiled"
    workdir.mkdir()
    env = {"PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join([str(args.compiled.resolve()), str(workdir)])}
    compiled = NodeProcess(workdir, bootstrap, topic, free_port(), args.master, env)
    compiled.start()
    counts = collections.Counter(k for k, _ in events)
    figures: dict[str, Any] = {}
    try:
        with httpx.Client(timeout=30.0) as client:
            compiled.wait_caught_up(client, len(events), args.timeout)
            check_answers(client, compiled.url, KEY, counts[KEY])
            assert compiled.process is not None and interpreted.process is not None
            modules = loaded_from(compiled.process.pid, args.compiled)
            if not modules:
                raise RuntimeError(f"the compiled node loaded no extension module from {args.compiled}")
            print(f"compiled node: {len(modules)} extension modules from {args.compiled}", flush=True)
            nodes = {"interpreted": interpreted, "compiled": compiled}
            points = [e for e in endpoints(KEY) if e.name in ("graphql_post", "graphql_trusted", "raw")]
            runs = alternate(args, nodes, points, workdir)
            keys = many_keys()
            for name, node in nodes.items():
                assert node.process is not None
                measured = get_many_latency(client, node.url, keys, counts, args.samples, True, node.process.pid)
                figures[f"getmany_inline_{name}"] = _latency(measured)
    finally:
        compiled.stop()
    for point, by_node in runs.items():
        figures[point] = {
            name: {"cpu_us": round(_median(r, "cpu_us"), 1), "rps": round(_median(r, "rps"))}
            for name, r in by_node.items()
        }
    figures["extension_modules"] = len(modules)
    return figures


def tracing_side_by_side(
    args: argparse.Namespace, off: NodeProcess, bootstrap: str, topic: str, events: list[Any], tmp: str
) -> dict[str, Any]:
    """Start a second node with tracing on, exporting to an in-process OTLP receiver; run the point lookup on the
    two nodes alternately (args.rounds each); return the medians of their CPU per request and req/s."""
    workdir = Path(tmp) / "traced"
    workdir.mkdir()
    with otlp_receiver() as (endpoint, received):
        env = {"IQGRAPH_TRACING": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        on = NodeProcess(workdir, bootstrap, topic, free_port(), args.master, env)
        on.start()
        try:
            with httpx.Client(timeout=30.0) as client:
                on.wait_caught_up(client, len(events), args.timeout)
            [point] = [e for e in endpoints(KEY) if e.name == "graphql_post"]
            runs = alternate(args, {"off": off, "on": on}, [point], workdir)["graphql_post"]
        finally:
            on.stop()
        exported = len(received.spans)
    off_cpu, on_cpu = _median(runs["off"], "cpu_us"), _median(runs["on"], "cpu_us")
    return {
        "off_cpu_us": round(off_cpu, 1),
        "on_cpu_us": round(on_cpu, 1),
        "added_cpu_us": round(on_cpu - off_cpu, 1),
        "off_rps": round(_median(runs["off"], "rps")),
        "on_rps": round(_median(runs["on"], "rps")),
        "spans_exported": exported,
    }


if __name__ == "__main__":
    main()
