"""The consumer group's rebalance protocol: classic (JoinGroup/SyncGroup) or KIP-848's consumer protocol.

Both give the same thing to ``GroupMembership``: partitions assigned by the range assignor (partition p of every
input topic on the same member, which joins need) and a number that orders the claims.

- **classic** (the default): the client's range assignor, a leader member computing the assignment, eager
  rebalances; the session timeout and heartbeat interval are the client's settings.
- **consumer** (KIP-848, Kafka 4.0+ brokers; ``group.coordinator.rebalance.protocols`` must include
  ``consumer``, as it does by default): the broker's range assignor (``group.remote.assignor``), incremental
  assignments, no stop-the-world rebalance. librdkafka refuses ``partition.assignment.strategy``,
  ``session.timeout.ms`` and ``heartbeat.interval.ms`` with it ("defined broker side"): the session timeout
  and heartbeat interval are the group's dynamic configs ``consumer.session.timeout.ms`` and
  ``consumer.heartbeat.interval.ms``, set by ``configure_group`` before joining, within the broker's
  ``group.consumer.min.*`` / ``max.*`` bounds (defaults: session 45–60 s, heartbeat 5–15 s).

The number ordering claims is librdkafka's ``generation_id`` in the serialized group metadata: the group
generation under classic, the member epoch under consumer. A member epoch is the target assignment epoch the
member has reconciled to, and a partition reaches a new owner only under a new target assignment (after its
previous owner released it): the new claim always carries a higher number than the previous one.
"""

from __future__ import annotations

import logging
import struct
from typing import Final

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from iqgraph.stores import UserError

__all__ = [
    "CLASSIC",
    "CONSUMER",
    "GROUP_PROTOCOLS",
    "GroupConfigError",
    "configure_group",
    "group_consumer_config",
    "group_generation",
    "heartbeat_interval_ms",
    "is_incremental",
]

log = logging.getLogger(__name__)

CLASSIC: Final = "classic"
CONSUMER: Final = "consumer"
GROUP_PROTOCOLS: Final = (CLASSIC, CONSUMER)

_CGMD_MAGIC = b"CGMDv2:"  # librdkafka's serialized group metadata: magic, then the generation as a native int32
_Config = dict[str, str | int | float | bool]


class GroupConfigError(UserError, RuntimeError):
    """The broker refused the group's session timeout or heartbeat interval (out of its bounds)."""


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """Return the heartbeat interval for a session timeout: well below it, so a late heartbeat or two is harmless."""
    return max(session_timeout_ms // 5, 100)


def is_incremental(protocol: str, strategy: str) -> bool:
    """Return whether the rebalance callbacks get only the added and removed partitions (not the whole set)."""
    return protocol == CONSUMER or "cooperative" in strategy


def group_consumer_config(protocol: str, strategy: str, session_timeout_ms: int) -> _Config:
    """Return the group consumer's protocol settings: the assignor, and under classic its session and heartbeat."""
    if protocol == CONSUMER:
        return {"group.protocol": CONSUMER, "group.remote.assignor": strategy}
    return {
        "partition.assignment.strategy": strategy,
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": heartbeat_interval_ms(session_timeout_ms),
    }


def configure_group(admin: AdminClient, group_id: str, session_timeout_ms: int) -> None:
    """Set the consumer-protocol group's session timeout and heartbeat interval on the broker (KIP-848 configs).

    Raises GroupConfigError when the broker refuses the values (out of its bounds); when it cannot set them for
    another reason (no ALTER_CONFIGS right on the group, say) it logs why and the broker's own apply.
    """
    values = {
        "consumer.session.timeout.ms": str(session_timeout_ms),
        "consumer.heartbeat.interval.ms": str(heartbeat_interval_ms(session_timeout_ms)),
    }
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in values.items()]
    resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=entries)
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout=10)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() == KafkaError.INVALID_CONFIG:
            raise GroupConfigError(
                f"the broker refuses consumer group {group_id!r} a session timeout of {session_timeout_ms} ms "
                f"({error.str()}): set --group-session-timeout-ms within the broker's bounds, or lower "
                "group.consumer.min.session.timeout.ms / group.consumer.min.heartbeat.interval.ms on the brokers"
            ) from exc
        log.warning(
            "consumer group %s keeps the broker's session timeout: %s (%s)", group_id, error.str(), error.name()
        )


def group_generation(consumer: Consumer) -> int | None:
    """Return the generation (classic) or member epoch (consumer) of consumer's current assignment.

    Read from librdkafka's serialized group metadata; None if the format is not librdkafka's.
    """
    blob = consumer.consumer_group_metadata()
    if isinstance(blob, bytes) and blob.startswith(_CGMD_MAGIC) and len(blob) >= len(_CGMD_MAGIC) + 4:
        return int(struct.unpack_from("=i", blob, len(_CGMD_MAGIC))[0])
    return None
