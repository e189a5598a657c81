"""What a field's selection asks for: its subfields, with their arguments coerced.

A resolver that reads ahead for its objects (an entity root field reads, for all its keys, the stores its
selection asks, before it returns) is marked with ``reads_ahead``; graphql-core's info and the compiled
executor's both carry what ``subfields`` needs: ``field_nodes``, ``return_type``, ``fragments`` and
``variable_values``. The answer is a hint: a subfield left out (or one under ``@skip``, read anyway) is
still resolved correctly, only later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from graphql import (
    FieldNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLObjectType,
    InlineFragmentNode,
    SelectionSetNode,
    get_named_type,
)
from graphql.execution.values import get_argument_values

F = TypeVar("F", bound=Callable[..., Any])


def reads_ahead(fn: F) -> F:
    """Mark a resolver whose info must tell its selection (the compiled executor gives it one that does)."""
    fn.reads_ahead = True  # type: ignore[attr-defined]
    return fn


def selection_key(info: Any) -> int:
    """Return what identifies the resolved field's place in the document (within one request)."""
    return id(getattr(info, "_raw_info", info).field_nodes[0])


def subfields(info: Any, through: Sequence[str] = ()) -> list[tuple[str, dict[str, Any]]]:
    """Return (name, coerced arguments) of each field selected under the resolved field (under ``through``)."""
    raw = getattr(info, "_raw_info", info)
    fragments: Mapping[str, Any] = raw.fragments
    kind = get_named_type(raw.return_type)
    nodes: list[FieldNode] = list(raw.field_nodes)
    for step in through:
        if not isinstance(kind, GraphQLObjectType) or step not in kind.fields:
            return []
        nodes = [
            sub for node in nodes for sub in selected_fields(node.selection_set, fragments) if sub.name.value == step
        ]
        kind = get_named_type(kind.fields[step].type)
    if not isinstance(kind, GraphQLObjectType):
        return []
    found: list[tuple[str, dict[str, Any]]] = []
    for sub in (sub for node in nodes for sub in selected_fields(node.selection_set, fragments)):
        definition = kind.fields.get(sub.name.value)
        if definition is None:  # __typename
            continue
        try:
            args = get_argument_values(definition, sub, raw.variable_values) if definition.args else {}
        except GraphQLError:  # validation refuses such a document; nothing to read ahead for it
            continue
        found.append((sub.name.value, args))
    return found


def selected_fields(
    selection_set: SelectionSetNode | None, fragments: Mapping[str, Any], seen: set[str] | None = None
) -> Iterator[FieldNode]:
    """Yield the fields of a selection set, through inline fragments and fragment spreads (each spread once)."""
    if selection_set is None:
        return
    seen = set() if seen is None else seen
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            yield selection
        elif isinstance(selection, InlineFragmentNode):
            yield from selected_fields(selection.selection_set, fragments, seen)
        elif isinstance(selection, FragmentSpreadNode) and selection.name.value not in seen:
            seen.add(selection.name.value)
            fragment = fragments.get(selection.name.value)
            if fragment is not None:
                yield from selected_fields(getattr(fragment, "selection_set", None), fragments, seen)
