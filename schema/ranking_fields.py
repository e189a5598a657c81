"""The object type of a ranking store: ``top(group, first, after)`` and ``count``.

``top`` lists a group's members (or, without a group, every member) from the greatest value down, as
``<Base>Entry {member, value, rank, cursor}`` plus the relations of the members (an entity whose key is
the member). Ties are ordered by member. Pages resume after an entry's cursor, ranks continuing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import strawberry

from iqgraph.schema.dynamic import Arg, data_field, list_of, object_type, optional, resolved_field, resolver_with
from iqgraph.schema.errors import store_errors
from iqgraph.schema.resolving import StorePlan, bound, context
from iqgraph.schema.scalars import Long
from iqgraph.schema.types import Ranked


@dataclass(frozen=True)
class RankingEntry:
    """The ``<Base>Entry`` type of a ranking store, and how a Ranked member becomes one."""

    type: type
    convert: Callable[[Ranked], Any]


def ranking_entry(plan: StorePlan) -> RankingEntry:
    """Return the entry type of ranking store plan (top and the watchTop subscription share it)."""
    value_annotation, convert = plan.value.nullable()
    entry = object_type(
        plan.node_name,
        [
            data_field("member", plan.key.annotation, "The member (a key of the store ranked)."),
            data_field("value", value_annotation, "Its value in the store ranked."),
            data_field("rank", int, "Its place: 1 for the greatest value (ties: by member)."),
            data_field("cursor", str, "Pass as after to continue after this member."),
            *plan.entry_fields,
        ],
        f"A member of {plan.label()}: its value and rank.",
    )

    def node(r: Ranked) -> Any:
        return entry(f0=r.member, f1=convert(r.value), f2=r.rank, f3=r.cursor)

    return RankingEntry(entry, node)


def ranking_type(plan: StorePlan, made: RankingEntry | None = None) -> type:
    """Return the object type of ranking store plan (with made, its entry type, if made already)."""
    made = made or ranking_entry(plan)
    entry, node = made.type, made.convert
    name = plan.name

    async def top(
        root: Any, info: strawberry.Info, group: str | None = None, first: int | None = None, after: str | None = None
    ) -> Any:
        ctx = context(info)
        size = ctx.limits.page_size(first)
        with store_errors():
            ranked = await ctx.queries.top(name, group, size, after, bound(root))
        return [node(r) for r in ranked]

    async def count(root: Any, info: strawberry.Info) -> int:
        with store_errors():
            return await context(info).queries.count(name, bound(root))

    arguments = [
        Arg("group", "group", str | None, "The group (absent: every member, whatever its group)."),
        Arg("first", "first", int | None, f"How many members at most (default {plan.limits.default_page_size})."),
        Arg("after", "after", str | None, "Resume after this entry's cursor."),
    ]
    fields = [
        resolved_field(
            "top",
            resolver_with(top, arguments, optional(list_of(entry))),
            "The members from the greatest value down (null with its error when the ranking cannot be read).",
        ),
        resolved_field("count", resolver_with(count, [], Long | None), "How many members the ranking holds."),
    ]
    return object_type(plan.type_name, fields, _describe(plan))


def _describe(plan: StorePlan) -> str:
    extra = plan.info.extra
    grouped = f" per {extra['group']}" if extra.get("group") else ""
    about = f": {plan.info.description}" if plan.info.description else ""
    return f"Ranking {plan.name}: the keys of {extra.get('ranks')} by value{grouped}{about}"
