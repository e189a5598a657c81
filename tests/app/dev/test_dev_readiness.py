"""What a dev run says while its node gets ready: the restore as it moves on, then how long it took and why."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from iqgraph.app.dev.readiness import PROGRESS_EVERY_S, NodeStart, Readiness, read_readiness
from iqgraph.app.restore_progress import SLOW_START_S
from iqgraph.schema.types import NodeInfo, PartitionInfo
from iqgraph.schema.wire import READY_PATH, encode_ready
from iqgraph.streaming.broker import free_port
from tests.support.servers import serve_in_thread


def restoring(lag: int, of: int = 8, still: int = 8) -> Readiness:
    return Readiness(ready=False, partitions=of, restoring=still, lag=lag)


def test_read_readiness_decodes_a_nodes_body_and_is_none_while_nothing_answers() -> None:
    partitions = (
        PartitionInfo("orders", 0, "active", "RUNNING", 10, 10),
        PartitionInfo("orders", 1, "active", "RESTORING", 0, 25),
        PartitionInfo("orders", 2, "active", "CREATED", 0, 5),
    )
    info = NodeInfo("node-0", "http://127.0.0.1", "RUNNING", partitions, None)

    async def readyz(_: Request) -> JSONResponse:
        return JSONResponse(encode_ready(False, "RUNNING", "node-0", info), status_code=503)

    with serve_in_thread(Starlette(routes=[Route(READY_PATH, readyz)])) as url:
        assert read_readiness(url) == Readiness(ready=False, partitions=3, restoring=2, lag=30)
    assert read_readiness(f"http://127.0.0.1:{free_port()}") is None


def test_the_restore_is_told_when_it_moves_on_at_most_every_two_seconds() -> None:
    start = NodeStart(spawned=100.0)

    said = [
        start.observe(None, 103.0),  # not serving yet
        start.observe(restoring(3_000), 111.0),
        start.observe(restoring(10, still=2), 111.0 + PROGRESS_EVERY_S / 2),  # moved on, but too soon to say
        start.observe(restoring(10, still=2), 111.0 + PROGRESS_EVERY_S + 0.5),
        start.observe(restoring(10, still=2), 111.0 + 3 * PROGRESS_EVERY_S),  # the same
        start.observe(Readiness(True, 8, 0, 0), 120.0),
    ]

    assert said == [
        None,
        "started in 11.0 s; restoring 8 of 8 partitions: 3,000 records to apply",
        None,
        "restoring 2 of 8 partitions: 10 records to apply",
        None,
        None,
    ]


def test_a_slow_start_says_where_the_time_went() -> None:
    start = NodeStart(spawned=100.0)
    start.observe(restoring(3_000), 111.0)

    line = start.ready_line("node-0", 123.0, "/tmp/run/node-0.log")

    assert line == (
        "node-0 is ready 23.0 s after it was started (slow: 11.0 s to start Python and restore the stores, then "
        "12.0 s to start Spark and apply the 3,000 records already in Kafka; /tmp/run/node-0.log says more)"
    )


def test_a_quick_start_says_only_how_long() -> None:
    start = NodeStart(spawned=100.0)
    start.observe(Readiness(True, 8, 0, 0), 100.0 + SLOW_START_S)

    line = start.ready_line("node-1", 100.0 + SLOW_START_S, "x.log")

    assert line == f"node-1 is ready {SLOW_START_S:.1f} s after it was started"
