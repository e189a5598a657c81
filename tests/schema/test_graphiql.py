"""GraphiQL offline: the page and its vendored assets in-process, then in headless Chromium cut off from the net.

The browser tests serve the app ``build_asgi`` makes (of a node that is not started, over the schema tests'
stores) from a real uvicorn on loopback; Chromium can reach loopback only (``tests.support.browser``: a dead SOCKS proxy
and a host resolver that resolves nothing), which a control page loading React from a CDN demonstrates.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from iqgraph.schema.graphiql import SCRIPTS, STATIC_DIR, STYLESHEETS, graphiql_html, graphiql_mount
from tests.schema.conftest import Hosted
from tests.support.browser import BROWSER, browser_page, require_chromium
from tests.support.served import served_app
from tests.support.servers import serve_in_thread


def assets(page: str) -> dict[str, str]:
    """Return the URL of each asset page references, with its integrity attribute."""
    tags = re.findall(r"<(?:script|link)\b[^>]*>", page)
    return {
        re.search(r'(?:src|href)="([^"]+)"', tag)[1]: re.search(r'integrity="([^"]+)"', tag)[1]  # type: ignore[index]
        for tag in tags
        if re.search(r'(?:src|href)="(?!data:)', tag)
    }


async def test_page_and_every_asset_it_references_are_served_with_no_external_url(shop_hosted: Hosted) -> None:
    transport = httpx.ASGITransport(app=served_app(shop_hosted))
    async with httpx.AsyncClient(transport=transport, base_url="http://iqgraph") as http:
        page = await http.get("/graphql", headers={"accept": "text/html"})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert re.findall(r"https?://|=\s*\"//", page.text) == []
        referenced = assets(page.text)
        assert sorted(u.rsplit("/", 1)[1] for u in referenced) == sorted([*SCRIPTS, *STYLESHEETS])
        for url, integrity in referenced.items():
            assert url.startswith("/graphql/static/graphiql/")
            asset = await http.get(url)
            assert asset.status_code == 200, url
            digest = base64.b64encode(hashlib.sha384(asset.content).digest()).decode()
            assert integrity == f"sha384-{digest}", f"{url}: the file and the page's integrity differ"
        query = await http.get("/graphql", params={"query": "{ node { id } }"})  # why the page's param is "q"
        assert query.json() == {"data": {"node": {"id": "node-0"}}}


def test_page_loads_its_assets_from_below_its_own_path() -> None:
    page = graphiql_html("/api/graphql/")
    assert set(assets(page)) == {f"/api/graphql/static/graphiql/{name}" for name in [*SCRIPTS, *STYLESHEETS]}
    assert graphiql_mount("/api/graphql").path == "/api/graphql/static"


def test_license_and_readme_ship_beside_the_assets() -> None:
    names = {p.name for p in (STATIC_DIR / "graphiql").iterdir()}
    assert {"README.md", "LICENSE-graphiql", "LICENSE-react", "LICENSE-react-dom", *SCRIPTS, *STYLESHEETS} <= names


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_chromium()


@pytest.fixture(scope="module")
def server(shop_hosted: Hosted) -> Iterator[str]:
    """Serve the GraphiQL routes with uvicorn on a free loopback port; return its base URL."""
    with serve_in_thread(served_app(shop_hosted)) as url:
        yield url


def dump_dom(chromium: str, url: str, profile: Path) -> str:
    """Return the DOM of url after Chromium, offline, has run its scripts for 15 s of virtual time."""
    command = [chromium, *BROWSER, f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--dump-dom", url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def test_network_cut_keeps_a_cdn_script_from_loading(chromium: str, server: str, tmp_path: Path) -> None:
    assert 'id="result">react is undefined<' in dump_dom(chromium, f"{server}/control", tmp_path)


def test_graphiql_renders_offline(chromium: str, server: str, tmp_path: Path) -> None:
    dom = dump_dom(chromium, f"{server}/graphql", tmp_path)
    assert "graphiql-container" in dom and "graphiql-editors" in dom
    assert "CodeMirror" in dom and "graphiql-execute-button" in dom
    assert "Show Documentation Explorer" in dom and "Show GraphiQL Explorer" in dom  # the explorer plugin
    assert "Loading..." not in dom


def test_a_query_runs_through_the_page_offline(chromium: str, server: str, tmp_path: Path) -> None:
    with browser_page(chromium, tmp_path) as page:
        query = urllib.parse.quote("{ node { id state } }")
        page.call("Page.navigate", url=f"{server}/graphql?q={query}")
        page.wait_for("document.querySelector('.graphiql-execute-button') !== null")
        answered = "document.querySelector('.graphiql-response').innerText.includes('node-0')"
        deadline = time.monotonic() + 60
        while True:  # on a loaded machine the button can be there before the editor takes a click: click again
            page.evaluate("document.querySelector('.graphiql-execute-button').click()")
            clicked = time.monotonic()
            while page.evaluate(answered) is not True and time.monotonic() < clicked + 5:
                time.sleep(0.1)
            if page.evaluate(answered) is True:
                break
            assert time.monotonic() < deadline, "GraphiQL showed no answer in 60 s"
        response = page.evaluate("document.querySelector('.graphiql-response').innerText")
    assert '"id": "node-0"' in response and '"errors"' not in response
