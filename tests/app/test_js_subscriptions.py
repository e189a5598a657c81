"""Subscriptions with the reference JavaScript clients under node (``tests/js``): graphql-ws over a websocket and
graphql-sse over Server-Sent Events follow the same keys on production's ASGI app (``build_asgi``) on a real
uvicorn, over the in-process live shop, while batches are written: each client gets the snapshot, then every
batch's value, the same on both transports, ending at the store's value."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from iqgraph.app.http.server import build_asgi
from iqgraph.app.node import Node
from iqgraph.app.settings import Settings
from iqgraph.schema import GraphQLApp
from tests.js import NODE_DIR, require_node
from tests.support.live_shop import KEYS, WATCH, LiveShop, open_live_shop
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
