"""The README's code blocks: its GraphQL blocks, each with the example app it is written for, and its Python blocks.

A block right after a ``<!-- app: NAME -->`` line is a query of ``iqgraph.examples.NAME:app`` as
``iqgraph schema`` prints it; an unmarked block queries the shop stores every example shop has (the schema
tests' shop app runs it compiled and on graphql-core).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_queries() -> list[tuple[str | None, str]]:
    """Return (the app a block is marked for, or None; the document) for every GraphQL block of the README."""
    found = re.findall(r"(?:<!-- app: (\w+) -->\n)?```graphql\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return [(app or None, document) for app, document in found]


def readme_python_blocks() -> list[tuple[int, str]]:
    """Return (the line its fence is on, the code dedented) for every Python block of the README, indented ones too."""
    text = README.read_text()
    blocks = re.finditer(r"^([ \t]*)```python\n(.*?)^\1```", text, flags=re.DOTALL | re.MULTILINE)
    return [(text.count("\n", 0, m.start()) + 1, textwrap.dedent(m[2])) for m in blocks]
