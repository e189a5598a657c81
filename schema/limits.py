"""Request limits: keys per multi-key field, page sizes, and per document its aliases, depth and tokens.

What can blow a request up is its width (many keys, large pages, one field repeated under many aliases),
its depth (entities and relations nest: ``customer { orders { product { … } } }``) and its document (tokens
to parse, then to validate). Each limit breaks with a coded error: LIMIT_EXCEEDED naming the limit and the
amount requested, but for a document over ``max_tokens``: its parser stops there, so it does not parse
(GRAPHQL_PARSE_FAILED, HTTP 400, graphql-core's "Document contains more than N tokens").

Where each applies, on the compiled (lean) path and the Strawberry path alike:

- tokens, aliases, depth: ``DocumentChecks`` parses (``parse(max_tokens=…)``) and validates (with
  ``validation_rules``) every document, once: the compiled plans (schema.compiled) ask it first, and the
  Strawberry path finds their parse and validation in its caches; a document that breaks a limit gets no
  plan, so Strawberry refuses it with the same error;
- keys and pages: the fields' resolvers (``check_keys``, ``page_size``), on both paths;
- body bytes, header bytes, the deadline: the node's ASGI guard (app.http.request_guard), before either path.

The caches of parsed and validated documents (``DocumentCache``) are bounded in entries AND in characters
of text, and never keep a document over ``CACHED_DOCUMENT_CHARS``: a syntax tree costs ~150–200 bytes per
character, so distinct large documents (each valid, each under every limit) cannot pile up gigabytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSchema,
    InlineFragmentNode,
    OverlappingFieldsCanBeMergedRule,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    parse,
    specified_rules,
)
from strawberry.extensions import ParserCache, ValidationCache
from strawberry.schema.schema import validate_document

from iqgraph.schema.errors import invalid_argument, limit_exceeded

#: A document longer than this (characters) is parsed, validated and planned anew each time, never cached.
CACHED_DOCUMENT_CHARS = 16 << 10
#: The characters of text one document cache keeps at most, all its documents together.
CACHED_CHARS = 256 << 10
#: The comparisons graphql-core's OverlappingFieldsCanBeMergedRule may make in one document (its own budget is
#: 500,000, ~1.3 s of CPU: one field repeated 600 times spends it). Real documents spend hundreds.
MERGE_BUDGET = 50_000
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

V = TypeVar("V")


@dataclass(frozen=True)
class Limits:
    """The limits of one schema and of its HTTP requests (the defaults are app.settings.Settings')."""

    max_keys: int = 1_000  # keys in one getMany / mightContainMany
    max_page_size: int = 1_000  # `first` of a connection
    default_page_size: int = 100  # `first` when the query leaves it out
    max_aliases: int = 100  # aliased fields in one document
    max_depth: int = 20  # nested selection sets of one operation (as strawberry's QueryDepthLimiter counts)
    max_tokens: int = 20_000  # tokens of one document (graphql-core's parser stops past them)
    max_body_bytes: int = 4 << 20  # a request body (app.http.request_guard)
    max_header_bytes: int = 32 << 10  # a request's line and headers (app.http.request_guard)
    request_timeout_ms: int = 30_000  # a request's deadline (app.http.request_guard)

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            if getattr(self, name) < 1:
                raise ValueError(f"limit {name} must be at least 1, got {getattr(self, name)}")
        if self.default_page_size > self.max_page_size:
            raise ValueError(
                f"default_page_size ({self.default_page_size}) exceeds max_page_size ({self.max_page_size})"
            )

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

    def alias_rule(self) -> type[ValidationRule]:
        """Return the document rule (aliases and depth); prefer ``DocumentChecks``, which adds the token limit."""
        return self.validation_rules()[0]

    def validation_rules(self) -> list[type[ValidationRule]]:
        """Return the document rules of both paths (aliases, depth) as one rule: make it once per schema."""
        return [_shape_rule(self.max_aliases, self.max_depth)]


class _Shape:
    """The aliases and the depth of selection sets; each fragment's are counted once, then reused.

    Depth as strawberry's QueryDepthLimiter counts it: a field with a selection set is one more than its
    deepest subfield, a leaf 0; introspection fields count 0 (graphql-core's MaxIntrospectionDepthRule
    bounds them). Aliases count once per place they are selected: a fragment spread twice counts twice.
    The recursion is as deep as the document nests, which graphql-core's validation bounds (200 levels)
    before the rule runs (``enter_operation_definition``).
    """

    def __init__(self, fragments: Mapping[str, FragmentDefinitionNode]) -> None:
        self._fragments = fragments
        self._known: dict[str, tuple[int, int]] = {}

    def of(self, selections: SelectionSetNode) -> tuple[int, int]:
        """Return the aliases in selections and their depth."""
        aliases = depth = 0
        for selection in selections.selections:
            if isinstance(selection, FieldNode):
                inner, below = self._field(selection)
                aliases += inner + (selection.alias is not None)
            elif isinstance(selection, InlineFragmentNode):
                inner, below = self.of(selection.selection_set)
                aliases += inner
            elif isinstance(selection, FragmentSpreadNode):
                inner, below = self._fragment(selection.name.value)
                aliases += inner
            depth = max(depth, below)
        return aliases, depth

    def _field(self, field: FieldNode) -> tuple[int, int]:
        if field.selection_set is None:
            return 0, 0
        aliases, depth = self.of(field.selection_set)
        return aliases, 0 if field.name.value.startswith("__") else depth + 1

    def _fragment(self, name: str) -> tuple[int, int]:
        known = self._known.get(name)
        if known is not None:
            return known
        fragment = self._fragments.get(name)
        self._known[name] = (0, 0)  # unknown or cyclic: other rules report it
        if fragment is not None:
            self._known[name] = self.of(fragment.selection_set)
        return self._known[name]


def _shape_rule(max_aliases: int, max_depth: int) -> type[ValidationRule]:
    class DocumentShape(ValidationRule):
        """Refuse documents of more aliased fields than the limit, or an operation nested deeper than it."""

        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            definitions: Any = context.document.definitions
            self.shape = _Shape({d.name.value: d for d in definitions if isinstance(d, FragmentDefinitionNode)})
            self.aliases = 0
            self.depth = 0

        def enter_operation_definition(self, node: Any, *_: Any) -> None:
            aliases, depth = self.shape.of(node.selection_set)
            self.aliases += aliases
            self.depth = max(self.depth, depth)

        def leave_document(self, *_: Any) -> None:
            if self.aliases > max_aliases:
                self.report_error(limit_exceeded("aliases in one document", max_aliases, self.aliases))
            if self.depth > max_depth:
                self.report_error(limit_exceeded("query depth (nested selections)", max_depth, self.depth))

    return DocumentShape


class _BoundedMerging(OverlappingFieldsCanBeMergedRule):
    """graphql-core's rule that fields of one response name can merge, within MERGE_BUDGET comparisons."""

    def __init__(self, context: ValidationContext) -> None:
        super().__init__(context)
        self.rule_context.remaining_complexity_budget = MERGE_BUDGET


def bounded(rules: Iterable[type[ASTValidationRule]]) -> tuple[type[ASTValidationRule], ...]:
    """Return rules (graphql-core's specified rules, say) with the merging rule's budget bounded."""
    return tuple(_BoundedMerging if rule is OverlappingFieldsCanBeMergedRule else rule for rule in rules)


class CacheInfo(NamedTuple):
    """What a DocumentCache holds and how often it answered (as functools' cache_info)."""

    hits: int
    misses: int
    entries: int
    chars: int


class DocumentCache(Generic[V]):
    """Values made from documents (a parse, a validation, a plan) by key, the most recently used kept.

    Bounded by entries and by characters of document text together; a document over max_chars is made
    each time and never kept. A value that cannot be made (the maker raises) is not kept either.
    """

    def __init__(self, entries: int, chars: int = CACHED_CHARS, max_chars: int = CACHED_DOCUMENT_CHARS) -> None:
        self.entries = entries
        self.chars = chars
        self.max_chars = max_chars
        self._kept: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._chars = 0
        self._hits = self._misses = 0

    def get(self, key: Hashable, size: int, make: Callable[[], V]) -> V:
        """Return the value of key (a document of size characters), made by make() unless kept."""
        found = self._kept.get(key)
        if found is not None:
            self._hits += 1
            self._kept.move_to_end(key)
            return found[0]
        self._misses += 1
        value = make()
        if size <= self.max_chars:
            self._kept[key] = (value, size)
            self._chars += size
            while len(self._kept) > self.entries or self._chars > self.chars:
                _, (_, dropped) = self._kept.popitem(last=False)
                self._chars -= dropped
        return value

    def find(self, key: Hashable) -> V | None:
        """Return the value kept for key (now the most recently used), or None."""
        found = self._kept.get(key)
        if found is None:
            return None
        self._kept.move_to_end(key)
        return found[0]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._kept

    def cache_info(self) -> CacheInfo:
        """Return the hits, misses, entries and characters kept."""
        return CacheInfo(self._hits, self._misses, len(self._kept), self._chars)


class DocumentChecks:
    """How one schema's Strawberry path parses and validates documents: within the limits, cached, bounded.

    ``extensions()`` are the schema's extensions doing it (in place of strawberry's ParserCache,
    ValidationCache, AddValidationRules and MaxTokensLimiter, which keep documents by count only).
    """

    def __init__(self, limits: Limits, entries: int, rules: Collection[type[ASTValidationRule]] = ()) -> None:
        self.max_tokens = limits.max_tokens
        self.rules: tuple[type[ASTValidationRule], ...] = (*limits.validation_rules(), *rules)  # made once
        #: what a request's document is validated with when no other extension adds rules: graphql-core's
        #: (the merging one bounded), then these (the Strawberry path's ``context.validation_rules``)
        self.validation_rules: tuple[type[ASTValidationRule], ...] = (*bounded(specified_rules), *self.rules)
        self.parsed: DocumentCache[DocumentNode] = DocumentCache(entries)
        self.validated: DocumentCache[list[GraphQLError]] = DocumentCache(entries)

    def parse(self, query: str, options: Mapping[str, Any] | None = None) -> DocumentNode:
        """Return the document of query, parsed up to max_tokens (GraphQLSyntaxError past them)."""
        return self.parsed.get(
            query, len(query), lambda: parse(query, **{**(options or {}), "max_tokens": self.max_tokens})
        )

    def validate(
        self,
        schema: GraphQLSchema,
        query: str,
        document: DocumentNode,
        rules: tuple[type[ASTValidationRule], ...] | None = None,
    ) -> list[GraphQLError]:
        """Return the validation errors of query's document (rules: validation_rules), as Strawberry validates it.

        Cached by the text alone: a schema's rules are the same for every request, so the compiled plans
        (schema.compiled) and the Strawberry path share one validation of each document, as they share its parse.
        """
        chosen = self.validation_rules if rules is None else rules
        return self.validated.get(query, len(query), lambda: validate_document(schema, document, chosen))

    def extensions(self) -> list[Callable[[], Any]]:
        """Return the factories of the extensions parsing and validating each request's document."""
        return [lambda: _CheckedParse(self), lambda: _CheckedValidation(self)]


class _CheckedParse(ParserCache):
    """Parse a request's document with DocumentChecks (its cache is ``cached_parse_document``)."""

    def __init__(self, checks: DocumentChecks) -> None:
        self.checks = checks
        self.cached_parse_document = checks.parsed  # type: ignore[assignment]

    def on_operation(self) -> Iterator[None]:
        context = self.execution_context
        context.validation_rules = (*bounded(context.validation_rules), *self.checks.rules)
        yield

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        if context.query is not None:
            context.graphql_document = self.checks.parse(context.query, context.parse_options)
        yield


class _CheckedValidation(ValidationCache):
    """Validate a request's document with its rules, cached by the document's text (``cached_validate_document``).

    A schema's rules are the same for every request (DocumentChecks', and its other extensions'), so the
    text alone is the key.
    """

    def __init__(self, checks: DocumentChecks) -> None:
        self.checks = checks
        self.cached_validate_document = checks.validated  # type: ignore[assignment]

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        query, document = context.query or "", context.graphql_document
        if document is not None:
            rules = tuple(context.validation_rules)
            context.pre_execution_errors = self.checks.validate(context.schema._schema, query, document, rules)
        yield
