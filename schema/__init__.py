"""iqgraph.schema."""
