"""Request limits: keys per multi-key field, page sizes, aliases per document.

The schema has no cycles, so query depth is bounded by the schema itself; what can blow a request up
is width: many keys, large pages, or one field repeated under many aliases. Each limit breaks with a
LIMIT_EXCEEDED error that names the limit and the amount requested.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

from graphql import FragmentDefinitionNode, OperationDefinitionNode, ValidationContext, ValidationRule
from strawberry.extensions.max_aliases import count_fields_with_alias

from iqgraph.schema.errors import ApiError, invalid_argument, limit_exceeded


@dataclass(frozen=True)
class Limits:
    """The limits of one schema."""

    max_keys: int = 1_000  # keys in one getMany / mightContainMany
    max_page_size: int = 1_000  # `first` of a connection
    default_page_size: int = 100  # `first` when the query leaves it out
    max_aliases: int = 100  # aliased fields in one document

    def __post_init__(self) -> None:
        for name in ("max_keys", "max_page_size", "default_page_size", "max_aliases"):
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
        """Return a validation rule that refuses documents with more than max_aliases aliases."""
        return _alias_rule(self.max_aliases)


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
