"""iqgraph.streaming."""
