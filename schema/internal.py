"""Internal root fields that peers call with a forwarded sub-request: states in compact JSON.

A node that routes reads to a peer sends ONE GraphQL request per peer to the peer's internal endpoint
(its own schema, ``builder.build_internal_schema``, behind ``app.security.peer_auth``'s signature check), asking
for ``_lookup`` / ``_scan`` / ``_count`` over partitions its routing chose. The peer answers from its own
partitions only (never forwards again) with mergeable states, positions and lags, encoded as
``schema.wire`` describes — no per-field resolution — so that the caller combines several nodes' answers
before finalizing them. A failed read is ``{"error": {"message": …, "extensions": {"code": …}}}`` in its
place. The owner checks each read against the caller the peer carried (``schema.access.check_read``) and
bounds it by the public limits: at most max_keys reads per ``_lookup``, max_page_size items per page; a
bad argument is BAD_REQUEST. These fields are not in the public schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import strawberry
from graphql import FieldNode, OperationDefinitionNode, VariableNode, parse
from strawberry.scalars import JSON

from iqgraph.schema import wire
from iqgraph.schema.access import Principal, check_read
from iqgraph.schema.dynamic import Arg, Field, resolved_field, resolver_with
from iqgraph.schema.errors import BAD_REQUEST, ApiError, limit_exceeded, store_errors
from iqgraph.schema.limits import Limits
from iqgraph.schema.resolving import context
from iqgraph.schema.types import PeerQueries, Scan
from iqgraph.stores.scans import scan_from_wire

#: The internal root fields (``_call``, an owner-side field's sub-request, is schema.owner_fields').
INTERNAL_FIELDS = ("_lookup", "_scan", "_count", "_call")
#: The documents of point reads peers send (``wire.lookups(n)``), by their text.
_LOOKUP_DOCUMENTS = {wire.lookups(n): n for n in range(1, wire.MAX_LOOKUPS + 1)}


def local_partitions(info: strawberry.Info) -> PeerQueries:
    """Return the partitions of the node a peer's sub-request reads (only the internal schema has them)."""
    local = context(info).local
    if local is None:
        raise ApiError("this server does not answer forwarded sub-requests", BAD_REQUEST)
    return local


def bad_request(argument: str, message: str) -> ApiError:
    """Return the error of an internal field's argument no peer sends."""
    return ApiError(f"{argument}: {message}", BAD_REQUEST, argument=argument)


def checked_reads(reads: Any, limits: Limits) -> list[Any]:
    """Return a _lookup's decoded reads: BAD_REQUEST if they do not decode, LIMIT_EXCEEDED over max_keys."""
    if isinstance(reads, list):
        limits.check_keys(reads)
    try:
        return wire.decode_reads(reads)
    except (ValueError, TypeError) as exc:
        raise bad_request("reads", str(exc)) from None


def _checked_scan(
    scan: Any, positions: Any, first: int, partitions: list[int], limits: Limits, kind: str | None
) -> tuple[Scan, Any]:
    """Return a _scan's Scan and positions, or BAD_REQUEST: a page resumed from an edge's cursor asks for up to
    twice max_page_size (the skipped items, then the page)."""
    if first > 2 * limits.max_page_size:
        raise limit_exceeded("page size (first)", 2 * limits.max_page_size, first)
    if first < 1 or any(p < 0 for p in partitions):
        raise bad_request("first", "first and partitions must be positive")
    try:
        request = scan_from_wire(scan, kind)  # the scan types check their own wire form (stores.scans)
    except ValueError as exc:
        raise bad_request("scan", str(exc)) from None
    if not isinstance(positions, dict) or not all(isinstance(c, str | None) for c in positions.values()):
        raise bad_request("positions", "expected {partition: cursor}")
    try:
        resume = {int(p): c for p, c in positions.items()}
    except ValueError:
        raise bad_request("positions", "partitions are integers") from None
    return request, resume


def _principal(info: strawberry.Info) -> Principal:
    return context(info).principal


def internal_fields(limits: Limits) -> list[Field]:
    """Return the root fields _lookup, _scan and _count, bounded by limits."""

    def lookup(root: Any, info: strawberry.Info, store: str, reads: JSON) -> JSON | None:
        check_read(_principal(info), store)
        decoded = checked_reads(reads, limits)
        with store_errors():
            return wire.encode_lookup(local_partitions(info).read_states(store, decoded))  # type: ignore[return-value]

    def scan(
        root: Any, info: strawberry.Info, store: str, scan: JSON, positions: JSON, first: int, partitions: list[int]
    ) -> JSON:
        check_read(_principal(info), store)
        kind = next((s.kind for s in context(info).queries.stores() if s.name == store), None)
        request, resume = _checked_scan(scan, positions, first, partitions, limits, kind)
        with store_errors():
            answer = local_partitions(info).scan_pages(store, request, resume, first, partitions)
        return wire.encode_scan(answer)  # type: ignore[return-value]

    def count(root: Any, info: strawberry.Info, store: str, partitions: list[int], exact: bool = True) -> JSON:
        check_read(_principal(info), store)
        if any(p < 0 for p in partitions):
            raise bad_request("partitions", "partitions are not negative")
        with store_errors():
            return wire.encode_count(local_partitions(info).count(store, partitions, exact))  # type: ignore[return-value]

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


def answer_lookups(
    local: PeerQueries,
    fields: tuple[FieldNode, ...],
    variables: Mapping[str, Any],
    principal: Principal,
    limits: Limits,
) -> Any:
    """Return the data of a peers' point-read document, read as the ``_lookup`` resolver reads; None if it can't.

    The lean path of forwarded point reads: no graphql-core execution. It answers only when every field
    answers: a store the caller may not read, a variable of the wrong type, reads over the limit or that
    do not decode, or a store read that fails leave the request to graphql-core (None), which answers it
    with the field's own error — reads have no side effect.
    """
    answers: dict[str, Any] = {}
    for field in fields:
        arguments = {a.name.value: a.value for a in field.arguments or ()}
        store, reads = arguments.get("store"), arguments.get("reads")
        if not (isinstance(store, VariableNode) and isinstance(reads, VariableNode)):
            return None
        name, encoded = variables.get(store.name.value), variables.get(reads.name.value)
        if type(name) is not str or not principal.may_read(name):
            return None
        try:
            answers[(field.alias or field.name).value] = local.read_states(name, checked_reads(encoded, limits))
        except Exception:  # noqa: BLE001 - graphql-core answers it, with the field's error
            return None
    return {alias: wire.encode_lookup(answer) for alias, answer in answers.items()}
