"""Moved to tests.support.nodes; bench/ still imports this path (drop this file once bench/ imports tests.support)."""

from tests.support.nodes import NodeProcess, Scrape, start_node, start_nodes, wait_ready, write_app_module

__all__ = ["NodeProcess", "Scrape", "start_node", "start_nodes", "wait_ready", "write_app_module"]
