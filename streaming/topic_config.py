"""What a topic's configuration means to its stores: how long Kafka keeps a compacted topic's tombstones.

A table topic is compacted: the log cleaner keeps the latest record per key, and removes a tombstone (a key's
delete) ``delete.retention.ms`` after it first cleaned it. A copy that stopped applying longer ago than that may
have missed deletes for good — reading on from its offset would keep deleted keys forever — so the runner
rebuilds such a table partition from the earliest offset (the compacted topic is the table; see
``streaming.runner``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

log = logging.getLogger(__name__)


def tombstone_retention_s(config: Mapping[str, str], topic: str, timeout: float = 10.0) -> float | None:
    """Return how long a compacted topic keeps its tombstones, in seconds (None: not compacted, or unknown)."""
    admin = AdminClient(dict(config), logger=log)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout=timeout)
    except KafkaException as exc:
        log.warning("cannot read the configuration of topic %s (%s): tombstones are assumed kept", topic, exc)
        return None
    policy = entries.get("cleanup.policy")
    retention = entries.get("delete.retention.ms")
    if policy is None or "compact" not in str(policy.value) or retention is None or retention.value is None:
        return None
    return int(retention.value) / 1000
