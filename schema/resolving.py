"""What the generated resolvers share: the request context, per-key loads, and the store plan."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from iqgraph.schema.errors import api_error, invalid_argument, store_errors
from iqgraph.schema.keys import KeyKind
from iqgraph.schema.limits import Limits
from iqgraph.schema.value_types import ValueType
from iqgraph.stores import StoreError

if TYPE_CHECKING:
    import strawberry

    from iqgraph.schema.context import Context
    from iqgraph.schema.dynamic import Field
    from iqgraph.schema.loaders import Loader
    from iqgraph.schema.types import StoreInfo, StoreQueries

MAX_LAG = (
    "Bounded staleness: a standby copy may answer (when the active node cannot) only if it is at most this many "
    "records behind; none: the request's extensions.maxLag, else the node's --max-lag. 0: only up-to-date copies."
)


@dataclass(frozen=True)
class StorePlan:
    """One store as the schema shows it: its field, its type names, key and value types, limits."""

    info: StoreInfo
    field: str  # the root field, camelCase
    type_name: str  # <Base>Store
    node_name: str  # <Base>Entry (key-value) or <Base>Window (window); unused for bloom
    edge_name: str
    connection_name: str
    key: KeyKind
    value: ValueType
    limits: Limits
    entry_fields: tuple[Field, ...] = ()  # relations from the keys: fields of <Base>Entry / <Base>Window

    @property
    def name(self) -> str:
        """Return the store's name."""
        return self.info.name

    def label(self) -> str:
        """Return how descriptions name the store."""
        return f"store {self.info.name}"


@dataclass(frozen=True)
class StoreScope:
    """What a store's root field hands its fields: the staleness bound its ``maxLag`` gave (None: default)."""

    max_lag: int | None = None


def checked_bound(max_lag: int | None) -> int | None:
    """Return a field's maxLag argument as a staleness bound; INVALID_ARGUMENT if it is negative."""
    if max_lag is not None and max_lag < 0:
        raise invalid_argument("maxLag", f"must be a number of records >= 0, got {max_lag}")
    return None if max_lag is None else int(max_lag)


def bound(root: Any) -> int | None:
    """Return the staleness bound of the store field a field is read under."""
    return root.max_lag if isinstance(root, StoreScope) else None


def context(info: strawberry.Info) -> Context:
    """Return the request context."""
    return cast("Context", info.context)


def queries(info: strawberry.Info) -> StoreQueries:
    """Return the request's StoreQueries."""
    return context(info).queries


async def load_one(loader: Loader, key: Any, convert: Callable[[Any], Any]) -> Any:
    """Return the converted value the loader finds for key; raise its API error if it failed."""
    (found,) = await loader.load((key,))
    if isinstance(found, Exception):
        raise found
    with store_errors():
        return convert(found)


async def load_each(loader: Loader, keys: Sequence[Any], convert: Callable[[Any], Any]) -> list[Any]:
    """Return, per key and in key order, the converted value or the API error in its place (one future)."""
    if not keys:
        return []
    try:
        found = await loader.load(tuple(keys))
    except Exception as exc:  # noqa: BLE001 - the whole batch failed: every key reports it, as a lone key would
        return [exc for _ in keys]
    if not any(isinstance(result, BaseException) for result in found):
        try:
            return [convert(result) for result in found]  # the common case: every key read, in one pass
        except StoreError:
            pass  # _converted puts the error in place of the value that failed
    return [_converted(result, convert) for result in found]


def _converted(result: Any, convert: Callable[[Any], Any]) -> Any:
    if isinstance(result, BaseException):
        if not isinstance(result, Exception):
            raise result  # cancellation and the like are not a key's result
        return result
    try:
        return convert(result)
    except StoreError as exc:
        return api_error(exc)
