"""iqgraph.examples."""
