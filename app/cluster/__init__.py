"""Cluster: who the members are and what they hold — membership (static or a Kafka group) and the
partition assignment, the peer poller and what it learns of replicas, the one HTTP client to peers, and the
app's Kafka topics (created when asked, watched for end offsets and the partitioner).
"""
