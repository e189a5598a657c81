"""The membership a node's settings ask for: Kafka's consumer group (``--membership kafka``) or a static peer list."""

from __future__ import annotations

from collections.abc import Callable

from iqgraph.app.cluster.membership import Member, Membership, StaticMembership, parse_peers
from iqgraph.app.settings import Settings
from iqgraph.streaming.definitions import App

#: The state and lag of every hosted partition, as the group's members tell each other (GroupMembership).
Replicas = Callable[[], dict[tuple[str, int], tuple[str, int | None]]]


def membership_for(settings: Settings, app: App, bootstrap_servers: str, replicas: Replicas) -> Membership:
    """Return the membership settings ask for; ValueError (one line) for peers that cannot be parsed."""
    partitions = {t.name: t.partitions for t in app.topics if not t.global_table}
    global_topics = {t.name: t.partitions for t in app.topics if t.global_table}
    if settings.membership == "kafka":
        from iqgraph.app.cluster.group_membership import GroupMembership

        return GroupMembership(
            settings.node_id,
            settings.url,
            app.name,
            partitions,
            bootstrap_servers,
            kafka_config={**app.kafka.config, **settings.kafka},
            standbys=settings.standbys,
            session_timeout_ms=settings.group_session_timeout_ms,
            replicas=replicas,
            global_topics=global_topics,
            group_protocol=settings.group_protocol,
        )
    members = parse_peers(settings.peers) if settings.peers else [Member(settings.node_id, settings.url)]
    return StaticMembership(settings.node_id, members, partitions, settings.standbys, global_topics)
