"""The GraphQL over HTTP spec's rules: media types, Accept negotiation, well-formed requests, status codes.

Followed: the graphql-over-http draft (spec/GraphQLOverHTTP.md as of August 2026, commit e1e46e7), and
where the GraphQL foundation's own audit (npm graphql-http 1.23's ``serverAudits``, run by
tests/schema/test_http_audit.py: no error, no warning) asks for a SHOULD the draft leaves open or words
otherwise, the audit — what the clients' ecosystem tests servers with. What this module does, rule by rule:

Response media type (``negotiate``)
    ``application/graphql-response+json`` is the spec's response type, chosen whenever a client names it
    (at the highest q; ties between named types go to it). With no ``Accept``, or one that only matches
    through a wildcard (``*/*``, ``application/*``), the answer is ``application/json``: such a client
    may be anything, and every JSON client reads it (audits 47DE, 80D8). A client that accepts only
    ``application/json`` is a *legacy client* (see the status codes). An ``Accept`` that allows neither
    type is 406. Every response says ``; charset=utf-8``.

Request (``graphql_request``, ``query_params``, ``decode_body``, ``check_content_type``)
    POST needs ``Content-Type: application/json`` in UTF-8 (415 otherwise, also when missing); a
    body that is not JSON is 400; JSON that is not a *well-formed GraphQL-over-HTTP request* (not an
    object, ``query`` not a string, ``variables``/``extensions`` not objects, ``operationName`` not a
    string, a GET ``variables`` that is not JSON) is 422. ``null``, or on GET the empty string, means
    absent; unknown properties are ignored. There are no batches.

Status of a GraphQL response (``response_status``)
    data without errors: 200; data (even null) with errors, i.e. field errors: 294 with
    graphql-response+json, 200 with application/json. No data entry (a request error: the document does
    not parse or validate, or its variables do not coerce; nothing was executed): 500 for a masked
    INTERNAL error; otherwise 400 with graphql-response+json (the audit's 556A, 74FF, 86EE — the August
    draft moved validation and coercion to 422; the audit, the spec's earlier text and most servers keep
    400), and 200 with application/json (a legacy client, which may not read a 4xx body as GraphQL: the
    audit's 572B, FDE2, 7B9B, the spec's earlier "application/json" section), its errors in the body.
    A mutation or subscription over GET is 405 with ``Allow: POST``, decided from query and
    operationName before validation, as the spec's GET section says; another method is 405 too.
    Refusals before a GraphQL request exists (``RequestError``: 400 body not JSON, 415, 422 not a
    well-formed request or no operation to run, 405, 406, 413, 431, 504) keep their status whatever the
    Accept; the audit's notices ("MAY use 400 if parameters are invalid") are MAYs the draft answers
    with 422.

Limits (``headers_too_large``, ``body_too_large``, ``timed_out``: the refusals app.http.request_guard sends)
    a request line and headers over ``max_header_bytes``: 431; a body over ``max_body_bytes``: 413
    (refused from its Content-Length, or as soon as the bytes read pass the limit); both with code
    LIMIT_EXCEEDED. A request past its deadline (``request_timeout_ms``) before its answer began: 504
    with code TIMEOUT. JSON nested too deeply to decode is 400 like any body that is not JSON.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from cross_web import HTTPException
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.types import ExecutionResult

from iqgraph.schema.errors import BAD_REQUEST, INTERNAL, LIMIT_EXCEEDED, TIMEOUT

GRAPHQL_RESPONSE = "application/graphql-response+json"
_LONG_NUMBER = re.compile(rb"\d{20}")  # a run of digits orjson may not read as json.loads does (decode_body)
JSON = "application/json"
#: The media types a response can have, in the server's order of preference.
SUPPORTED = (GRAPHQL_RESPONSE, JSON)
#: The spec's own code for a response with data and errors.
PARTIAL_SUCCESS = 294
_UTF8 = ("utf-8", "utf8")
_OPTIONAL: tuple[tuple[str, type], ...] = (("operationName", str), ("variables", dict), ("extensions", dict))


class RequestError(HTTPException):
    """A request refused before execution: its HTTP status, a message, the error's code, extra headers."""

    def __init__(
        self, status_code: int, reason: str, code: str = BAD_REQUEST, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(status_code, reason)
        self.code = code
        self.headers = dict(headers or {})


def _media_range(part: str) -> tuple[str, float] | None:
    media, *params = (p.strip() for p in part.split(";"))
    q = 1.0
    for name, _, value in (p.partition("=") for p in params):
        if name.strip().lower() == "q":
            try:
                q = float(value)
            except ValueError:
                return None
    return (media.lower(), q) if "/" in media and 0 <= q <= 1 else None


def _quality(media: str, ranges: Sequence[tuple[str, float]]) -> tuple[float, int]:
    """Return the q of media under its most specific matching range, and that range's specificity."""
    patterns = (media, media.split("/")[0] + "/*", "*/*")
    matches = [(2 - patterns.index(r), q) for r, q in ranges if r in patterns]
    specificity, q = max(matches, default=(-1, 0.0))
    return q, specificity


@functools.lru_cache(maxsize=1024)  # a client sends the same Accept with every request
def negotiate(accept: str | None) -> str | None:
    """Return the media type to answer an Accept header with; None when it accepts none we serve."""
    if accept is None or not accept.strip():
        return JSON
    ranges = [r for r in map(_media_range, accept.split(",")) if r is not None]
    q, _, _, media = max((*_quality(m, ranges), _preferred(m, ranges), m) for m in SUPPORTED)
    return media if q > 0 else None


def _preferred(media: str, ranges: Sequence[tuple[str, float]]) -> int:
    """Return the rank of media among equals: the spec's type when named, plain JSON when only a wildcard
    matched (a client that names neither may be anything: every JSON client reads application/json)."""
    named = any(r == GRAPHQL_RESPONSE for r, _ in ranges)
    return int(media == (GRAPHQL_RESPONSE if named else JSON))


def not_acceptable(accept: str) -> RequestError:
    """Return the refusal of a request whose Accept allows no type we serve."""
    return RequestError(406, f"Accept {accept!r} allows none of: {', '.join(SUPPORTED)}")


def content_type(media_type: str, status: int) -> str:
    """Return the Content-Type of a response: a legacy client's type only on 2xx, as the spec says."""
    chosen = media_type if 200 <= status < 300 else GRAPHQL_RESPONSE
    return f"{chosen}; charset=utf-8"


def check_content_type(value: str | None) -> None:
    """Raise 415 unless a POST body is application/json in UTF-8 (the charset utf-8 when not given)."""
    media, *params = (p.strip() for p in (value or "").split(";"))
    charsets = [v.strip('" ').lower() for n, _, v in (p.partition("=") for p in params) if n.lower() == "charset"]
    if media.lower() != JSON or any(c not in _UTF8 for c in charsets):
        raise RequestError(415, f"Content-Type {value!r} is not supported: send {JSON} (UTF-8)")


def decode_body(body: bytes) -> object:
    """Return the JSON value of a POST body; 400 if it is not JSON in UTF-8.

    orjson reads it first; a body orjson refuses (NaN, infinite numbers, lone surrogates, nesting past 1,024) or
    may read differently (an integer of 20 digits or more, past 64 bits, which it makes a float) is read by the
    standard library, so the same bodies parse, to the same values, as with json.loads alone."""
    if _LONG_NUMBER.search(body) is None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, "Unable to parse the request body as JSON") from exc
    except RecursionError:
        raise RequestError(400, "Unable to parse the request body as JSON: nested too deeply") from None


def headers_too_large(size: int, max_bytes: int) -> RequestError:
    """Return the refusal of a request whose line and headers are size bytes, over max_bytes."""
    return RequestError(
        431, f"The request's line and headers are {size} bytes, at most {max_bytes} allowed", LIMIT_EXCEEDED
    )


def body_too_large(max_bytes: int) -> RequestError:
    """Return the refusal of a request whose body is longer than max_bytes."""
    return RequestError(413, f"The request body is longer than {max_bytes} bytes, the most allowed", LIMIT_EXCEEDED)


def timed_out(timeout_ms: int) -> RequestError:
    """Return the refusal of a request not answered within its deadline."""
    return RequestError(504, f"The request was not answered within its deadline of {timeout_ms} ms", TIMEOUT)


def query_params(params: Mapping[str, str | None]) -> dict[str, object]:
    """Return the request a GET's query string encodes: empty optional parameters are absent."""
    data: dict[str, object] = {}
    for name in ("query", "operationName", "variables", "extensions", "documentId"):
        value = params.get(name)
        if value is None or (value == "" and name != "query"):
            continue
        data[name] = value
        if name in ("variables", "extensions"):
            try:
                data[name] = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                raise RequestError(422, f"{name} must be a JSON object") from None
    return data


def graphql_request(data: object) -> GraphQLRequestData:
    """Return the GraphQL-over-HTTP request in data; 422 if data is not a well-formed one."""
    if not isinstance(data, dict):
        raise RequestError(422, "The request must be a JSON object with a query (batches are not supported)")
    if not isinstance(data.get("query"), str):
        raise RequestError(422, "The request's query is required and must be a string")
    for name, kind in _OPTIONAL:
        if data.get(name) is not None and not isinstance(data[name], kind):
            raise RequestError(422, f"The request's {name} must be {'a string' if kind is str else 'an object'}")
    return GraphQLRequestData(data["query"], data.get("variables"), data.get("operationName"), data.get("extensions"))


def is_request_error(result: ExecutionResult) -> bool:
    """Return whether result failed before execution: no data, and no error belongs to a field."""
    return result.data is None and bool(result.errors) and all(e.path is None for e in result.errors or ())


def response_status(response: GraphQLHTTPResponse, media_type: str) -> int:
    """Return the status of a GraphQL response (a request error has no data entry)."""
    if "data" not in response:
        codes = {(e.get("extensions") or {}).get("code") for e in response.get("errors") or () if isinstance(e, dict)}
        if INTERNAL in codes:
            return 500
        return 200 if media_type == JSON else 400  # a legacy client: the errors are in the body (see the module)
    if response.get("errors"):
        return PARTIAL_SUCCESS if media_type == GRAPHQL_RESPONSE else 200
    return 200


def refusal(exc: HTTPException) -> tuple[dict[str, Any], dict[str, str]]:
    """Return the GraphQL response body and the headers of a refused request."""
    code = exc.code if isinstance(exc, RequestError) else BAD_REQUEST
    headers = dict(exc.headers) if isinstance(exc, RequestError) else {}
    if exc.status_code == 405:
        headers.setdefault("allow", "GET, POST")  # RFC 9110 requires Allow on a 405
    headers["content-type"] = content_type(GRAPHQL_RESPONSE, exc.status_code)
    return {"errors": [{"message": exc.reason, "extensions": {"code": code}}]}, headers
