"""The state directory of a node: one partition database per topic-partition, and their store views.

Layout: ``<root>/.iqgraph-state`` (a marker naming the application) and ``<root>/<topic>-<partition>/``
(one RocksDB each). A directory without the marker is refused rather than written into.
"""

from __future__ import annotations

import fcntl
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from iqgraph.stores.bloom import BloomStore
from iqgraph.stores.exceptions import StateDirError, StateDirLockedError
from iqgraph.stores.kinds import StoreView, store_class
from iqgraph.stores.kv import KeyValueStore
from iqgraph.stores.partition import PartitionDB
from iqgraph.stores.ranking import RankingStore
from iqgraph.stores.spec import StoreSpec
from iqgraph.stores.window import WindowStore

MARKER = ".iqgraph-state"
MARKER_FORMAT = 1
_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")


class PartitionStores:
    """The store views of one partition database, created once so that each keeps its own state."""

    def __init__(self, db: PartitionDB) -> None:
        self.db = db
        self._views: dict[str, StoreView] = {}

    def store(self, name: str) -> StoreView:
        """Return the view of store name, whatever its kind: what the read protocol (``stores.types``) is asked."""
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = store_class(self.db.spec(name).kind)(self.db, name)
        return view

    def kv(self, name: str) -> KeyValueStore:
        """Return the key-value view of store name."""
        return _as(self.store(name), KeyValueStore, name)

    def window(self, name: str) -> WindowStore:
        """Return the window view of store name."""
        return _as(self.store(name), WindowStore, name)

    def bloom(self, name: str) -> BloomStore:
        """Return the bloom view of store name."""
        return _as(self.store(name), BloomStore, name)

    def ranking(self, name: str) -> RankingStore:
        """Return the ranking view of store name."""
        return _as(self.store(name), RankingStore, name)

    def close(self) -> None:
        """Close the partition database, dropping the views (and their handles)."""
        self._views.clear()
        self.db.close()


V = TypeVar("V")


def _as(view: object, kind: type[V], name: str) -> V:
    if not isinstance(view, kind):
        raise TypeError(f"store {name!r} is not a {kind.__name__}")
    return view


class StateDirectory:
    """Where a node keeps the partition databases of one application."""

    def __init__(self, root: Path, app_id: str) -> None:
        self.root = Path(root)
        self.app_id = app_id
        self._claim()

    def _claim(self) -> None:
        marker = self.root / MARKER
        if marker.exists():
            self._check_marker(marker)
            return
        if self.root.exists() and not self.root.is_dir():
            raise StateDirError(f"state directory {self.root} is a file; point --state-dir at a directory")
        if self.root.exists() and any(self.root.iterdir()):
            raise StateDirError(
                f"{self.root} is not empty and is not an iqgraph state directory (no {MARKER}); "
                "choose an empty or new directory"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"format": MARKER_FORMAT, "app": self.app_id}))

    def _check_marker(self, marker: Path) -> None:
        try:
            content = json.loads(marker.read_text())
            app, fmt = content["app"], content["format"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateDirError(f"{marker} is unreadable; is {self.root} an iqgraph state directory?") from exc
        if fmt != MARKER_FORMAT:
            raise StateDirError(f"{self.root} has state format {fmt}; this version reads {MARKER_FORMAT}")
        if app != self.app_id:
            raise StateDirError(f"{self.root} holds the state of app {app!r}, not {self.app_id!r}")

    def partition_path(self, topic: str, partition: int) -> Path:
        """Return the directory of the database of topic-partition."""
        return self.root / f"{topic}-{partition}"

    def partitions_on_disk(self) -> list[tuple[str, int]]:
        """Return the topic-partitions that have a database here, sorted."""
        found = (_PARTITION_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted((m["topic"], int(m["partition"])) for m in found if m)

    def check_unlocked(self, topic: str, partition: int) -> None:
        """Raise StateDirLockedError if another process holds the database of topic-partition open."""
        lock = self.partition_path(topic, partition) / "LOCK"
        if not lock.exists():
            return
        with lock.open("rb+") as handle:
            try:
                fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise StateDirLockedError(
                    f"{lock.parent} is in use by another process; stop it or give this node another --state-dir"
                ) from None
            fcntl.lockf(handle, fcntl.LOCK_UN)

    def open(self, topic: str, partition: int, specs: Sequence[StoreSpec]) -> PartitionStores:
        """Open (creating if needed) the database of topic-partition with the given stores."""
        return PartitionStores(PartitionDB(self.partition_path(topic, partition), topic, partition, specs))
