"""Cluster: who the members are and what they hold — membership (static or a Kafka group) and the
partition assignment, the peer poller and what it learns of replicas, and the one HTTP client to peers.
"""
