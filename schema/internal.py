"""Internal root fields that peers call with a forwarded sub-request: states in compact JSON.

A node that routes reads to a peer sends ONE GraphQL request per peer, marked as forwarded, asking for
``_lookup`` / ``_scan`` / ``_count`` over partitions its routing chose. The peer answers from its own
partitions only (never forwards again) with mergeable states, positions and lags, encoded as
``schema.wire`` describes — no per-field resolution — so that the caller combines several nodes' answers
before finalizing them. A failed read is ``{"error": {"message": …, "extensions": {"code": …}}}`` in its
place. These fields start with ``_``: they are for peers, not for clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import strawberry
from graphql import FieldNode, OperationDefinitionNode, VariableNode, parse
from strawberry.scalars import JSON

from iqgraph.schema import wire
from iqgraph.schema.dynamic import Arg, Field, resolved_field, resolver_with
from iqgraph.schema.errors import ApiError, invalid_argument, store_errors
from iqgraph.schema.resolving import context
from iqgraph.schema.types import PeerQueries, Scan

#: The internal root fields (``_call``, an owner-side field's sub-request, is schema.owner_fields'). Nothing
#: hides them from the SDL: they show there, described as internal, like any root field.
INTERNAL_FIELDS = ("_lookup", "_scan", "_count", "_call")
#: The documents of point reads peers send (``wire.lookups(n)``), by their text.
_LOOKUP_DOCUMENTS = {wire.lookups(n): n for n in range(1, wire.MAX_LOOKUPS + 1)}


def _local(info: strawberry.Info) -> PeerQueries:
    local = context(info).local
    if local is None:
        raise ApiError("this server does not answer forwarded sub-requests", "BAD_REQUEST")
    return local


def internal_fields() -> list[Field]:
    """Return the root fields _lookup, _scan and _count."""

    def lookup(root: Any, info: strawberry.Info, store: str, reads: JSON) -> JSON | None:
        try:
            decoded = wire.decode_reads(reads)
        except (ValueError, TypeError) as exc:
            raise invalid_argument("reads", str(exc)) from None
        with store_errors():
            return wire.encode_lookup(_local(info).read_states(store, decoded))  # type: ignore[return-value]

    def scan(
        root: Any, info: strawberry.Info, store: str, scan: JSON, positions: JSON, first: int, partitions: list[int]
    ) -> JSON:
        try:
            request = Scan(str(scan["kind"]), dict(scan.get("args") or {}))  # type: ignore[index,attr-defined]
            resume = {int(p): c for p, c in dict(positions).items()}  # type: ignore[call-overload]
        except (ValueError, TypeError, KeyError) as exc:
            raise invalid_argument("scan", f"not a scan this API sends: {exc}") from None
        with store_errors():
            answer = _local(info).scan_pages(store, request, resume, first, partitions)
        return wire.encode_scan(answer)  # type: ignore[return-value]

    def count(root: Any, info: strawberry.Info, store: str, partitions: list[int], exact: bool = True) -> JSON:
        with store_errors():
            return wire.encode_count(_local(info).count(store, partitions, exact))  # type: ignore[return-value]

    store = Arg("store", "store", str, "The store's name.")
    parts = Arg("partitions", "partitions", list[int], "The partitions to read.")
    return [
        resolved_field(
            "_lookup",
            resolver_with(
                lookup, [store, Arg("reads", "reads", JSON, "[[key, from, to, [partitions]], …]")], JSON | None
            ),
            "Internal (peers): states of point reads from the given partitions (nullable: one store's error in a "
            "request of several leaves the others' answers).",
        ),
        resolved_field(
            "_scan",
            resolver_with(
                scan,
                [
                    store,
                    Arg("scan", "scan", JSON, "{kind, args}"),
                    Arg("positions", "positions", JSON, "Per partition: where to resume (absent: from the start)."),
                    Arg("first", "first", int, "Items per partition at most."),
                    parts,
                ],
                JSON,
            ),
            "Internal (peers): one page of states per given partition.",
        ),
        resolved_field(
            "_count",
            resolver_with(count, [store, parts, Arg("exact", "exact", bool, "Exact, or RocksDB's estimate.")], JSON),
            "Internal (peers): entries in the given partitions.",
        ),
    ]


@lru_cache(maxsize=wire.MAX_LOOKUPS)
def _lookup_fields(query: str) -> tuple[FieldNode, ...]:
    """Return the root fields of a peers' point-read document (parsed once)."""
    operation = parse(query).definitions[0]
    assert isinstance(operation, OperationDefinitionNode)  # noqa: S101 - wire.lookups writes one operation
    return tuple(f for f in operation.selection_set.selections if isinstance(f, FieldNode))


def lookup_fields(query: str | None) -> tuple[FieldNode, ...] | None:
    """Return the root fields of query if it is one of the point-read documents peers send, else None."""
    if query is None or query not in _LOOKUP_DOCUMENTS:
        return None
    return _lookup_fields(query)


def answer_lookups(local: PeerQueries, fields: tuple[FieldNode, ...], variables: Mapping[str, Any]) -> Any:
    """Return the data of a peers' point-read document, read as the ``_lookup`` resolver reads; None if it can't.

    The lean path of forwarded point reads: no graphql-core execution. It answers only when every field
    answers: a variable of the wrong type, reads that do not decode or a store read that fails leave the
    request to graphql-core (None), which answers it with the field's own error — reads have no side effect.
    """
    answers: dict[str, Any] = {}
    for field in fields:
        arguments = {a.name.value: a.value for a in field.arguments or ()}
        store, reads = arguments.get("store"), arguments.get("reads")
        if not (isinstance(store, VariableNode) and isinstance(reads, VariableNode)):
            return None
        name, encoded = variables.get(store.name.value), variables.get(reads.name.value)
        if type(name) is not str:
            return None
        try:
            answers[(field.alias or field.name).value] = local.read_states(name, wire.decode_reads(encoded))
        except Exception:  # noqa: BLE001 - graphql-core answers it, with the field's error
            return None
    return {alias: wire.encode_lookup(answer) for alias, answer in answers.items()}
