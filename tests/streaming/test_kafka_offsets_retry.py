"""KafkaOffsets through a leader move: retriable answers are asked again after fresh metadata, within the timeout.

A fake AdminClient plays what librdkafka answered while a 3-broker cluster lost and got back a partition's leader
(tests/e2e/test_kafka_broker_loss.py runs the real thing): FENCED_LEADER_EPOCH, offset -1001 without an error,
LEADER_NOT_AVAILABLE in the metadata. Everything else (the retry loop, backoff, deadline) is the real code.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ClusterMetadata, ListOffsetsResultInfo, PartitionMetadata, TopicMetadata

from iqgraph.streaming.kafka_offsets import ATTEMPT_TIMEOUT_S, FIRST_BACKOFF_S, KafkaOffsets, KafkaSourceError

TOPIC = "orders"
#: One scripted ListOffsets answer: partition -> its offset, or the error its future raises.
Answer = Mapping[int, int | KafkaError]


class FakeAdmin:
    """An AdminClient's list_offsets and list_topics answering from scripts; the last answer repeats."""

    def __init__(self, offsets: list[Answer], topics: list[KafkaError | None] | None = None) -> None:
        self.offsets = offsets
        self.topics = topics or [None]
        self.asked: list[list[int]] = []  # the partitions of each ListOffsets request
        self.timeouts: list[float] = []  # each ListOffsets request's timeout
        self.metadata_requests = 0

    def list_offsets(self, request: Mapping[TopicPartition, Any], **kwargs: Any) -> dict[TopicPartition, Future[Any]]:
        answer = self.offsets[min(len(self.asked), len(self.offsets) - 1)]
        self.asked.append(sorted(tp.partition for tp in request))
        self.timeouts.append(kwargs["request_timeout"])
        futures: dict[TopicPartition, Future[Any]] = {}
        for tp in request:
            future: Future[Any] = Future()
            said = answer[tp.partition]
            if isinstance(said, KafkaError):
                future.set_exception(KafkaException(said))
            else:
                future.set_result(ListOffsetsResultInfo(said, -1, -1))
            futures[tp] = future
        return futures

    def list_topics(self, topic: str, timeout: float) -> ClusterMetadata:
        error = self.topics[min(self.metadata_requests, len(self.topics) - 1)]
        self.metadata_requests += 1
        metadata, described = ClusterMetadata(), TopicMetadata()
        described.topic, described.error = topic, error
        described.partitions = {} if error is not None else {p: PartitionMetadata() for p in (2, 0, 1)}
        metadata.topics = {topic: described}
        return metadata


def offsets(admin: FakeAdmin, timeout: float = 5.0, sleeps: list[float] | None = None) -> KafkaOffsets:
    """Return a KafkaOffsets over admin, its backoffs noted in sleeps (and not slept)."""
    noted = sleeps if sleeps is not None else []
    return KafkaOffsets({}, TOPIC, timeout, admin=lambda _config: admin, sleep=noted.append)


FENCED = KafkaError(KafkaError.FENCED_LEADER_EPOCH)


def test_a_fenced_leader_epoch_is_asked_again_for_that_partition_after_fresh_metadata() -> None:
    admin = FakeAdmin([{0: FENCED, 1: 20, 2: 30}, {0: 10}])

    assert offsets(admin).latest([0, 1, 2]) == {0: 10, 1: 20, 2: 30}
    assert admin.asked == [[0, 1, 2], [0]]
    assert admin.metadata_requests == 1  # librdkafka keeps the fresh leaders and epochs for the next request


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
        KafkaError._NOENT,  # "No leaders found": librdkafka's cached metadata, from a whole cluster's outage
    ],
)
def test_errors_of_a_leader_move_are_retried(code: int) -> None:
    admin = FakeAdmin([{0: KafkaError(code), 1: KafkaError(code)}, {0: 10, 1: KafkaError(code)}, {1: 20}])

    assert offsets(admin).earliest([0, 1]) == {0: 10, 1: 20}
    assert admin.asked == [[0, 1], [0, 1], [1]]


def test_no_offset_without_an_error_is_a_gone_leader_and_asked_again() -> None:
    # what librdkafka answered for the killed leader's partition until its metadata was refreshed
    admin = FakeAdmin([{0: OFFSET_INVALID, 1: 20}, {0: 10}])

    assert offsets(admin).latest([0, 1]) == {0: 10, 1: 20}
    assert admin.metadata_requests == 1


def test_backoff_doubles_and_each_request_is_short() -> None:
    sleeps: list[float] = []
    admin = FakeAdmin([{0: FENCED}] * 5 + [{0: 7}])

    assert offsets(admin, timeout=30, sleeps=sleeps).latest([0]) == {0: 7}
    assert sleeps == [FIRST_BACKOFF_S * 2**n for n in range(5)]
    assert all(0 < timeout <= ATTEMPT_TIMEOUT_S for timeout in admin.timeouts)


def test_a_retriable_error_past_the_timeout_raises_saying_which() -> None:
    admin = FakeAdmin([{0: 1, 1: FENCED}])
    client = KafkaOffsets({}, TOPIC, 0.5, admin=lambda _config: admin)
    began = time.monotonic()

    with pytest.raises(KafkaSourceError, match=r"offsets of 'orders' \[1\]: .*FENCED_LEADER_EPOCH"):
        client.latest([0, 1])

    assert time.monotonic() - began < 0.5 + 0.2
    assert len(admin.asked) > 2 and all(asked == [1] for asked in admin.asked[1:])


def test_an_error_that_no_retry_mends_raises_at_once() -> None:
    admin = FakeAdmin([{0: FENCED, 1: KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)}])

    with pytest.raises(KafkaSourceError, match="TOPIC_AUTHORIZATION_FAILED"):
        offsets(admin).latest([0, 1])

    assert len(admin.asked) == 1


def test_partitions_wait_out_a_leaderless_topic_but_not_a_missing_one() -> None:
    leaderless = FakeAdmin([], topics=[KafkaError(KafkaError.LEADER_NOT_AVAILABLE), None])
    missing = FakeAdmin([], topics=[KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), None])

    assert offsets(leaderless).partitions() == (0, 1, 2)
    with pytest.raises(KafkaSourceError, match="UNKNOWN_TOPIC_OR_PART"):
        offsets(missing).partitions()
    assert missing.metadata_requests == 1
