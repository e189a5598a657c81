"""Keys grouped for the replica executor (``app.query.executor``): the keys of one read that need the same
partitions are one batch, asked together, and an answer's values are cut back per batch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from iqgraph.app.query import routing
from iqgraph.stores import Key
from iqgraph.streaming.definitions import App, StoreDefinition


@dataclass
class Batches:
    """Keys grouped by the partitions a read of each must ask (``batches``): one entry per partition set."""

    partitions: list[tuple[int, ...]] = field(default_factory=list)  # batch → its partitions
    members: list[list[int]] = field(default_factory=list)  # batch → the indexes of its keys
    errors: dict[int, Exception] = field(default_factory=dict)  # index → why the key cannot be routed

    def needs(self) -> dict[int, list[int]]:
        """Return per batch the partitions it needs (what ``execute`` is given)."""
        return {b: list(ps) for b, ps in enumerate(self.partitions)}

    def of(self, partitions: Mapping[int, Sequence[int]]) -> Iterable[tuple[int, int, tuple[int, ...]]]:
        """Yield (batch, key index, partitions read) for the batches of a group, in order."""
        for b, ps in partitions.items():
            for i in self.members[b]:
                yield b, i, tuple(ps)


def batches(app: App, definition: StoreDefinition, keys: Sequence[Key], detected: str) -> Batches:
    """Return keys grouped by the partitions a read must ask (the producers' partitioner, detected)."""
    found = Batches()
    where: dict[tuple[int, ...], int] = {}
    for i, partitions in enumerate(routing.store_keys_partitions(app, definition, keys, detected)):
        if isinstance(partitions, Exception):
            found.errors[i] = partitions
            continue
        b = where.get(partitions)
        if b is None:
            b = where[partitions] = len(found.partitions)
            found.partitions.append(partitions)
            found.members.append([])
        found.members[b].append(i)
    return found


def per_batch(batches: Sequence[int], members: Sequence[Sequence[int]], values: Sequence[Any]) -> list[list[Any]]:
    """Return an answer's values (every batch's, in turn) cut per batch."""
    found, start = [], 0
    for b in batches:
        found.append(list(values[start : start + len(members[b])]))
        start += len(members[b])
    return found
