"""Live subscriptions: a watch following keys wherever their partitions are served, the local change feed's
followers, the relays multiplexing a peer's upstream, the stream endpoints, the values sent, and store changes.
"""
