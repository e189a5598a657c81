"""Internal root fields that peers call with a forwarded sub-request: states in compact JSON.

A node that routes reads to a peer sends ONE GraphQL request per peer, marked as forwarded, asking for
``_lookup`` / ``_scan`` / ``_count`` over partitions its routing chose. The peer answers from its own
partitions only (never forwards again) with mergeable states, positions and lags, encoded as
``schema.wire`` describes — no per-field resolution — so that the caller combines several nodes' answers
before finalizing them. A failed read is ``{"error": {"message": …, "extensions": {"code": …}}}`` in its
place. These fields start with ``_``: they are for peers, not for clients.

They are bound by the public limits (schema.limits): a ``_lookup`` carries at most ``max_forwarded_reads``
reads, a ``_scan`` page at most ``max_page_size`` entries (LIMIT_EXCEEDED). An argument this API never
sends — reads or keys that do not decode, a scan kind the store has not, arguments its kind does not
take — is BAD_REQUEST, never INTERNAL.
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
from iqgraph.schema.errors import BAD_REQUEST, ApiError, limit_exceeded, store_errors
from iqgraph.schema.limits import Limits
from iqgraph.schema.resolving import context
from iqgraph.schema.types import PeerQueries, Scan, StoreInfo

#: The internal root fields (``_call``, an owner-side field's sub-request, is schema.owner_fields'). Nothing
#: hides them from the SDL: they show there, described as internal, like any root field.
INTERNAL_FIELDS = ("_lookup", "_scan", "_count", "_call")
#: The documents of point reads peers send (``wire.lookups(n)``), by their text.
_LOOKUP_DOCUMENTS = {wire.lookups(n): n for n in range(1, wire.MAX_LOOKUPS + 1)}
#: The scans each kind of store answers, and the arguments each scan takes (all optional but a prefix's).
_SCANS = {"key_value": ("range", "prefix"), "window": ("fetch_all", "fetch_range"), "ranking": ("top",)}
_SCAN_ARGS: dict[str, dict[str, str]] = {
    "range": {"from_key": "key", "to_key": "key"},
    "prefix": {"prefix": "string"},
    "top": {"group": "string"},
    "fetch_all": {"time_from": "int", "time_to": "int"},
    "fetch_range": {"from_key": "key", "to_key": "key", "time_from": "int", "time_to": "int"},
}


def bad_argument(argument: str, message: str) -> ApiError:
    """Return the error of an internal field's argument this API never sends (BAD_REQUEST)."""
    return ApiError(f"{argument}: {message}", BAD_REQUEST, argument=argument)


def checked_reads(reads: Any, limits: Limits) -> list[wire.Read]:
    """Return the point reads of a ``_lookup``, decoded; LIMIT_EXCEEDED over the limit, BAD_REQUEST if malformed."""
    if isinstance(reads, list) and len(reads) > limits.max_forwarded_reads:
        raise limit_exceeded("reads in one _lookup", limits.max_forwarded_reads, len(reads))
    try:
        return wire.decode_reads(reads)
    except (ValueError, TypeError) as exc:
        raise bad_argument("reads", str(exc)) from None


def _is(kind: str, value: Any, key_type: str) -> bool:
    """Return whether value is a scan argument of kind: a time (int), a key of the store or a string (or null)."""
    if value is None:
        return kind != "int"
    if kind == "key":
        kind = "int" if key_type == "int" else "string"
    return type(value) is int if kind == "int" else type(value) is str


def checked_scan(scan: Any, positions: Any, store: StoreInfo | None) -> tuple[Scan, dict[int, Any]]:
    """Return the scan and resume positions of a ``_scan``; BAD_REQUEST unless it is a scan this API sends.

    store: the store's description (None: an unknown store, which the read reports as UNKNOWN_STORE).
    """
    try:
        request = Scan(str(scan["kind"]), dict(scan.get("args") or {}))
        resume = {int(p): c for p, c in dict(positions).items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise bad_argument("scan", f"not a scan this API sends: {exc}") from None
    if any(not (c is None or isinstance(c, str)) for c in resume.values()):
        raise bad_argument("positions", "each position must be a cursor (a string) or null")
    if store is None:
        return request, resume
    if request.kind not in _SCANS.get(store.kind, ()):
        raise bad_argument("scan", f"a {store.kind} store has no scan {request.kind!r}")
    allowed = _SCAN_ARGS[request.kind]
    unknown = sorted(set(request.args) - set(allowed))
    if unknown:
        raise bad_argument("scan", f"scan {request.kind!r} takes no arguments {unknown}; it takes {sorted(allowed)}")
    wrong = sorted(n for n, v in request.args.items() if not _is(allowed[n], v, store.key_type))
    if wrong or (request.kind == "prefix" and not isinstance(request.args.get("prefix"), str)):
        raise bad_argument("scan", f"scan {request.kind!r}: arguments of the wrong type: {wrong or ['prefix']}")
    return request, resume


def _local(info: strawberry.Info) -> PeerQueries:
    local = context(info).local
    if local is None:
        raise ApiError("this server does not answer forwarded sub-requests", "BAD_REQUEST")
    return local


def internal_fields() -> list[Field]:
    """Return the root fields _lookup, _scan and _count."""

    def lookup(root: Any, info: strawberry.Info, store: str, reads: JSON) -> JSON | None:
        decoded = checked_reads(reads, context(info).limits)
        with store_errors():
            return wire.encode_lookup(_local(info).read_states(store, decoded))  # type: ignore[return-value]

    def scan(
        root: Any, info: strawberry.Info, store: str, scan: JSON, positions: JSON, first: int, partitions: list[int]
    ) -> JSON:
        ctx = context(info)
        size = ctx.limits.page_size(first)
        described = next((s for s in ctx.queries.stores() if s.name == store), None)
        request, resume = checked_scan(scan, positions, described)
        with store_errors():
            answer = _local(info).scan_pages(store, request, resume, size, partitions)
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


def answer_lookups(
    local: PeerQueries, fields: tuple[FieldNode, ...], variables: Mapping[str, Any], limits: Limits
) -> Any:
    """Return the data of a peers' point-read document, read as the ``_lookup`` resolver reads; None if it can't.

    The lean path of forwarded point reads: no graphql-core execution. It answers only when every field
    answers: a variable of the wrong type, reads that do not decode or a store read that fails leave the
    request to graphql-core (None), which answers it with the field's own error — reads have no side effect.
    The reads are checked as the resolver checks them (``checked_reads``).
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
            answers[(field.alias or field.name).value] = local.read_states(name, checked_reads(encoded, limits))
        except Exception:  # noqa: BLE001 - graphql-core answers it, with the field's error
            return None
    return {alias: wire.encode_lookup(answer) for alias, answer in answers.items()}
