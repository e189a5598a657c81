"""Mergeable aggregations: how a partial aggregate from one batch folds into the stored state.

Spark computes one partial per (partition, store, key[, window]) and batch; the sink merges it into the
state already stored. Each aggregation has a state form (what is stored) and a value form (what a
query returns): they differ for avg, stored as [sum, count] so that it stays mergeable, and for
latest_by_time (a column-keyed store's latest), stored as [event_ms, partition, offset, value].
A user aggregation (``iqgraph.streaming.user_aggregations``) and ``collect`` bring their own Aggregation;
``StoreDefinition.state_aggregation`` is where a store's is resolved, built-in or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Aggregation:
    """A named merge of partial states and the finalization of a state into a value."""

    name: str
    merge: Callable[[Any, Any], Any]
    finalize: Callable[[Any], Any] = staticmethod(lambda state: state)


def _sum(old: Any, new: Any) -> Any:
    return old + new


def _min(old: Any, new: Any) -> Any:
    return new if new < old else old


def _max(old: Any, new: Any) -> Any:
    return new if new > old else old


def _latest(old: Any, new: Any) -> Any:
    return new


def _latest_by_time(old: list[Any], new: list[Any]) -> list[Any]:
    # states are [event_ms, partition, offset, value]: the greatest (event time, partition, offset) wins
    return new if new[:3] > old[:3] else old


def _latest_by_time_value(state: list[Any]) -> Any:
    return state[3]


def _avg_merge(old: list[Any], new: list[Any]) -> list[Any]:
    return [old[0] + new[0], old[1] + new[1]]


def _avg_value(state: list[Any]) -> float | None:
    return state[0] / state[1] if state[1] else None


COUNT = Aggregation("count", _sum)
SUM = Aggregation("sum", _sum)
MIN = Aggregation("min", _min)
MAX = Aggregation("max", _max)
LATEST = Aggregation("latest", _latest)
AVG = Aggregation("avg", _avg_merge, _avg_value)
#: latest of a store keyed by a column: one key's records arrive on several partitions, so "latest" is the
#: record with the greatest event time (ties: the greater partition, then offset), not the last merged.
LATEST_BY_TIME = Aggregation("latest_by_time", _latest_by_time, _latest_by_time_value)

AGGREGATIONS: dict[str, Aggregation] = {a.name: a for a in (COUNT, SUM, MIN, MAX, LATEST, AVG, LATEST_BY_TIME)}


def merge_state(aggregation: Aggregation, old: Any, partial: Any) -> Any:
    """Return the state after folding partial into old (None: nothing stored yet)."""
    if partial is None:
        return old
    if old is None:
        return partial
    return aggregation.merge(old, partial)


def aggregation_named(name: str) -> Aggregation:
    """Return the aggregation called name; raise ValueError listing the known ones."""
    try:
        return AGGREGATIONS[name]
    except KeyError:
        raise ValueError(f"unknown aggregation {name!r}; known: {', '.join(AGGREGATIONS)}") from None


class AggregatedStates:
    """How a store whose states are an aggregation's (one per key) combines them over partitions and finalizes
    them: the key-value and ranking stores' part of the read protocol (``stores.types.StoreReads``)."""

    __slots__ = ()

    @staticmethod
    def combiner(agg: Aggregation) -> Callable[[Any, Any], Any]:
        """Return how two partitions' states of one key combine."""
        return lambda a, b: merge_state(agg, a, b)

    @staticmethod
    def finalizer(agg: Aggregation) -> Callable[[Any], Any] | None:
        """Return how a read's state becomes its value."""
        return agg.finalize
