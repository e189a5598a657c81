"""Queries: routing (pure: keys → partitions → serving replicas), the one replica executor, the store
queries every resolver calls, this node's partitions read in place, and the merging of partial states and pages.
"""
