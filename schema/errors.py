"""GraphQL errors: every error carries ``extensions.code``; unexpected ones are masked and logged.

Expected failures are ApiErrors, most of them translated from the stores exception tree::

    StoreError (stores.exceptions)       extensions.code
    ├── StoreNotReadyError               STORE_NOT_READY   + retryAfterMs, state
    │   ├── StoreMigratedError           STORE_MIGRATED    + retryAfterMs, state ("MIGRATED")
    │   ├── DataLostError                DATA_LOST         + topic, partition, lostFrom, lostTo (Kafka
    │   │                                                  deleted records before they were applied)
    │   └── RepartitionedError           TOPIC_REPARTITIONED + topic, builtFor, found (partition counts)
    ├── UnknownStoreError                UNKNOWN_STORE
    ├── InvalidKeyError                  INVALID_KEY
    ├── InvalidCursorError               INVALID_CURSOR
    ├── ValueFormatError (and subs)      VALUE_FORMAT_ERROR
    └── anything else                    INTERNAL (masked: a read should never meet it)

    raised by this package               LIMIT_EXCEEDED    + limit, requested
                                         INVALID_ARGUMENT  + argument
    raised by the replica executor       STORE_NOT_AVAILABLE + partition, retryAfterMs[, bestLag, maxLag]
      (app.query.routing, .executor)     STALE_BEYOND_BOUND  + partition, bestLag, maxLag, retryAfterMs
                                         NODE_UNAVAILABLE    + retryAfterMs (a peer failed and no other
                                                             replica could answer)
                                         PARTITIONER_MISMATCH + topic, partitioner (keys no known
                                                             partitioner explains: cannot route)
    reported beside data (schema.reports) PARTIAL_RESULT     + store, missingPartitions, reasons
    an owner-side field (app.owner.runner) TIMEOUT           + field, timeoutMs (its function ran
                                                             longer; one that raised is INTERNAL)
    the REST path (app.http.rest)        NOT_FOUND          (404: the store has no such key)

An HTTP request that is not GraphQL (body not JSON, no query) is ``BAD_REQUEST`` (schema.asgi). A request naming
a document the node does not know is ``PERSISTED_QUERY_NOT_FOUND``, one sending a document a node that runs
trusted documents only does not trust ``TRUSTED_DOCUMENT_REQUIRED`` (schema.persisted).
Errors found before execution keep graphql-core's message and get ``GRAPHQL_PARSE_FAILED`` (syntax)
or ``GRAPHQL_VALIDATION_FAILED`` (unknown field, wrong argument type, bad variable…). Any other
exception raised while resolving becomes ``{"message": "Internal error…", "extensions": {"code":
"INTERNAL"}}``: no message, no traceback reaches the client; the original is logged with its traceback.
A StoreQueries implementation may raise ApiError itself (the routing core's codes): it passes through.

What each code means to the code that meets it — fails over to another replica, worth waiting for, transient,
its HTTP status — is one table, ``CODES`` (``CodeProperties``): the executor, live watches, owner-side fields
and REST read it, and nothing else lists codes.

Building a schema fails with ``SchemaDefinitionError`` (a ValueError, never a GraphQL error): one line
naming what to rename.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from graphql import GraphQLError, GraphQLSyntaxError
from strawberry.extensions import MaskErrors

from iqgraph.schema.scalars import InvalidScalarValue
from iqgraph.stores import (
    DataLostError,
    InvalidCursorError,
    InvalidKeyError,
    RepartitionedError,
    StoreError,
    StoreMigratedError,
    StoreNotReadyError,
    UnknownStoreError,
    UserError,
    ValueFormatError,
)

log = logging.getLogger(__name__)

STORE_NOT_READY = "STORE_NOT_READY"
STORE_MIGRATED = "STORE_MIGRATED"
UNKNOWN_STORE = "UNKNOWN_STORE"
INVALID_KEY = "INVALID_KEY"
INVALID_CURSOR = "INVALID_CURSOR"
VALUE_FORMAT_ERROR = "VALUE_FORMAT_ERROR"
LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
INTERNAL = "INTERNAL"
STORE_NOT_AVAILABLE = "STORE_NOT_AVAILABLE"
STALE_BEYOND_BOUND = "STALE_BEYOND_BOUND"
NODE_UNAVAILABLE = "NODE_UNAVAILABLE"
PARTITIONER_MISMATCH = "PARTITIONER_MISMATCH"
DATA_LOST = "DATA_LOST"
TOPIC_REPARTITIONED = "TOPIC_REPARTITIONED"
PARTIAL_RESULT = "PARTIAL_RESULT"
NOT_FOUND = "NOT_FOUND"
TIMEOUT = "TIMEOUT"
GRAPHQL_PARSE_FAILED = "GRAPHQL_PARSE_FAILED"
GRAPHQL_VALIDATION_FAILED = "GRAPHQL_VALIDATION_FAILED"
BAD_REQUEST = "BAD_REQUEST"
UNAUTHENTICATED = "UNAUTHENTICATED"
PERSISTED_QUERY_NOT_FOUND = "PERSISTED_QUERY_NOT_FOUND"  # a hash or documentId the node does not know
TRUSTED_DOCUMENT_REQUIRED = "TRUSTED_DOCUMENT_REQUIRED"  # --only-trusted-documents: any other document
FORBIDDEN = "FORBIDDEN"
INTERNAL_MESSAGE = "Internal error; the server has logged the details."


@dataclass(frozen=True)
class CodeProperties:
    """What an error code means to the code that meets it: one row of ``CODES``.

    fails_over: the replica that answered cannot serve the partition, another one may (the executor re-plans).
    waits: it may clear by itself (a partition restoring or moving): retried with backoff until the deadline.
    transient: the partition cannot be read now but may be later: a scan reports it missing (PARTIAL_RESULT)
        instead of failing, and a live watch follows it again (until its deadline).
    explains: when no replica can serve the partition, the client gets this error (it says why and what to do)
        rather than STORE_NOT_AVAILABLE (every code that waits explains too).
    http_status: the status REST answers with it. client_error: the request itself is wrong (4xx).
    """

    fails_over: bool = False
    waits: bool = False
    transient: bool = False
    explains: bool = False
    http_status: int = 500

    @property
    def client_error(self) -> bool:
        """Return whether the code blames the request (a 4xx), not the server."""
        return 400 <= self.http_status < 500


_REPLICA = CodeProperties(fails_over=True, transient=True, http_status=503)
_MOVING = CodeProperties(fails_over=True, waits=True, transient=True, http_status=503)
#: Every code the API answers with, and its properties (a code missing here is a bug: see ``properties``).
CODES: Mapping[str, CodeProperties] = MappingProxyType(
    {
        STORE_NOT_READY: _MOVING,
        STORE_MIGRATED: _MOVING,
        NODE_UNAVAILABLE: _REPLICA,
        STALE_BEYOND_BOUND: _REPLICA,
        STORE_NOT_AVAILABLE: CodeProperties(transient=True, http_status=503),
        DATA_LOST: CodeProperties(fails_over=True, transient=True, explains=True, http_status=503),
        UNKNOWN_STORE: CodeProperties(http_status=404),
        NOT_FOUND: CodeProperties(http_status=404),
        INVALID_KEY: CodeProperties(http_status=400),
        INVALID_CURSOR: CodeProperties(http_status=400),
        INVALID_ARGUMENT: CodeProperties(http_status=400),
        BAD_REQUEST: CodeProperties(http_status=400),
        LIMIT_EXCEEDED: CodeProperties(http_status=400),
        GRAPHQL_PARSE_FAILED: CodeProperties(http_status=400),
        GRAPHQL_VALIDATION_FAILED: CodeProperties(http_status=400),
        UNAUTHENTICATED: CodeProperties(http_status=401),
        PERSISTED_QUERY_NOT_FOUND: CodeProperties(http_status=400),
        TRUSTED_DOCUMENT_REQUIRED: CodeProperties(http_status=400),
        FORBIDDEN: CodeProperties(http_status=403),
        PARTITIONER_MISMATCH: CodeProperties(http_status=409),
        TOPIC_REPARTITIONED: CodeProperties(http_status=409),
        TIMEOUT: CodeProperties(http_status=504),
        VALUE_FORMAT_ERROR: CodeProperties(http_status=500),
        PARTIAL_RESULT: CodeProperties(http_status=200),  # beside data, never in place of it
        INTERNAL: CodeProperties(http_status=500),
    }
)


def properties(code: str) -> CodeProperties:
    """Return the properties of code (an unknown code: an internal error's)."""
    return CODES.get(code, CODES[INTERNAL])


def fails_over(error: BaseException) -> bool:
    """Return whether error is a coded error after which another replica is tried."""
    return isinstance(error, ApiError) and properties(error.code).fails_over


_CODES: tuple[tuple[type[StoreError], str], ...] = (
    (DataLostError, DATA_LOST),
    (RepartitionedError, TOPIC_REPARTITIONED),
    (StoreMigratedError, STORE_MIGRATED),
    (StoreNotReadyError, STORE_NOT_READY),
    (UnknownStoreError, UNKNOWN_STORE),
    (InvalidKeyError, INVALID_KEY),
    (InvalidCursorError, INVALID_CURSOR),
    (ValueFormatError, VALUE_FORMAT_ERROR),
)


class SchemaDefinitionError(UserError, ValueError):
    """Stores (entities, relations) that cannot be turned into a schema; the message says what to rename."""


class ApiError(GraphQLError):
    """An expected failure, shown to the client with its message and ``extensions.code``."""

    def __init__(self, message: str, code: str, **extensions: Any) -> None:
        super().__init__(message, extensions={"code": code, **extensions})

    @property
    def code(self) -> str:
        """Return the error's extensions.code."""
        return str((self.extensions or {})["code"])


def api_error(exc: Exception) -> Exception:
    """Return the ApiError an expected store failure becomes; any other exception unchanged."""
    if isinstance(exc, ApiError) or not isinstance(exc, StoreError):
        return exc
    for kind, code in _CODES:
        if isinstance(exc, kind):
            if isinstance(exc, DataLostError):
                return ApiError(
                    str(exc),
                    code,
                    topic=exc.topic,
                    partition=exc.partition,
                    lostFrom=exc.first_offset,
                    lostTo=exc.end_offset,
                )
            if isinstance(exc, RepartitionedError):
                return ApiError(str(exc), code, topic=exc.topic, builtFor=exc.built_for, found=exc.found)
            if isinstance(exc, StoreNotReadyError):
                return ApiError(str(exc), code, retryAfterMs=exc.retry_after_ms, state=exc.state)
            return ApiError(str(exc), code)
    return exc


@contextmanager
def store_errors() -> Iterator[None]:
    """Raise expected store failures inside the block as ApiErrors."""
    try:
        yield
    except StoreError as exc:
        translated = api_error(exc)
        if translated is exc:
            raise
        raise translated from exc


def limit_exceeded(what: str, limit: int, requested: int) -> ApiError:
    """Return the error for a request over a configured limit."""
    return ApiError(
        f"{what}: {requested} requested, at most {limit} allowed", LIMIT_EXCEEDED, limit=limit, requested=requested
    )


def invalid_argument(argument: str, message: str) -> ApiError:
    """Return the error for an argument value that the field cannot serve."""
    return ApiError(f"{argument}: {message}", INVALID_ARGUMENT, argument=argument)


def is_unexpected(error: GraphQLError) -> bool:
    """Return whether error comes from a failure the API does not expect (a bug, an unmapped exception)."""
    original = error.original_error
    if isinstance(original, ApiError):
        return False
    if error.path is not None:  # raised while resolving, and not an ApiError
        return True
    return original is not None and not isinstance(original, GraphQLError | InvalidScalarValue)


def _code(error: GraphQLError) -> str | None:
    code = (error.extensions or {}).get("code")
    return code if isinstance(code, str) else None


def _needs_rewrite(error: GraphQLError) -> bool:
    return is_unexpected(error) or _code(error) is None


def _rewrite(error: GraphQLError) -> GraphQLError:
    if is_unexpected(error):
        return GraphQLError(
            INTERNAL_MESSAGE, error.nodes, error.source, error.positions, error.path, None, {"code": INTERNAL}
        )
    code = GRAPHQL_PARSE_FAILED if isinstance(error, GraphQLSyntaxError) else GRAPHQL_VALIDATION_FAILED
    extensions = {**(error.extensions or {}), "code": code}
    return GraphQLError(
        error.message, error.nodes, error.source, error.positions, error.path, error.original_error, extensions
    )


def in_document_order(data: Any, errors: list[GraphQLError]) -> list[GraphQLError]:
    """Return errors ordered by where their path is in the response (document order); pathless ones last.

    graphql-core lists field errors in the order their resolvers happened to fail, which depends on
    scheduling; ordered by path, the same request always gets the same response, on every execution path.
    """

    def position(error: GraphQLError) -> tuple[int, ...]:
        if not error.path:
            return (1 << 30,)
        found: list[int] = []
        value = data
        for step in error.path:
            if isinstance(value, dict) and isinstance(step, str):
                keys = list(value)
                found.append(keys.index(step) if step in value else len(keys))
                value = value.get(step)
            elif isinstance(value, list) and isinstance(step, int):
                found.append(step)
                value = value[step] if 0 <= step < len(value) else None
            else:
                found.append(step if isinstance(step, int) else 0)
                value = None
        return tuple(found)

    return sorted(errors, key=position) if len(errors) > 1 else errors


def with_codes(errors: Iterable[GraphQLError]) -> list[GraphQLError]:
    """Return errors each with a code, the unexpected ones masked (applying it twice changes nothing)."""
    return [_rewrite(e) if _needs_rewrite(e) else e for e in errors]


class ErrorCodes(MaskErrors):
    """Give every error an ``extensions.code``; replace unexpected errors by a generic INTERNAL one."""

    def __init__(self) -> None:
        super().__init__(should_mask_error=_needs_rewrite, error_message=INTERNAL_MESSAGE)

    def anonymise_error(self, error: GraphQLError) -> GraphQLError:
        """Return error with a code, masked if unexpected."""
        return _rewrite(error)


def log_errors(errors: Iterable[GraphQLError]) -> None:
    """Log each error of a request: unexpected ones with their traceback, the others briefly."""
    for error in errors:
        if is_unexpected(error):
            path = ".".join(str(p) for p in error.path or ()) or "(request)"
            log.error("unexpected error at %s: %s", path, error.message, exc_info=error.original_error)
        else:
            log.debug("%s: %s", _code(error) or "GRAPHQL_ERROR", error.message)
