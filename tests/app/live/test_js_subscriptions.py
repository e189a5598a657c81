"""Subscriptions with the reference JavaScript clients under node (``tests/js``): graphql-ws over a websocket and
graphql-sse over Server-Sent Events follow the same keys on production's ASGI app (``build_asgi``) on a real
uvicorn, over the in-process live shop, while batches are written: each client gets the snapshot, then every
batch's value, the same on both transports, ending at the store's value; and resume after their last positions with
exactly what changed since."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from iqgraph.app.http.server import build_asgi
from iqgraph.app.node import Node
from iqgraph.app.settings import Settings
from iqgraph.schema import GraphQLApp
from tests.js import NODE_DIR, require_node
from tests.support.live_shop import KEYS, WATCH, LiveShop, open_live_shop, where
from tests.support.servers import serve_in_thread

BATCHES = 3


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LiveShop]]:
    shop = open_live_shop(tmp_path_factory.mktemp("js-live"))
    graphql = GraphQLApp(shop.schema, shop.queries, shop.limits, live=shop.live)
    with serve_in_thread(build_asgi(Node(Settings(app="shop:app"), shop.app), graphql), log_level="warning") as url:
        yield f"{url}/graphql", shop
    shop.close()


def test_graphql_ws_and_graphql_sse_follow_a_key_through_batches_alike(served: tuple[str, LiveShop]) -> None:
    require_node()
    url, shop = served
    key = KEYS[0]
    shop.write([(key, "pen", 0)])
    command = ["node", "live_clients.mjs", url, WATCH, json.dumps({"keys": [key]}), str(1 + BATCHES), "60"]
    with subprocess.Popen(command, cwd=NODE_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        assert run.stdout is not None
        ready = {run.stdout.readline().strip() for _ in range(2)}
        assert ready == {"ready ws", "ready sse"}, (ready, run.stderr.read() if run.stderr else "")
        for _ in range(BATCHES):
            shop.write([(key, "pen", 0)])
            time.sleep(0.2)  # one batch after the other: each is its own event
        out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    received = json.loads(out.splitlines()[-1])
    events = {name: [(e["perKeyWatch"]["value"], e["perKeyWatch"]["snapshot"]) for e in data]
              for name, data in received.items()}  # fmt: skip
    first = shop.count(key) - BATCHES  # type: ignore[operator]
    expected = [(first, True), *((first + i, False) for i in range(1, BATCHES + 1))]
    assert events == {"ws": expected, "sse": expected}, events
    positions = {name: [e["perKeyWatch"]["position"] for e in data] for name, data in received.items()}
    assert positions["ws"] == positions["sse"]  # the same changes, at the same positions, on both transports


def test_graphql_ws_and_graphql_sse_resume_after_their_last_positions_with_exactly_what_changed(
    served: tuple[str, LiveShop],
) -> None:
    """Both clients follow a busy key, a quiet key (same partition) and a key of the other partition, go away, and
    resume with ``after`` = the last position they received per partition: they get exactly the busy key's value
    (changed twice while away, while orders of another key moved its partition on) and then the quiet key's next
    change — nothing at or before their positions, nothing missed, each at its own order's offset."""
    require_node()
    url, shop = served
    busy, quiet = [k for k in KEYS[1:] if where(k) == 0][:2]
    unwatched = [k for k in KEYS[1:] if where(k) == 0][2]
    other = next(k for k in KEYS[1:] if where(k) == 1)
    keys = [busy, quiet, other]
    shop.write([(k, "pen", 0) for k in keys])
    first = _follow(url, {"keys": keys}, len(keys))
    after = {name: _last_positions(data) for name, data in first.items()}
    at = shop.orders.changed_at  # each key's last order's offset
    assert after["ws"] == after["sse"] == {0: max(at[busy], at[quiet]), 1: at[other]}
    shop.write([(busy, "pen", 0), (unwatched, "pen", 0)])
    shop.write([(busy, "pen", 0), (unwatched, "pen", 0)])
    resume = [{"partition": p, "offset": o} for p, o in sorted(after["ws"].items())]
    got = _follow(url, {"keys": keys, "after": resume}, 2, then=lambda: shop.write([(quiet, "pen", 0)]))
    expected = [
        {"key": k, "value": shop.count(k), "snapshot": k == busy, "position": {"partition": 0, "offset": at[k]}}
        for k in (busy, quiet)
    ]
    fields = ("key", "value", "snapshot", "position")
    for name, data in got.items():
        assert [{f: e["perKeyWatch"][f] for f in fields} for e in data] == expected, name


def _follow(url: str, variables: dict[str, Any], count: int, then: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run both clients until each has count events (then: called once both have their first); return their data."""
    command = ["node", "live_clients.mjs", url, WATCH, json.dumps(variables), str(count), "60"]
    with subprocess.Popen(command, cwd=NODE_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        assert run.stdout is not None
        ready = {run.stdout.readline().strip() for _ in range(2)}
        assert ready == {"ready ws", "ready sse"}, (ready, run.stderr.read() if run.stderr else "")
        if then is not None:
            then()
        out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    received: dict[str, Any] = json.loads(out.splitlines()[-1])
    return received


def _last_positions(data: list[dict[str, Any]]) -> dict[int, int]:
    last: dict[int, int] = {}
    for e in data:
        position = e["perKeyWatch"]["position"]
        last[position["partition"]] = max(position["offset"], last.get(position["partition"], -1))
    return last
