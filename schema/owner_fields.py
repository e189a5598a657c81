"""Owner-side fields in the schema: typed root fields whose values a user function computes on the key's owner.

``OwnerFieldInfo("favourite_genre", "string", StructType([genre: string, plays: bigint]), store="plays")``
makes::

    favouriteGenre(key: String!, maxLag: Long): FavouriteGenre          # null only with an error
    favouriteGenreMany(keys: [String!]!, maxLag: Long): [FavouriteGenre]  # in key order, null per failed key
    type FavouriteGenre { genre: String  plays: Long }                  # the declared type (schema.value_types)

The owner sends a value as JSON that the declared type's converter (``schema.value_types``) reads, checked
by that converter on the owner before it is sent (``app.owner.runner``): bytes travel as base64 text, so
the converter of an owner-side field reads a ``binary`` as the base64 string it already is
(``wire_type``) — the GraphQL type (String, base64) is a store's binary's.

Both load through the request's loader of the field (``Loaders.calls``): every key of one request (several
fields, aliases, entities) goes out as ONE ``StoreQueries.call_many``, which routes the keys to their owners
and sends each peer one ``_call`` sub-request. A key's error is in place of its value only: INTERNAL (the
function raised; the owner logged it), TIMEOUT (it ran too long), INVALID_KEY, or the routing core's codes.

``_call(field, keys)`` is the internal field a peer answers such a sub-request with, from its own partitions
only (a forwarded request; ``schema.internal``), in the JSON of ``schema.wire``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import strawberry
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructField, StructType
from strawberry.scalars import JSON

from iqgraph.schema import wire
from iqgraph.schema.access import check_read
from iqgraph.schema.dynamic import Arg, Field, list_of, optional, resolved_field, resolver_with
from iqgraph.schema.errors import SchemaDefinitionError, store_errors
from iqgraph.schema.internal import bad_request, local_partitions
from iqgraph.schema.keys import key_kind
from iqgraph.schema.limits import Limits
from iqgraph.schema.naming import TypeNames, camel_case, pascal_case
from iqgraph.schema.resolving import MAX_LAG, checked_bound, context, load_each, load_one
from iqgraph.schema.scalars import Long
from iqgraph.schema.types import OwnerFieldInfo
from iqgraph.schema.value_types import ValueTypes

CALL_FIELD = "_call"
_BASE64 = "Bytes, base64-encoded."


def wire_type(data_type: DataType) -> DataType:
    """Return data_type as an owner-side field's value travels: each binary a string of base64 text.

    A store keeps bytes as their UTF-8 text, which the schema's binary converter base64-encodes; a function's
    bytes need not be UTF-8, so the owner base64-encodes them (``app.owner.runner.as_json``) and the
    converters read that text as a string: no bytes are decoded, none encoded twice.
    """
    if isinstance(data_type, BinaryType):
        return StringType()
    if isinstance(data_type, ArrayType):
        return ArrayType(wire_type(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, MapType):
        return MapType(wire_type(data_type.keyType), wire_type(data_type.valueType), data_type.valueContainsNull)
    if isinstance(data_type, StructType):
        return StructType([_wire_field(f) for f in data_type.fields])
    return data_type


def value_converter(name: str, data_type: DataType) -> Callable[[Any], Any]:
    """Return the converter the schema reads an owner-side field's wire values with (None stays None).

    The owner checks a function's value with it before sending it (``app.owner.runner``): a value the
    schema could not read is the owner's INTERNAL error for that key, never the caller's format error.
    """
    return ValueTypes(TypeNames(set())).of(wire_type(data_type), pascal_case(name)).nullable()[1]


def _wire_field(column: StructField) -> StructField:
    metadata = dict(column.metadata or {})
    if isinstance(column.dataType, BinaryType):  # described as a store's binary column is
        comment = metadata.get("comment")
        metadata["comment"] = f"{comment} (bytes, base64)" if isinstance(comment, str) and comment else _BASE64
    return StructField(column.name, wire_type(column.dataType), column.nullable, metadata)


def _root_names(info: OwnerFieldInfo, taken: dict[str, str]) -> tuple[str, str]:
    """Return the field's root fields (one key, many keys); SchemaDefinitionError if another has one."""
    single = camel_case(info.name)
    names = (single, f"{single}Many")
    for name in names:
        owner = taken.get(name)
        if owner is not None:
            raise SchemaDefinitionError(
                f"owner-side field {info.name!r} would add the root field {name!r}, which {owner} has: rename it"
            )
    for name in names:
        taken[name] = f"owner-side field {info.name!r}"
    return names


def owner_root_fields(
    fields: Sequence[OwnerFieldInfo], limits: Limits, names: TypeNames, root_fields: Mapping[str, str]
) -> list[Field]:
    """Return the root fields of every owner-side field (root_fields: those taken, each with what has it)."""
    taken = dict(root_fields)
    values = ValueTypes(names)
    made: list[Field] = []
    for info in fields:
        single, many = _root_names(info, taken)
        about = info.description or f"Computed on the node owning the key of store {info.store}."
        value = values.of(
            wire_type(info.value_type), pascal_case(info.name), f"A value of owner-side field {info.name}."
        )
        made += _fields(info, single, many, about, value.nullable(), limits)
    return made


def _fields(
    info: OwnerFieldInfo, single: str, many: str, about: str, value: tuple[Any, Any], limits: Limits
) -> list[Field]:
    annotation, convert = value
    kind, name = key_kind(info.key_type), info.name
    max_lag = Arg("max_lag", "maxLag", Long | None, MAX_LAG)

    async def one(root: Any, info: strawberry.Info, key: Any, max_lag: Long | None = None) -> Any:
        loader = context(info).loaders.calls(name, checked_bound(max_lag))
        return await load_one(loader, key, convert)

    async def each(root: Any, info: strawberry.Info, keys: list[Any], max_lag: Long | None = None) -> list[Any]:
        ctx = context(info)
        ctx.limits.check_keys(keys)
        return await load_each(ctx.loaders.calls(name, checked_bound(max_lag)), keys, convert)

    return [
        resolved_field(
            single, resolver_with(one, [Arg("key", "key", kind.annotation, "The key."), max_lag], annotation), about
        ),
        resolved_field(
            many,
            resolver_with(
                each,
                [Arg("keys", "keys", list_of(kind.annotation), "The keys."), max_lag],
                optional(list_of(annotation)),
            ),
            f"{about} Per key, in the order given (at most {limits.max_keys}); null for a key that failed.",
        ),
    ]


def call_field(owner_fields: Sequence[OwnerFieldInfo], limits: Limits) -> Field:
    """Return the internal root field _call: an owner-side field run on this node's partitions (peers only).

    The caller the peer carried must be allowed to read the field's store; at most max_keys keys.
    """
    stores = {f.name: f.store for f in owner_fields}

    async def call(root: Any, info: strawberry.Info, field: str, keys: JSON) -> JSON:
        if field not in stores:
            raise bad_request("field", f"no owner-side field {field!r}")
        check_read(context(info).principal, stores[field])
        if isinstance(keys, list):
            limits.check_keys(keys)
        try:
            calls = wire.decode_calls(keys)
        except (ValueError, TypeError) as exc:
            raise bad_request("keys", str(exc)) from None
        with store_errors():
            answer = await local_partitions(info).call(field, calls, context(info).principal)
        return wire.encode_call_answer(answer)  # type: ignore[return-value]

    return resolved_field(
        CALL_FIELD,
        resolver_with(
            call,
            [
                Arg("field", "field", str, "The owner-side field's name."),
                Arg("keys", "keys", JSON, "[[key, [partitions]], …]"),
            ],
            JSON,
        ),
        "Internal (peers): an owner-side field's value per key, run on the given partitions of this node.",
    )
