"""Development: ``iqgraph dev`` (broker, topics, feed and nodes in one command), the producer, data files,
the example query printed at start, and topic creation.
"""
