"""User-defined aggregations: a mergeable aggregation written in Python, applied exactly once like count().

A user aggregation is four functions and the Spark type of its value::

    UserAggregation(
        "distinct_users",
        init=lambda: [],                                  # the empty state
        add=lambda state, row: sorted({*state, row["user"]}),  # fold one record (a dict of its columns)
        merge=lambda a, b: sorted({*a, *b}),             # combine two states
        finalize=len,                                     # the state's value, as queries return it
        value_type="long",                                # a Spark DDL string or a pyspark DataType
        columns=("user",),
    )

and a store uses it where it would use ``count()``: ``key_value_store("users", "plays", aggregate(agg))``.

The contract, which the sink relies on:

- In a Spark task, the records of one (partition, key[, window]) of a batch are folded in offset order with
  ``add``, starting from ``init()``. The row is a dict of the chosen ``columns`` (all the record's columns
  by default), as JSON carries them (a timestamp is an ISO string); a null column is None.
- ``merge`` combines two states and must be associative and commutative: the sink merges a batch's partial
  into the stored state, and a store keyed by a column merges one key's states from several partitions (and
  nodes) in whatever order they come. ``merge(init(), s)`` must equal ``s``.
- A state is stored and sent between nodes as JSON: it must be made of lists, dicts with string keys,
  strings, numbers, booleans and None, and never be None itself — or ``encode``/``decode`` turn it into such
  a value and back (e.g. a bytearray into a base64 string).
- ``finalize`` turns a state into the value queries return, of type ``value_type``.

Checked when the app loads (one DefinitionError line each): the four functions are callable, a value type is
given (a DDL string is parsed then, in Python: streaming.ddl), ``init()`` gives a state that survives a JSON
round trip (after ``encode``), and so does ``merge(init(), init())``. A record on which ``add`` raises is a
bad record (counted, logged, dead-lettered), not a stopped pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from iqgraph.stores.aggregations import AGGREGATIONS, Aggregation
from iqgraph.streaming.ddl import DDLError, parse_ddl
from iqgraph.streaming.definitions import Aggregate, DefinitionError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class UserAggregation:
    """A mergeable aggregation in Python; see the module docstring for the contract."""

    name: str
    init: Callable[[], Any]
    add: Callable[[Any, dict[str, Any]], Any]
    merge: Callable[[Any, Any], Any]
    finalize: Callable[[Any], Any]
    #: A Spark DDL string ("long", "array<struct<low:double,count:long>>"), a DataType, or a function of the
    #: rows' schema (the struct of the chosen columns) returning one.
    value_type: str | DataType | Callable[[StructType], DataType] | None
    columns: tuple[str, ...] = ()
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None
    #: Give ``add`` each record's Kafka position too, as ``row["_partition"]`` and ``row["_offset"]``.
    with_position: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        where = f"user aggregation {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise DefinitionError(f"{where}: name it with a letter then letters, digits or '_'")
        if self.name in AGGREGATIONS:
            raise DefinitionError(f"{where}: {self.name!r} is a built-in aggregation; choose another name")
        for role in ("init", "add", "merge", "finalize"):
            if not callable(getattr(self, role)):
                raise DefinitionError(f"{where}: {role} must be callable, got {getattr(self, role)!r}")
        if (self.encode is None) != (self.decode is None) or not all(
            f is None or callable(f) for f in (self.encode, self.decode)
        ):
            raise DefinitionError(f"{where}: give both encode and decode (callables) or neither")
        if not self.value_type or not (isinstance(self.value_type, str) or _is_type(self.value_type)):
            raise DefinitionError(
                f"{where}: value_type must be a Spark DDL string or a DataType, not {self.value_type!r}"
            )
        if isinstance(self.value_type, str):
            self.spark_type(None)  # parsed in Python: a bad type string fails at load, without Spark
        self._check_states(where)

    def _check_states(self, where: str) -> None:
        empty = self._stored(where, "init()", lambda: self._encoded(self.init()))
        self._stored(where, "merge(init(), init())", lambda: self._merge_stored(empty, empty))

    def _stored(self, where: str, what: str, make: Callable[[], Any]) -> Any:
        """Return the stored state make() gives; raise DefinitionError unless it survives a JSON round trip."""
        try:
            stored = make()
        except Exception as exc:  # noqa: BLE001 - the user's code: any failure is a definition error
            raise DefinitionError(f"{where}: {what} raised {type(exc).__name__}: {exc}") from None
        if stored is None:
            raise DefinitionError(f"{where}: {what} is None; a state must not be None (None means 'no state')")
        advice = "use lists, str-keyed dicts, strings and numbers, or " + (
            "give encode/decode" if self.encode is None else "fix encode"
        )
        try:
            back = orjson.loads(orjson.dumps(stored))
        except orjson.JSONEncodeError as exc:
            raise DefinitionError(f"{where}: the state of {what} is not JSON-serialisable ({exc}); {advice}") from None
        if back != stored:
            raise DefinitionError(
                f"{where}: the state of {what} does not survive a JSON round trip ({stored!r} came back as "
                f"{back!r}); {advice}"
            )
        return stored

    def _decoded(self, stored: Any) -> Any:
        return self.decode(stored) if self.decode is not None else stored

    def _encoded(self, state: Any) -> Any:
        return self.encode(state) if self.encode is not None else state

    def _merge_stored(self, a: Any, b: Any) -> Any:
        """Return the stored form of merging two stored states."""
        return self._encoded(self.merge(self._decoded(a), self._decoded(b)))

    def _value(self, stored: Any) -> Any:
        return self.finalize(self._decoded(stored))

    def aggregation(self) -> Aggregation:
        """Return how the stores merge and finalize this aggregation's (stored, JSON) states."""
        return Aggregation(self.name, self._merge_stored, self._value)

    def fold(self, rows: Iterable[dict[str, Any]], failed: Callable[[int, Exception], None] | None = None) -> Any:
        """Return the stored state of rows folded in order with add, from init() (a Spark task's partial).

        failed: called with the index of a row on which add raised (the row is skipped); None: raise.
        """
        state = self.init()
        for index, row in enumerate(rows):
            try:
                state = self.add(state, row)
            except Exception as exc:  # noqa: BLE001 - the user's code; the caller makes it a bad record
                if failed is None:
                    raise
                failed(index, exc)
        return self._encoded(state)

    def spark_type(self, row: StructType | None) -> DataType:
        """Return the Spark type of the values (row: the struct of the chosen columns, for a type function)."""
        from pyspark.sql.types import DataType

        declared = self.value_type
        if isinstance(declared, DataType):
            return declared
        if isinstance(declared, str):
            try:
                return parse_ddl(declared)
            except DDLError as exc:
                raise DefinitionError(f"user aggregation {self.name!r}: bad value_type: {exc}") from None
        assert declared is not None and row is not None  # noqa: S101 - checked at construction; a type function
        return declared(row)


def _is_type(value: Any) -> bool:
    if callable(value):
        return True
    from pyspark.sql.types import DataType  # a pure-Python module: no JVM

    return isinstance(value, DataType)


def aggregate(user_aggregation: UserAggregation, *columns: str) -> Aggregate:
    """Aggregate with a user aggregation; its rows hold the columns named (default: its own, else all)."""
    if not isinstance(user_aggregation, UserAggregation):
        raise DefinitionError(f"aggregate(...) takes a UserAggregation, got {user_aggregation!r}")
    return Aggregate(user_aggregation.name, columns=columns or user_aggregation.columns, user=user_aggregation)
