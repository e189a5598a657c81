"""The code blocks of the README and of the docs pages it links: GraphQL blocks, each with the example app it is
written for, and Python blocks.

A block right after a ``<!-- app: NAME -->`` line is a query of ``iqgraph.examples.NAME:app`` as
``iqgraph schema`` prints it; an unmarked block queries the shop stores every example shop has (the schema
tests' shop app runs it compiled and on graphql-core). A block marked ``<!-- app: your_app -->`` queries the app
the README's "Your own app" walk-through writes: tests/app/dev/test_dev.py runs it on that app. A block may be indented
(inside a numbered step).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The README first, then every docs page: a block moved from the README to a page stays tested.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
YOUR_APP = "your_app"

_GRAPHQL = re.compile(r"(?:<!-- app: (\w+) -->\n[ \t]*)?```graphql\n(.*?)```", flags=re.DOTALL)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _graphql_blocks(page: Path) -> list[tuple[str | None, str]]:
    return [(app or None, textwrap.dedent(document)) for app, document in _GRAPHQL.findall(page.read_text())]


def readme_queries() -> list[tuple[str | None, str]]:
    """Return (the example app a block is marked for, or None; the document) for every GraphQL block of the README
    and the docs pages, but those of the README's own app."""
    return [block for page in PAGES for block in _graphql_blocks(page) if block[0] != YOUR_APP]


def your_app_queries() -> list[str]:
    """Return the documents of the README's GraphQL blocks marked for the app of "Your own app"."""
    return [document for app, document in _graphql_blocks(README) if app == YOUR_APP]


def readme_python_blocks() -> list[tuple[str, int, str]]:
    """Return (the page, the line its fence is on, the code dedented) for every Python block of the README and the
    docs pages, indented ones too."""
    found = []
    for page in PAGES:
        text = page.read_text()
        blocks = re.finditer(r"^([ \t]*)```python\n(.*?)^\1```", text, flags=re.DOTALL | re.MULTILINE)
        found += [(_name(page), text.count("\n", 0, m.start()) + 1, textwrap.dedent(m[2])) for m in blocks]
    return found
