"""Production's ASGI app of a node that is not started (``build_asgi``), over the schema tests' stores, plus a page
that loads React from a CDN (the browser tests' control: Chromium here reaches loopback only)."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from iqgraph.schema import GraphQLApp
from tests.schema.conftest import Hosted, api_factory
from tests.support.apps import SHOP_TYPES, shop_app

CDN_CONTROL = """<!doctype html><html><body><p id="result">pending</p>
<script src="https://unpkg.com/react@18.2.0/umd/react.production.min.js"></script>
<script>document.getElementById("result").textContent = "react is " + typeof React;</script></body></html>"""


def served_app(hosted: Hosted) -> Any:
    """Return production's ASGI app (build_asgi, of a node that is not started) plus a CDN control page."""
    from iqgraph.app.http.server import build_asgi
    from iqgraph.app.node import Node
    from iqgraph.app.settings import Settings

    api = api_factory(shop_app(), SHOP_TYPES, hosted)()

    async def cdn_control(_: Request) -> HTMLResponse:
        return HTMLResponse(CDN_CONTROL)

    served = build_asgi(Node(Settings(app="shop:app"), shop_app()), GraphQLApp(api.schema, api.queries, api.limits))
    control = Starlette(routes=[Route("/control", cdn_control)])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await (control if scope.get("path") == "/control" else served)(scope, receive, send)

    return app
