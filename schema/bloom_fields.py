"""The object type of a bloom store: mightContain, mightContainMany, falsePositiveRate, approximateCount.

``mightContain`` is false only for a key never added; true means probably added: wrong at most with
the store's false-positive rate.
"""

from __future__ import annotations

from typing import Any

import strawberry

from iqgraph.schema.dynamic import Arg, list_of, object_type, resolved_field, resolver_with
from iqgraph.schema.errors import store_errors
from iqgraph.schema.resolving import StorePlan, bound, context, load_each, load_one
from iqgraph.schema.scalars import Long


def _as_bool(value: Any) -> bool:
    return bool(value)


def bloom_type(plan: StorePlan) -> type:
    """Return the object type of bloom store plan."""
    name, key = plan.name, plan.key.annotation
    rate = plan.info.false_positive_rate
    if rate is None:
        raise ValueError(f"bloom store {name!r} has no false_positive_rate in its StoreInfo")

    async def might_contain(root: Any, info: strawberry.Info, key: Any) -> bool:
        return bool(await load_one(context(info).loaders.membership(name, bound(root)), key, _as_bool))

    async def might_contain_many(root: Any, info: strawberry.Info, keys: list[Any]) -> list[Any]:
        ctx = context(info)
        ctx.limits.check_keys(keys)
        return await load_each(ctx.loaders.membership(name, bound(root)), keys, _as_bool)

    def false_positive_rate(root: Any, info: strawberry.Info) -> float:
        return rate

    async def approximate_count(root: Any, info: strawberry.Info) -> int:
        with store_errors():
            return await context(info).queries.count(name, bound(root))

    fields = [
        resolved_field(
            "mightContain",
            resolver_with(might_contain, [Arg("key", "key", key, "The key.")], bool | None),
            "False if key was never added; true if it probably was.",
        ),
        resolved_field(
            "mightContainMany",
            resolver_with(
                might_contain_many, [Arg("keys", "keys", list_of(key), "The keys.")], list[bool | None] | None
            ),
            f"mightContain of each key, in the order given (at most {plan.limits.max_keys}).",
        ),
        resolved_field(
            "falsePositiveRate",
            resolver_with(false_positive_rate, [], float),
            "The configured chance that mightContain is true for a key never added.",
        ),
        resolved_field(
            "approximateCount",
            resolver_with(approximate_count, [], Long | None),
            "About how many distinct keys were added: the filters' own estimate (an exact count would need the "
            "keys). For a store keyed by a column, the estimate of the partitions' filters' union: a key added in "
            "several partitions counts once.",
        ),
    ]
    about = f": {plan.info.description}" if plan.info.description else ""
    return object_type(plan.type_name, fields, f"Bloom filter store {name}{about}")
