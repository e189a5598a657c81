"""What a request reports beside its data: standby answers' lag, positions read, partitions left out.

Each request has one ``Reports`` (a field of the request context, made before execution): the store
queries write into it as they read, and ``ClusterReports`` turns it into the response:

- ``extensions.staleness``: each answer a standby gave (store, partition, node, lag), and each a node gave while
  it could not reach Kafka (with ``kafkaUnreachableSinceSeconds``: the last state it knew);
- ``extensions.positions`` (when the request asks, ``"extensions": {"positions": true}``): per topic and
  partition, the applied offset of the data read — the lowest, if several reads of one request saw a
  partition at different offsets — so a client can check that its own write is included (read your
  writes: the position is at least the write's offset + 1);
- a PARTIAL_RESULT error per scan that could not reach some partitions, naming them — never a silent gap.

The request's own default staleness bound comes from ``"extensions": {"maxLag": N}`` (a store field's
``maxLag`` argument wins); without either, the node's ``--max-lag``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

from iqgraph.schema.errors import PARTIAL_RESULT, ApiError, invalid_argument

if TYPE_CHECKING:
    from iqgraph.schema.context import Context


@dataclass
class Reports:
    """What one request's reads report: staleness, positions, partial scans; and its default bound."""

    max_lag: int | None = None
    want_positions: bool = False
    invalid: Exception | None = None  # a bad option: every store read of the request fails with it
    staleness: list[dict[str, Any]] = field(default_factory=list)
    partial: list[dict[str, Any]] = field(default_factory=list)
    positions: dict[str, dict[str, int]] = field(default_factory=dict)

    def stale(self, store: str, partition: int, node: str, lag: int, kafka_away_since: float | None = None) -> None:
        """Record that a standby answered for store's partition, lag records behind; or any copy whose node has
        not reached Kafka since kafka_away_since (unix time): the last state it knew, lag as of its last end
        offsets."""
        entry: dict[str, Any] = {"store": store, "partition": partition, "node": node, "lag": lag}
        if kafka_away_since is not None:
            entry["kafkaUnreachableSinceSeconds"] = kafka_away_since
        if entry not in self.staleness:
            self.staleness.append(entry)

    def read_at(self, topic: str, partition: int, offset: int) -> None:
        """Record that topic-partition was read at offset (the lowest of a request's reads stays)."""
        seen = self.positions.setdefault(topic, {})
        key = str(partition)
        seen[key] = min(offset, seen.get(key, offset))

    def extensions(self) -> dict[str, Any]:
        """Return what goes to a response's extensions: staleness (if a standby answered), positions (if asked)."""
        found: dict[str, Any] = {}
        if self.staleness:
            found["staleness"] = sorted(self.staleness, key=lambda e: (e["store"], e["partition"], e["node"]))
        if self.want_positions:  # in topic and partition order, whatever order the reads happened in
            found["positions"] = {
                topic: dict(sorted(seen.items(), key=lambda item: int(item[0])))
                for topic, seen in sorted(self.positions.items())
            }
        return found

    def missing(self, store: str, partitions: dict[int, str]) -> None:
        """Record that a scan of store left out partitions (partition -> reason)."""
        self.partial.append(
            {"store": store, "missingPartitions": sorted(partitions), "reasons": sorted(set(partitions.values()))}
        )


def request_options(extensions: Any) -> Reports:
    """Return the Reports of a request whose GraphQL ``extensions`` may set maxLag and positions."""
    if not isinstance(extensions, dict):
        return Reports()
    bound = extensions.get("maxLag")
    if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
        raise invalid_argument("extensions.maxLag", f"must be a whole number of records >= 0, got {bound!r}")
    return Reports(max_lag=bound, want_positions=extensions.get("positions") is True)


def apply_request_options(context: Context, extensions: Any) -> None:
    """Set the request's default bound and positions wish from its extensions (a bad option fails every read)."""
    try:
        options = request_options(extensions)
    except ApiError as exc:
        context.reports.invalid = exc
    else:
        context.reports.max_lag = options.max_lag
        context.reports.want_positions = options.want_positions


def partial_errors(reports: Reports) -> list[GraphQLError]:
    """Return one PARTIAL_RESULT error per scan that left partitions out."""
    return [
        GraphQLError(
            f"store {report['store']}: partitions {report['missingPartitions']} are missing from this page",
            extensions={"code": PARTIAL_RESULT, **report},
        )
        for report in reports.partial
    ]


def _context(extension: SchemaExtension) -> Context | None:
    from iqgraph.schema.context import Context

    context = extension.execution_context.context
    return context if isinstance(context, Context) else None


class ClusterReports(SchemaExtension):
    """Read the request's options from its extensions; add staleness, positions and partial scans after."""

    def on_operation(self) -> Iterator[None]:
        """Before execution, read maxLag and positions from the request's extensions."""
        context = _context(self)
        if context is not None:
            apply_request_options(context, self.execution_context.operation_extensions)
        yield

    def on_execute(self) -> Iterator[None]:
        """After execution, turn partial scans into PARTIAL_RESULT errors."""
        yield
        context = _context(self)
        result = self.execution_context.result
        if context is None or not context.reports.partial or result is None:
            return
        result.errors = [*(result.errors or []), *partial_errors(context.reports)]

    def get_results(self) -> dict[str, Any]:
        """Return the staleness report (if a standby answered) and the positions (if asked)."""
        context = _context(self)
        return {} if context is None else context.reports.extensions()
