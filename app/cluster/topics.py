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
from iqgraph.streaming.kafka_access import KafkaAccessError, app_needs, check_access
from iqgraph.streaming.kafka_offsets import KafkaOffsets, KafkaSourceError

log = logging.getLogger(__name__)


class TopicCreationError(UserError, RuntimeError):
    """Kafka refused to create a topic, or could not be reached; the message says which."""


class TopicCheckError(UserError, RuntimeError):
    """A topic cannot be read, or has another partition count than the app declares; the message says what to do."""


def check_topics(config: Mapping[str, str], app: App, bootstrap_servers: str) -> dict[str, list[int]]:
    """Return every topic's partitions; raise TopicCheckError if Kafka or a topic is not as declared."""
    found: dict[str, list[int]] = {}
    for topic in app.topics:
        try:
            offsets = KafkaOffsets({**config, "socket.connection.setup.timeout.ms": "5000"}, topic.name, timeout=5)
            partitions = list(offsets.partitions())
        except KafkaSourceError as exc:
            raise TopicCheckError(
                f"cannot read topic {topic.name!r} from Kafka at {bootstrap_servers}: {exc}. "
                "Check --bootstrap-servers and that the topic exists."
            ) from None
        if len(partitions) != topic.partitions:
            raise TopicCheckError(
                f"topic {topic.name!r} has {len(partitions)} partitions but the app declares {topic.partitions}; "
                "routing needs the real count: fix Topic(partitions=…) in the app. If the topic grew after "
                "records were produced, a key's records are split between two partitions: produce them into a "
                "new topic with the count you want and start on new state directories"
            )
        found[topic.name] = partitions
    return found


def check_kafka_access(config: Mapping[str, str], app: App, changelog: bool, group_id: str | None) -> None:
    """Raise TopicCheckError (one line naming what to grant) when Kafka refuses the login or a right a node needs
    (``streaming.kafka_access``); an unreachable Kafka is left to `check_topics` to say."""
    try:
        check_access(config, app_needs(app, changelog=changelog, group_id=group_id), timeout=5)
    except KafkaAccessError as exc:
        raise TopicCheckError(str(exc)) from None


def create_app_topics(config: Mapping[str, str], app: App, changelogs_only: bool = False) -> list[str]:
    """Create the app's missing topics (or only its changelog topics); return a line per topic created."""
    create = create_changelog_topics if changelogs_only else create_topics
    kind = "changelog topic" if changelogs_only else "topic"
    return [f"created {kind} {name} ({partitions} partitions)" for name, partitions in create(config, app).items()]


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
