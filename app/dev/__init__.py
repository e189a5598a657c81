"""Development: ``iqgraph dev`` (broker, topics, feed and nodes in one command), the producer, data files,
and the example query printed at start.
"""
