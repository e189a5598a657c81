"""Follow one key live: print a shop customer's order count now, then each new value, as its node applies it.

GraphQL over SSE (graphql-sse's distinct connections mode, as Strawberry serves it): a POST to /graphql that
accepts ``text/event-stream`` answers with a ``next`` event per change, until ``complete`` or Ctrl-C::

    pip install httpx-sse
    python -m iqgraph.examples.follow_key http://127.0.0.1:8000 customer-0001 [--token JWT | --api-key KEY]

Each line: the key, its value, and the position to resume from (``after: [{partition, offset}]``). The
README's "Live subscriptions" shows this file's ``follow``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import httpx
from httpx_sse import connect_sse

WATCH = """subscription($keys: [String!]!) {
  orderCountWatch(keys: $keys) { key value position { partition offset } }
}"""


def follow(url: str, key: str, headers: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Yield the key's change events: its value now, then every new one."""
    request = {"query": WATCH, "variables": {"keys": [key]}}
    with httpx.Client(timeout=httpx.Timeout(10, read=None)) as client:  # no read timeout: changes come when they do
        with connect_sse(client, "POST", f"{url}/graphql", json=request, headers=headers) as events:
            events.response.raise_for_status()
            for event in events.iter_sse():
                if event.event == "complete":
                    return
                result = event.json()
                if result.get("errors"):
                    raise RuntimeError(result["errors"])
                yield result["data"]["orderCountWatch"]


def main() -> None:
    """Print each change of the key until the stream ends or Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="a node, e.g. http://127.0.0.1:8000")
    parser.add_argument("key", help="a customer, e.g. customer-0001")
    parser.add_argument("--token", help="a JWT (when the node runs --auth jwt)")
    parser.add_argument("--api-key", help="an API key (when the node runs --auth api-key)")
    args = parser.parse_args()
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    if args.api_key:
        headers["x-api-key"] = args.api_key
    try:
        for change in follow(args.url.rstrip("/"), args.key, headers):
            position = change["position"]
            print(
                change["key"],
                change["value"],
                f"(partition {position['partition']}, offset {position['offset']})",
                flush=True,
            )
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
