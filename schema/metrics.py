"""GraphQL metrics: requests, latency and errors per root field and store, keys per batched lookup.

The schema does not own a registry: the app makes the metric objects (``app.metrics``) in the node's
registry and hands them to ``build_schema(metrics=...)``, which installs ``MetricsExtension``. Labels
are bounded: a root field is named only after validation (so it is a field of the schema), and a
store label is a store of the schema or "" (a ``store:`` argument naming no store counts as "").

A request with several root fields counts once per root field, each observing the whole request's
duration (timing each root field apart would need a resolver hook on every field, which costs on
every resolved value).
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    GraphQLError,
    StringValueNode,
    VariableNode,
)
from graphql.utilities import get_operation_ast
from strawberry.exceptions import MissingQueryError
from strawberry.extensions import SchemaExtension
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError

from iqgraph.schema.errors import BAD_REQUEST, with_codes
from iqgraph.schema.selection import selected_fields

if TYPE_CHECKING:
    from graphql import DocumentNode
    from prometheus_client import Counter, Histogram

_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,47}")
OTHER_CODE = "OTHER"
#: Raised through the operation and answered by the HTTP layer as a bad request.
_REQUEST_ERRORS = (MissingQueryError, CannotGetOperationTypeError, InvalidOperationTypeError)


def metric_code(code: object) -> str:
    """Return code as a metric label: an UPPER_SNAKE error code, else OTHER (bounded cardinality)."""
    return code if isinstance(code, str) and _CODE.fullmatch(code) else OTHER_CODE


@dataclass(frozen=True)
class GraphQLMetrics:
    """The metric objects the schema observes, with the labels each must have been made with."""

    requests: Counter  # labels: field, store
    duration: Histogram  # labels: field, store (seconds)
    errors: Counter  # labels: code
    keys_per_lookup: Histogram  # labels: store
    # each label set's children, made once (labels() takes a lock and checks the labels on every call)
    _children: dict[tuple[str, str], tuple[Any, Any]] = field(default_factory=dict, compare=False, repr=False)
    _lookups: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def observe_request(
        self,
        labels: Sequence[tuple[str, str]],
        elapsed: float,
        errors: Sequence[GraphQLError],
        bad_request: bool = False,
    ) -> None:
        """Count and time one request per (root field, store) label; count its errors per code.

        bad_request: the request was refused before execution (it counts as one BAD_REQUEST error).
        """
        for label in labels or [("", "")]:
            children = self._children.get(label)
            if children is None:  # bounded: root fields × stores
                children = self._children[label] = (self.requests.labels(*label), self.duration.labels(*label))
            children[0].inc()
            children[1].observe(elapsed)
        codes = [BAD_REQUEST] if bad_request else [(e.extensions or {}).get("code") for e in with_codes(errors)]
        for code in codes:
            self.errors.labels(metric_code(code)).inc()

    def observe_lookup(self, store: str, keys: int) -> None:
        """Record one batched lookup of keys keys in store."""
        child = self._lookups.get(store)
        if child is None:
            child = self._lookups[store] = self.keys_per_lookup.labels(store)
        child.observe(keys)


def root_fields(document: DocumentNode, operation_name: str | None) -> list[FieldNode]:
    """Return the root field nodes of the operation to run (fragments followed), in document order."""
    operation = get_operation_ast(document, operation_name)
    if operation is None:
        return []
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    return list(selected_fields(operation.selection_set, fragments))


class MetricsExtension(SchemaExtension):
    """Count and time each request per root field and store, count its errors per code, size lookups.

    ``store_fields`` maps each store's root field to its store; fields with a ``store`` argument
    (metadata, internal) take the store it names when it is one of ``stores``.
    """

    def __init__(self, metrics: GraphQLMetrics, store_fields: Mapping[str, str], stores: Collection[str]) -> None:
        self.metrics = metrics
        self.store_fields = store_fields
        self.stores = stores
        self._labels: list[tuple[str, str]] = []

    def on_operation(self) -> Iterator[None]:
        """Time the whole request; afterwards count it per root field and its errors per code."""
        self._labels = []
        started = time.perf_counter()
        failure: Exception | None = None
        try:
            yield
        except Exception as exc:  # e.g. a syntax error is raised through the operation: count it, re-raise
            failure = exc
            raise
        finally:
            self._observe(time.perf_counter() - started, failure)

    def _observe(self, elapsed: float, failure: Exception | None) -> None:
        if isinstance(failure, _REQUEST_ERRORS):
            self.metrics.observe_request(self._labels, elapsed, [], bad_request=True)
            return
        if failure is not None:
            error = failure if isinstance(failure, GraphQLError) else GraphQLError(str(failure), original_error=failure)
            errors = [error]
        else:
            result = self.execution_context.result
            errors = list(result.errors or []) if result is not None else []
        self.metrics.observe_request(self._labels, elapsed, errors)

    def on_execute(self) -> Iterator[None]:
        """Name the request's root fields (the document is valid here) and watch its lookups."""
        context = self.execution_context
        document = context.graphql_document
        if document is not None:
            variables = context.variables or {}
            fields = root_fields(document, context.operation_name)
            self._labels = request_labels(fields, variables, self.store_fields, self.stores)
        loaders = getattr(context.context, "loaders", None)
        if loaders is not None:
            loaders.observe = self.metrics.observe_lookup
        yield

    def _store_of(self, field: FieldNode, variables: Mapping[str, Any]) -> str:
        return store_label(field, variables, self.store_fields, self.stores)


def store_label(
    field: FieldNode, variables: Mapping[str, Any], store_fields: Mapping[str, str], stores: Collection[str]
) -> str:
    """Return the store label of a root field: its store, the store its ``store`` argument names, or ""."""
    store = store_fields.get(field.name.value)
    if store is not None:
        return store
    for argument in field.arguments or ():
        if argument.name.value == "store":
            value = argument.value
            if isinstance(value, StringValueNode):
                named: Any = value.value
            elif isinstance(value, VariableNode):
                named = variables.get(value.name.value)
            else:
                named = None
            return named if isinstance(named, str) and named in stores else ""
    return ""


def request_labels(
    fields: Iterable[FieldNode], variables: Mapping[str, Any], store_fields: Mapping[str, str], stores: Collection[str]
) -> list[tuple[str, str]]:
    """Return the (root field, store) labels a request counts under, once each, in document order."""
    return list(dict.fromkeys((f.name.value, store_label(f, variables, store_fields, stores)) for f in fields))
