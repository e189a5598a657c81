"""Moved to tests.support.queries; bench/ still imports this path (drop this file once bench/ imports tests.support)."""

from tests.support.queries import single_node

__all__ = ["single_node"]
