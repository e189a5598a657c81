"""Moved to tests.support.spark_cluster; bench/ still imports this path (drop this file once bench/ imports
tests.support)."""

from tests.support.spark_cluster import StandaloneCluster

__all__ = ["StandaloneCluster"]
