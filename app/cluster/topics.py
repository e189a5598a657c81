"""Create an app's missing topics, inputs and dead letters (``iqgraph serve --create-topics``, ``iqgraph dev``).

Production topics are provisioned by their owners, so serving does not create them unless asked. A topic
another node created first counts as present; a topic that exists with another partition count is left
alone (the node's start check names it).

The changelog topics (``streaming.changelog``: ``<app>-<topic>-changelog``, compacted, partitioned like their input
topic) belong to the app, as Kafka Streams' do: they are created with the app's topics here and, when missing, at
every node start (``create_changelog_topics``); a refusal is one line naming the topic and the right to grant.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from iqgraph.stores import UserError
from iqgraph.streaming.changelog import ChangelogError, changelog_topics, ensure_changelog_topics
from iqgraph.streaming.definitions import App

log = logging.getLogger(__name__)


class TopicCreationError(UserError, RuntimeError):
    """Kafka refused to create a topic, or could not be reached; the message says which."""


def missing_topics(admin: AdminClient, app: App, timeout: float) -> list[NewTopic]:
    """Return the app's topics that Kafka does not have yet, as topics to create."""
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise TopicCreationError(f"cannot list topics: {exc}") from None
    # -1: the broker's default replication factor (production clusters set it; the embedded broker has one node)
    wanted = [NewTopic(t.name, num_partitions=t.partitions) for t in app.topics if t.name not in existing]
    dead_letters = app.kafka.dead_letter_topic
    if dead_letters is not None and dead_letters not in existing:
        wanted.append(NewTopic(dead_letters, num_partitions=1))
    return wanted + [t for t in changelog_topics(app) if t.topic not in existing]


def create_changelog_topics(config: Mapping[str, str], app: App, timeout: float = 10.0) -> dict[str, int]:
    """Create the app's missing changelog topics; return them. Raise TopicCreationError naming what was refused."""
    try:
        return ensure_changelog_topics(config, app, timeout)
    except ChangelogError as exc:
        raise TopicCreationError(str(exc)) from None


def create_topics(config: Mapping[str, str], app: App, timeout: float = 10.0) -> dict[str, int]:
    """Create the app's missing input topics (declared partition counts) and dead-letter topic; return them."""
    admin = AdminClient(dict(config), logger=log)
    wanted = missing_topics(admin, app, timeout)
    if not wanted:
        return {}
    futures = admin.create_topics(wanted, operation_timeout=timeout, request_timeout=timeout)
    partitions = {t.topic: t.num_partitions for t in wanted}
    created = {}
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created[name] = partitions[name]
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another node won the race: fine
                raise TopicCreationError(f"cannot create topic {name!r}: {exc.args[0].str()}") from None
    return created
