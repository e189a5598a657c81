"""The README's GraphQL blocks, each with the example app it is written for.

A block right after a ``<!-- app: NAME -->`` line is a query of ``iqgraph.examples.NAME:app`` as
``iqgraph schema`` prints it; an unmarked block queries the shop stores every example shop has (the schema
tests' shop app runs it compiled and on graphql-core).
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_queries() -> list[tuple[str | None, str]]:
    """Return (the app a block is marked for, or None; the document) for every GraphQL block of the README."""
    found = re.findall(r"(?:<!-- app: (\w+) -->\n)?```graphql\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return [(app or None, document) for app, document in found]
