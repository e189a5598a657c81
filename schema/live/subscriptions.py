"""The Subscription root type: every store's keys followed live, as its owner applies each batch.

Naming, for the stores of ``schema.builder``'s table (``order_count`` key-value, ``orders_per_minute``
window, ``items_sold`` bloom):

==================================  =======================================================================
``orderCountWatch(keys, after)``    ``OrderCountChange { key value position dropped snapshot }``: each key's
                                    value now, then every new value
``ordersPerMinuteWatchWindows(      ``OrdersPerMinuteWindowChange { key start end value position dropped
keys, from, after)``                snapshot }``: the keys' windows starting at or after ``from``, then each
                                    window's new value
``itemsSoldWatchContains(keys)``    ``ItemsSoldContained { key position snapshot }``: each key once, when it
                                    is (probably) contained — already, or when a batch adds it
``Position { partition offset }``   the offset of the record that produced a value; ``after: [PositionInput!]``
                                    (the last position of each partition) resumes without gap or duplicate
==================================  =======================================================================

A subscriber that falls behind gets the latest value of a key (window) once, with ``dropped`` counting the
values it replaced; one that falls too far behind gets the values read again from the store
(``snapshot: true``), which hold everything it missed. Events come in offset order per partition. A ranking's
top is followed by ``<ranking>WatchTop(group, first)`` (schema.live.rankings), an entity's keys by
``<entity>Watch(keys)`` (schema.live.entities). The fields follow ``Context.live``
(``schema.types.LiveQueries``); every failure — a store the caller may not read, too many keys, a key this
node cannot follow — ends the subscription with one coded error.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import strawberry

from iqgraph.schema.dynamic import Arg, Field, data_field, list_of, object_type, optional, resolver_with
from iqgraph.schema.entities.batches import Reads
from iqgraph.schema.errors import api_error, invalid_argument, store_errors
from iqgraph.schema.live.entities import entity_watch_field
from iqgraph.schema.live.fields import live_queries, stream_of, subscription_field
from iqgraph.schema.live.rankings import watch_top_field
from iqgraph.schema.naming import TypeNames, pascal_case
from iqgraph.schema.ranking_fields import RankingEntry
from iqgraph.schema.resolving import StorePlan, context
from iqgraph.schema.scalars import DateTime, Long, from_epoch_ms
from iqgraph.schema.types import LiveChange
from iqgraph.schema.window_fields import time_bounds
from iqgraph.stores import StoreError

if TYPE_CHECKING:
    from iqgraph.schema.entities.fields import EntityPlan

_KEYS = "The keys to follow."
_AFTER = (
    "Resume: the last position received of each partition. Exactly the values changed after it are sent (none at or "
    "before it); a partition not given is read whole."
)
_FROM = "The earliest window start (inclusive); none: every window."
_POSITION = "Where a resume picks up in this change's partition: give the last one of each partition as after."
_LAG = (
    "How many records its partition's copy that sent it was behind (a standby serving while the active is down, "
    "within maxLag); null: the active copy."
)
_MAX_LAG = Arg(
    "max_lag",
    "maxLag",
    int | None,
    "How many records a standby may be behind to serve a partition while its active node is down (absent: the "
    "node's --max-lag; none set: only active copies).",
)
_DROPPED = "How many earlier values of this key were replaced by this one before they were sent (conflation)."
_SNAPSHOT = (
    "Read from the store (the subscription's start, a resume, or catching up after falling behind) rather than "
    "pushed: it holds every change before it."
)


class PositionTypes:
    """The Position output and input types of one schema (named after every store's types)."""

    def __init__(self, names: TypeNames) -> None:
        self.output = object_type(
            names.new("Position"),
            [
                data_field("partition", int, "The topic's partition."),
                data_field(
                    "offset",
                    Long,
                    "The offset of the record that produced this value (-1: a key that never had one). A partition's "
                    "changes come in offset order: every change up to it was sent.",
                ),
            ],
            "Where a subscriber stands in one partition of a store's topic.",
        )
        self.input = strawberry.input(
            type("PositionInput", (), {"__annotations__": {"partition": int, "offset": Long}}),
            name=names.new("PositionInput"),
            description="A position received earlier, to resume after.",
        )

    def of(self, change: LiveChange) -> Any:
        """Return the Position object of a change."""
        return self.output(f0=change.partition, f1=change.position)


def subscription_type(
    plans: Mapping[str, StorePlan],
    names: TypeNames,
    rankings: Mapping[str, RankingEntry] | None = None,
    entities: Sequence[tuple[EntityPlan, type, Reads]] = (),
) -> type | None:
    """Return the Subscription type of the stores and entities (None if nothing can be followed).

    rankings: each ranking store's entry type (its ``top``'s); entities: each entity's plan, type and reads.
    """
    positions = PositionTypes(names)
    makers: dict[str, Callable[[StorePlan, PositionTypes, TypeNames], Field]] = {
        "key_value": _watch_field,
        "window": _watch_windows_field,
        "bloom": _watch_contains_field,
    }
    fields = [makers[p.info.kind](p, positions, names) for p in plans.values() if p.info.kind in makers]
    fields += [watch_top_field(plans[name], entry, names) for name, entry in (rankings or {}).items()]
    fields += [f for f in (entity_watch_field(*made) for made in entities) if f is not None]
    if not fields:
        return None
    return object_type("Subscription", fields, "Stores' keys followed live: each value, then every change.")


def _change_type(name: str, plan: StorePlan, positions: PositionTypes, fields: Sequence[Field], about: str) -> type:
    """Return the type of a change: key, fields (value and where it is), position, dropped, snapshot."""
    followed = [
        data_field("position", positions.output, _POSITION),
        data_field("dropped", int, _DROPPED),
        data_field("snapshot", bool, _SNAPSHOT),
        data_field("lag", int | None, _LAG),
    ]
    return object_type(name, [data_field("key", plan.key.annotation, "The key."), *fields, *followed], about)


def _watch_field(plan: StorePlan, positions: PositionTypes, names: TypeNames) -> Field:
    value_annotation, convert = plan.value.nullable()
    change = _change_type(
        names.new(f"{pascal_case(plan.name)}Change"),
        plan,
        positions,
        [data_field("value", value_annotation, "Its value now; null if the store has none.")],
        f"A key of {plan.label()} and its new value.",
    )

    async def watch(
        root: Any, info: strawberry.Info, keys: list[Any], after: Any = None, max_lag: int | None = None
    ) -> AsyncGenerator[Any, None]:
        async with aclosing(follow(info, plan.name, keys, after, max_lag=max_lag)) as changes:
            async for found in changes:
                value, position = converted(found.value, convert), positions.of(found)
                yield change(f0=found.key, f1=value, f2=position, f3=found.dropped, f4=found.snapshot, f5=found.lag)

    args = [Arg("keys", "keys", list_of(plan.key.annotation), _KEYS), _after_arg(positions), _MAX_LAG]
    return subscription_field(
        f"{plan.field}Watch",
        resolver_with(watch, args, stream_of(optional(change))),
        f"Each key's value now, then every new value of it (at most {plan.limits.max_keys} keys).",
    )


def _watch_windows_field(plan: StorePlan, positions: PositionTypes, names: TypeNames) -> Field:
    value_annotation, convert = plan.value.nullable()
    window = [
        data_field("start", DateTime, "The window's start (inclusive)."),
        data_field("end", DateTime, "The window's end (exclusive)."),
        data_field("value", value_annotation, "The key's value in the window now."),
    ]
    change = _change_type(
        names.new(f"{pascal_case(plan.name)}WindowChange"),
        plan,
        positions,
        window,
        f"One key's new value in one window of {plan.label()}.",
    )

    async def watch_windows(
        root: Any,
        info: strawberry.Info,
        keys: list[Any],
        from_: dt.datetime | None = None,
        after: Any = None,
        max_lag: int | None = None,
    ) -> AsyncGenerator[Any, None]:
        window_from = None if from_ is None else time_bounds(from_, None)[0]
        async with aclosing(follow(info, plan.name, keys, after, window_from, max_lag)) as changes:
            async for found in changes:
                start, end = from_epoch_ms(found.window_start or 0), from_epoch_ms(found.window_end or 0)
                value, position, lag = converted(found.value, convert), positions.of(found), found.lag
                yield change(
                    f0=found.key, f1=start, f2=end, f3=value, f4=position, f5=found.dropped, f6=found.snapshot, f7=lag
                )

    args = [
        Arg("keys", "keys", list_of(plan.key.annotation), _KEYS),
        Arg("from_", "from", DateTime | None, _FROM),
        _after_arg(positions),
        _MAX_LAG,
    ]
    return subscription_field(
        f"{plan.field}WatchWindows",
        resolver_with(watch_windows, args, stream_of(optional(change))),
        f"The keys' windows starting at or after from, then every new value of one (at most {plan.limits.max_keys}"
        " keys).",
    )


def _watch_contains_field(plan: StorePlan, positions: PositionTypes, names: TypeNames) -> Field:
    contained = object_type(
        names.new(f"{pascal_case(plan.name)}Contained"),
        [
            data_field("key", plan.key.annotation, "The key, now (probably) added."),
            data_field("position", positions.output, _POSITION),
            data_field("snapshot", bool, "Contained already when the subscription started."),
            data_field("lag", int | None, _LAG),
        ],
        f"A key of {plan.label()} that mightContain is now true for.",
    )

    async def watch_contains(
        root: Any, info: strawberry.Info, keys: list[Any], max_lag: int | None = None
    ) -> AsyncGenerator[Any, None]:
        async with aclosing(follow(info, plan.name, keys, max_lag=max_lag)) as changes:
            async for found in changes:
                yield contained(f0=found.key, f1=positions.of(found), f2=found.snapshot, f3=found.lag)

    args = [Arg("keys", "keys", list_of(plan.key.annotation), _KEYS), _MAX_LAG]
    return subscription_field(
        f"{plan.field}WatchContains",
        resolver_with(watch_contains, args, stream_of(optional(contained))),
        f"Each key once, when it is (probably) contained: those already, then each a batch adds (at most "
        f"{plan.limits.max_keys} keys).",
    )


def _after_arg(positions: PositionTypes) -> Arg:
    return Arg("after", "after", optional(list_of(positions.input)), _AFTER)


async def follow(
    info: strawberry.Info,
    store: str,
    keys: Sequence[Any],
    after: Sequence[Any] | None = None,
    window_from: int | None = None,
    max_lag: int | None = None,
) -> AsyncGenerator[LiveChange, None]:
    """Yield the changes of keys of store the request's LiveQueries follows, within the request's limits."""
    ctx = context(info)
    ctx.limits.check_keys(keys)
    if max_lag is not None and max_lag < 0:
        raise invalid_argument("maxLag", "it is a number of records: 0 or more")
    watched = live_queries(ctx).watch(
        store,
        list(dict.fromkeys(keys)),
        after=checked_after(after),
        window_from=window_from,
        principal=ctx.principal,
        max_lag=max_lag,
    )
    with store_errors():
        async with aclosing(watched) as changes:
            async for change in changes:
                yield change


def checked_after(after: Sequence[Any] | None) -> dict[int, int] | None:
    """Return the positions of an after argument by partition; INVALID_ARGUMENT for a negative or repeated one (an
    offset may be -1: the position of a key that never had a value)."""
    if after is None:
        return None
    found: dict[int, int] = {}
    for position in after:
        partition, offset = int(position.partition), int(position.offset)
        if partition < 0 or offset < -1:
            wanted = "a partition >= 0, an offset >= -1"
            raise invalid_argument("after", f"partition {partition}, offset {offset}: {wanted}")
        if partition in found:
            raise invalid_argument("after", f"partition {partition} is given twice")
        found[partition] = offset
    return found


def converted(value: Any, convert: Callable[[Any], Any]) -> Any:
    """Return value as the schema shows it; an error (a failed value) stays an error, for its field alone."""
    if isinstance(value, Exception):
        return value
    try:
        return convert(value)
    except StoreError as exc:
        return api_error(exc)
