"""Request limits: keys per multi-key field, page sizes, aliases, depth and tokens per document, body and
header bytes, and a deadline per request.

What can blow a request up is its width (many keys, large pages, one field repeated under many aliases),
its depth (entities and relations nest: ``customer { orders { product { … } } }``), its document (tokens
to parse) and its bytes (body, headers). Each limit breaks with a coded error: LIMIT_EXCEEDED naming the
limit and the amount requested (a document over max_tokens does not parse: GRAPHQL_PARSE_FAILED; a
request past its deadline: TIMEOUT). The internal fields peers call are bound by the same limits: a
``_scan`` page by max_page_size, a ``_lookup`` by what one public request within the limits can read
of one store (``max_forwarded_reads``).

Where each applies, on the compiled (lean) path and the Strawberry path alike: the document rules
(``validation_rules``: aliases, depth, tokens) are given to both Strawberry's validation and the
compiled plans' (a document that breaks one never gets a plan, and Strawberry refuses it); tokens also
bound Strawberry's parser (MaxTokensLimiter); bytes and the deadline are checked by the ASGI app
(schema.asgi) before either path runs; keys and pages by the fields' resolvers.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

from graphql import (
    FragmentDefinitionNode,
    GraphQLError,
    OperationDefinitionNode,
    ValidationContext,
    ValidationRule,
    parse,
)
from graphql.error import GraphQLSyntaxError
from strawberry.extensions.max_aliases import count_fields_with_alias
from strawberry.extensions.query_depth_limiter import create_validator

from iqgraph.schema.errors import LIMIT_EXCEEDED, ApiError, invalid_argument, limit_exceeded

_POSITIVE = (
    "max_keys",
    "max_page_size",
    "default_page_size",
    "max_aliases",
    "max_depth",
    "max_tokens",
    "max_body_bytes",
    "max_header_bytes",
    "request_timeout_ms",
)


@dataclass(frozen=True)
class Limits:
    """The limits of one schema and of its HTTP requests."""

    max_keys: int = 1_000  # keys in one getMany / mightContainMany
    max_page_size: int = 1_000  # `first` of a connection
    default_page_size: int = 100  # `first` when the query leaves it out
    max_aliases: int = 100  # aliased fields in one document
    max_depth: int = 20  # nested selections of one operation (strawberry's QueryDepthLimiter counts them)
    max_tokens: int = 20_000  # tokens of one document (strawberry's MaxTokensLimiter)
    max_body_bytes: int = 4 << 20  # a POST body (forwarded point reads at max_forwarded_reads fit in it)
    max_header_bytes: int = 32 << 10  # the request's header names and values together
    request_timeout_ms: int = 30_000  # a request's whole life: reading the body, executing, answering

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            if getattr(self, name) < 1:
                raise ValueError(f"limit {name} must be at least 1, got {getattr(self, name)}")
        if self.default_page_size > self.max_page_size:
            raise ValueError(
                f"default_page_size ({self.default_page_size}) exceeds max_page_size ({self.max_page_size})"
            )

    @property
    def max_forwarded_reads(self) -> int:
        """Return the point reads one ``_lookup`` may carry: what one request within the limits reads of one store.

        A request's reads of a store go out as one batch (its DataLoader), so a peer may rightly get up to
        (aliases + 1) fields' worth of keys or page entries (relations) in one ``_lookup``.
        """
        return (self.max_aliases + 1) * max(self.max_keys, self.max_page_size)

    def check_keys(self, keys: Sized) -> None:
        """Raise LIMIT_EXCEEDED if a multi-key field asks for more than max_keys keys."""
        if len(keys) > self.max_keys:
            raise limit_exceeded("keys in one field", self.max_keys, len(keys))

    def page_size(self, first: int | None) -> int:
        """Return the page size of a connection field: first, checked, or the default."""
        if first is None:
            return self.default_page_size
        if first < 1:
            raise invalid_argument("first", f"must be at least 1, got {first}")
        if first > self.max_page_size:
            raise limit_exceeded("page size (first)", self.max_page_size, first)
        return first

    def validation_rules(self) -> list[type[ValidationRule]]:
        """Return the document rules of both paths: aliases, depth, tokens (make them once per schema)."""
        return [_alias_rule(self.max_aliases), _depth_rule(self.max_depth), _token_rule(self.max_tokens)]


def _alias_rule(max_aliases: int) -> type[ValidationRule]:
    class MaxAliases(ValidationRule):
        """Refuse documents with more aliased fields than the limit."""

        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            definitions: Any = context.document.definitions
            fragments = {d.name.value: d for d in definitions if isinstance(d, FragmentDefinitionNode)}
            operations = [d for d in definitions if isinstance(d, OperationDefinitionNode)]
            total = sum(count_fields_with_alias(op, fragments) for op in operations)
            if total > max_aliases:
                error: ApiError = limit_exceeded("aliases in one document", max_aliases, total)
                context.report_error(error)

    return MaxAliases


class _FirstErrorAsLimit:
    """The validation context strawberry's depth rule reports to: its first error only, coded LIMIT_EXCEEDED."""

    def __init__(self, context: ValidationContext, max_depth: int) -> None:
        self._context = context
        self._max_depth = max_depth
        self._reported = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def report_error(self, error: GraphQLError) -> None:
        if self._reported:
            return
        self._reported = True
        message = f"query depth: more than {self._max_depth} levels of selections, at most {self._max_depth} allowed"
        extensions = {"code": LIMIT_EXCEEDED, "limit": self._max_depth}
        self._context.report_error(GraphQLError(message, error.nodes, extensions=extensions))


def _depth_rule(max_depth: int) -> type[ValidationRule]:
    strawberry_rule: Any = create_validator(max_depth, None)

    class MaxDepth(strawberry_rule):
        """Refuse documents nested deeper than the limit (strawberry's QueryDepthLimiter, one coded error)."""

        def __init__(self, context: ValidationContext) -> None:
            super().__init__(_FirstErrorAsLimit(context, max_depth))

    return MaxDepth


def _token_rule(max_tokens: int) -> type[ValidationRule]:
    class MaxTokens(ValidationRule):
        """Refuse documents of more tokens than the limit, counted as MaxTokensLimiter makes the parser count them.

        Strawberry's parser stops at the limit (MaxTokensLimiter) and never validates such a document; this
        rule keeps it from a compiled plan, whose parse has no limit: it then goes to Strawberry, which
        refuses it. Run once per document (the plans and the validation cache keep the outcome).
        """

        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            loc = context.document.loc
            if loc is None:
                return
            try:
                parse(loc.source, no_location=True, max_tokens=max_tokens)
            except GraphQLSyntaxError as exc:
                context.report_error(exc)

    return MaxTokens
