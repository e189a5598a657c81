"""GraphQL names from store and column names, and a registry that keeps type names unique.

Store ``order_count`` becomes the root field ``orderCount`` and the types ``OrderCountStore``,
``OrderCountEntry``…; column ``order_id`` becomes the field ``orderId``. Words are the runs of letters
and digits; an all-capitals first word is lowercased whole (``URL_path`` → ``urlPath``).
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Za-z0-9]+")


def _words(name: str) -> list[str]:
    return _WORD.findall(name)


def _valid(name: str, fallback: str) -> str:
    if not name:
        return fallback
    return f"_{name}" if name[0].isdigit() else name


def camel_case(name: str) -> str:
    """Return name as a GraphQL field name: ``order_count`` → ``orderCount``."""
    words = _words(name)
    if not words:
        return "_"
    head = words[0].lower() if words[0].isupper() else words[0][0].lower() + words[0][1:]
    return _valid(head + "".join(w[0].upper() + w[1:] for w in words[1:]), "_")


def pascal_case(name: str) -> str:
    """Return name as a GraphQL type name: ``order_count`` → ``OrderCount``."""
    return _valid("".join(w[0].upper() + w[1:] for w in _words(name)), "Value")


def unique(name: str, taken: set[str]) -> str:
    """Return name, or name with the smallest numeric suffix from 2 not in taken; add it to taken."""
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}{n}", n + 1
    taken.add(candidate)
    return candidate


class TypeNames:
    """The type names given out so far in one schema; each request gets a name not yet given."""

    def __init__(self, reserved: set[str]) -> None:
        self._taken = set(reserved)

    def reserve(self, name: str) -> None:
        """Mark name as given; raise ValueError if it already was."""
        if name in self._taken:
            raise ValueError(f"GraphQL type name {name!r} is used twice")
        self._taken.add(name)

    def new(self, name: str) -> str:
        """Return name if free, else name with a numeric suffix, and mark it given."""
        return unique(name, self._taken)
