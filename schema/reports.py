"""What a cluster query reports beside its data: standby answers' lag, and partitions left out.

A StoreQueries may keep, per request, ``staleness`` (answers a standby gave: store, partition, node,
lag) and ``partial`` (scans that could not reach some partitions). Staleness goes to the response's
``extensions.staleness``; each partial scan becomes an error with code PARTIAL_RESULT naming the missing
partitions, next to the data that was found — never a silent gap.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

PARTIAL_RESULT = "PARTIAL_RESULT"


def _queries(extension: SchemaExtension) -> Any:
    return getattr(extension.execution_context.context, "queries", None)


class ClusterReports(SchemaExtension):
    """Add staleness to the response extensions and partial scans to its errors."""

    def on_execute(self) -> Iterator[None]:
        """After execution, turn partial scans into PARTIAL_RESULT errors."""
        yield
        partial = getattr(_queries(self), "partial", None)
        result = self.execution_context.result
        if not partial or result is None:
            return
        errors = list(result.errors or [])
        for report in partial:
            message = f"store {report['store']}: partitions {report['missingPartitions']} are missing from this page"
            errors.append(GraphQLError(message, extensions={"code": PARTIAL_RESULT, **report}))
        result.errors = errors

    def get_results(self) -> dict[str, Any]:
        """Return the staleness report, if any answer came from a standby."""
        staleness = getattr(_queries(self), "staleness", None)
        return {"staleness": staleness} if staleness else {}
