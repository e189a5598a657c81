"""Owner-side fields: a user function run on the node that owns a key, answered as a typed GraphQL field.

::

    @owner_field("plays_per_user", returns="struct<genre: string, plays: bigint>")
    def favourite_genre(user, views):
        ...  # views.kv("plays_per_user").get(user), views.window(...).fetch(...), views.bloom(...)
        return {"genre": "jazz", "plays": 12}

    app = App(..., fields=[favourite_genre])

makes the root fields ``favouriteGenre(key, maxLag)`` and ``favouriteGenreMany(keys, maxLag)``. ``store``
names the store whose keys the field takes: a key is routed as a lookup of that store would be, and the
function runs on the node serving the key's partition, with read-only views of the stores there
(``iqgraph.StoreViews``, a Protocol in ``streaming.types``; the node implements it in ``app.owner.views``).
``returns`` is a Spark DDL type string (``"double"``, ``"struct<…>"``: see ``streaming.ddl``) or a pyspark
DataType; without it, the function's Python return annotation (``str``,
``int`` → bigint, ``float`` → double, ``bool``, ``bytes``, ``datetime``, ``date``, ``Decimal``,
``list[T]``, ``dict[str, T]``, ``T | None``). ``timeout_s`` bounds one key's run, and its wait for a free
worker (TIMEOUT after it); at most ``OWNER_FIELD_MAX_TIMEOUT_S`` (4 s), so that a peer answers
TIMEOUT well within the peer client's timeout (5 s) rather than look down.

"Read-only" is a promise of the API, not a sandbox: the views have read methods only and keep no
partition's stores or database handle where a plain (or single-underscore) attribute reaches it, so a
function written against the API cannot write; but it runs in the node's process, and Python code that
digs into dunder internals (a bound method's ``__self__``, a closure's cells) can reach the live stores and
write outside the sink's batches. Owner-side fields are the app's own trusted code.

Everything checkable is checked when the app loads, each failure one DefinitionError line: a type that is
missing or does not parse, a function that cannot take ``(key, views)`` or is a coroutine, a store to
route by that the app lacks, is keyed by a column (its keys are in every partition: no single owner) or
is a global table (every node holds it: nothing to route), and a name another field, a store or an
entity has (compared as GraphQL will: case and underscores aside).
"""

from __future__ import annotations

import datetime as dt
import decimal
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from iqgraph.streaming.definitions import DefinitionError
from iqgraph.streaming.types import StoreViews

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

    from iqgraph.streaming.definitions import App

#: The function: (key, read-only views of the owner's stores) -> a value of the declared type.
OwnerFunction = Callable[[Any, StoreViews], Any]
DEFAULT_TIMEOUT_S = 2.0
#: The longest timeout_s an owner-side field may have. A peer's answer must reach its caller within the peers'
#: timeout (``schema.wire.PEER_TIMEOUT_S``: this + PEER_ROUND_TRIP_S), else the caller sees the peer as down.
OWNER_FIELD_MAX_TIMEOUT_S = 4.0
PEER_ROUND_TRIP_S = 1.0
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_PYTHON_TYPES = {
    str: "string",
    int: "bigint",
    float: "double",
    bool: "boolean",
    bytes: "binary",
    dt.datetime: "timestamp",
    dt.date: "date",
    decimal.Decimal: "decimal(38,18)",
}


@dataclass(frozen=True)
class OwnerField:
    """A field computed by ``function(key, views)`` on the node owning the key of ``store`` (see the module)."""

    name: str
    function: OwnerFunction
    returns: str | DataType | None
    store: str
    description: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    value_type: DataType = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise DefinitionError(f"owner-side field name {self.name!r}: use a letter then letters, digits or '_'")
        _check_function(self.name, self.function)
        object.__setattr__(self, "value_type", _value_type(self.name, self.returns, self.function))
        if not 0 < self.timeout_s <= OWNER_FIELD_MAX_TIMEOUT_S:
            raise DefinitionError(
                f"owner-side field {self.name!r}: timeout_s must be > 0 and <= {OWNER_FIELD_MAX_TIMEOUT_S:g} seconds "
                f"(a peer's answer must beat the peer timeout of {OWNER_FIELD_MAX_TIMEOUT_S + PEER_ROUND_TRIP_S:g} s), "
                f"not {self.timeout_s}"
            )

    def __call__(self, key: Any, views: StoreViews) -> Any:
        """Run the function (a decorated function stays callable, e.g. in a test)."""
        return self.function(key, views)


def owner_field(
    store: str,
    returns: str | DataType | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Callable[[OwnerFunction], OwnerField]:
    """Return a decorator making a function ``(key, views) -> value`` an OwnerField (named after it by default)."""

    def decorate(function: OwnerFunction) -> OwnerField:
        about = description or inspect.getdoc(function)
        return OwnerField(name or function.__name__, function, returns, store, about, timeout_s)

    return decorate


def _check_function(name: str, function: Any) -> None:
    if not callable(function):
        raise DefinitionError(f"owner-side field {name!r}: function must be callable (key, views), not {function!r}")
    if inspect.iscoroutinefunction(function):
        raise DefinitionError(
            f"owner-side field {name!r}: {function.__name__} is async; write a plain function (it runs in a thread)"
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin without a signature: its call tells
    try:
        signature.bind(None, None)
    except TypeError:
        label = getattr(function, "__name__", repr(function))
        raise DefinitionError(
            f"owner-side field {name!r}: {label}{signature} must take two arguments: (key, views)"
        ) from None


def _value_type(name: str, returns: Any, function: Any) -> DataType:
    """Return the Spark type of the field's values: declared, else from the function's return annotation."""
    from pyspark.sql.types import DataType

    from iqgraph.streaming.ddl import DDLError, parse_ddl

    if isinstance(returns, DataType):
        return returns
    if returns is None or (isinstance(returns, str) and not returns.strip()):
        try:
            annotation = typing.get_type_hints(function).get("return")
        except Exception:  # noqa: BLE001 - any failure to resolve means no usable annotation
            annotation = None
        ddl = None if annotation is None else _ddl_of(annotation)
        if ddl is None:
            raise DefinitionError(
                f"owner-side field {name!r} has no return type: give returns= a Spark DDL type ('string', "
                "'double', 'struct<genre: string, plays: bigint>') or a pyspark DataType, or annotate the function"
            )
        return parse_ddl(ddl)
    if not isinstance(returns, str):
        raise DefinitionError(f"owner-side field {name!r}: returns= takes a DDL string or a DataType, not {returns!r}")
    try:
        return parse_ddl(returns)
    except DDLError as exc:
        raise DefinitionError(f"owner-side field {name!r}: {exc}") from None


def _ddl_of(annotation: Any) -> str | None:
    """Return the DDL type of a Python return annotation (None: not one this maps)."""
    if annotation in _PYTHON_TYPES:
        return _PYTHON_TYPES[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return _ddl_of(kept[0]) if len(kept) == 1 else None
    if origin is list and len(args) == 1:
        inner = _ddl_of(args[0])
        return None if inner is None else f"array<{inner}>"
    if origin is dict and len(args) == 2 and args[0] is str:
        inner = _ddl_of(args[1])
        return None if inner is None else f"map<string, {inner}>"
    return None


def _folded(name: str) -> str:
    """Return name as GraphQL field names compare (``order_count`` and ``orderCount`` meet)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def check_owner_fields(app: App) -> None:
    """Raise DefinitionError (one line) for an owner-side field of app that cannot be served."""
    taken = {_folded(s.name): f"store {s.name!r}" for s in app.stores}
    for entity in app.entities:
        for root in (entity.name, entity.plural_field, f"{entity.plural_field}Page"):
            taken[_folded(root)] = f"entity {entity.name!r}"
    for owner in app.fields:
        if not isinstance(owner, OwnerField):
            raise DefinitionError(f"app {app.name!r}: fields= takes owner_field(...) definitions, not {owner!r}")
        for root in (owner.name, f"{owner.name}Many"):
            clash = taken.get(_folded(root))
            if clash is not None:
                raise DefinitionError(
                    f"owner-side field {owner.name!r} would be the root field {root!r}, which {clash} has: rename it"
                )
        taken[_folded(owner.name)] = taken[_folded(f"{owner.name}Many")] = f"owner-side field {owner.name!r}"
        _check_store(app, owner)


def _check_store(app: App, owner: OwnerField) -> None:
    try:
        store = app.store(owner.store)
    except KeyError:
        known = ", ".join(s.name for s in app.stores)
        raise DefinitionError(
            f"owner-side field {owner.name!r} routes by store {owner.store!r}, which the app lacks (stores: {known})"
        ) from None
    if not store.co_partitioned:
        raise DefinitionError(
            f"owner-side field {owner.name!r} routes by store {store.name!r}, keyed by column {store.key!r}: its keys "
            "are in every partition, with no one owner; route by a store keyed by the record key"
        )
    if store.ranks is not None:
        raise DefinitionError(
            f"owner-side field {owner.name!r} routes by ranking {store.name!r}, keyed by group: route by the "
            "key-value, window or bloom store whose keys the function takes"
        )
    if app.topic(store.topic).global_table:
        raise DefinitionError(
            f"owner-side field {owner.name!r} routes by store {store.name!r}, a global table that every node holds: "
            "route by a store of a stream (its views still read the global table)"
        )
