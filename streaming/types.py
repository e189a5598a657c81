"""What an owner-side field's function receives: read-only views of the stores, as Protocols.

A function ``(key, views: StoreViews)`` (streaming.owner_fields) reads the stores on the node that owns its
key through these methods only; ``iqgraph.StoreViews`` is this Protocol, for the function's annotation. The
node's implementation, and which partitions each view reads, is app.owner.views (it satisfies these
structurally: the app layer depends on this one, not the other way round).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from iqgraph.stores import Key, WindowedValue

#: The most entries a view's ``range`` or ``prefix`` returns unless told otherwise.
DEFAULT_LIMIT = 100


class KeyValueView(Protocol):
    """A key-value store's values, finalized (an average, not its sum and count), as a client reads them."""

    def get(self, key: Key) -> Any:
        """Return the value of key (None if absent)."""
        ...

    def get_many(self, keys: Sequence[Key]) -> list[Any]:
        """Return the value of each key, in key order (None where absent)."""
        ...

    def range(self, from_key: Key | None = None, to_key: Key | None = None, limit: int = DEFAULT_LIMIT) -> list[Any]:
        """Return up to limit (key, value) with from_key <= key <= to_key (None: open), in key order."""
        ...

    def prefix(self, prefix: str, limit: int = DEFAULT_LIMIT) -> list[Any]:
        """Return up to limit (key, value) whose string key starts with prefix, in key order."""
        ...


class WindowView(Protocol):
    """A window store's windows of a key."""

    def fetch(self, key: Key, time_from: int | None = None, time_to: int | None = None) -> list[WindowedValue]:
        """Return key's windows (key, start, end, value; times in epoch ms) with start in the range, oldest first."""
        ...


class BloomView(Protocol):
    """A bloom store's membership test."""

    def might_contain(self, key: Key) -> bool:
        """Return False if key was never added, True if it probably was."""
        ...

    def might_contain_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return, per key, whether it was probably added."""
        ...


class StoreViews(Protocol):
    """The read-only views one call of an owner-side field gets: the stores on the key's node, by name."""

    def kv(self, store: str) -> KeyValueView:
        """Return a read-only view of the key-value store called store."""
        ...

    def window(self, store: str) -> WindowView:
        """Return a read-only view of the window store called store."""
        ...

    def bloom(self, store: str) -> BloomView:
        """Return a read-only view of the bloom store called store."""
        ...
