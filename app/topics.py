"""Create an app's missing input topics (``iqgraph serve --create-topics`` and ``iqgraph dev``).

Production topics are provisioned by their owners, so serving does not create them unless asked. A topic
another node created first counts as present; a topic that exists with another partition count is left
alone (the node's start check names it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from iqgraph.streaming.definitions import App

log = logging.getLogger(__name__)


class TopicCreationError(RuntimeError):
    """Kafka refused to create a topic, or could not be reached; the message says which."""


def missing_topics(admin: AdminClient, app: App, timeout: float) -> list[NewTopic]:
    """Return the app's topics that Kafka does not have yet, as topics to create."""
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise TopicCreationError(f"cannot list topics: {exc}") from None
    # -1: the broker's default replication factor (production clusters set it; the embedded broker has one node)
    return [NewTopic(t.name, num_partitions=t.partitions) for t in app.topics if t.name not in existing]


def create_topics(config: Mapping[str, str], app: App, timeout: float = 10.0) -> list[str]:
    """Create the app's input topics that are missing, with their declared partition counts; return their names."""
    admin = AdminClient(dict(config), logger=log)
    wanted = missing_topics(admin, app, timeout)
    if not wanted:
        return []
    futures = admin.create_topics(wanted, operation_timeout=timeout, request_timeout=timeout)
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another node won the race: fine
                raise TopicCreationError(f"cannot create topic {name!r}: {exc.args[0].str()}") from None
    return created
