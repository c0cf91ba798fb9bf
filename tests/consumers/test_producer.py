"""consumers.producer: which produce errors are permanent (no broker: kafka-python's error
classes), and the defaults every producer of the project starts from."""

from __future__ import annotations

import kafka.errors as kerrors
import pytest

from consumers.producer import PRODUCER_DEFAULTS, is_permanent
from streamer.input.deadletter import DeadLetterBacklogFull


def test_every_producer_waits_for_all_replicas_and_is_not_idempotent() -> None:
    assert PRODUCER_DEFAULTS == {"acks": "all", "enable_idempotence": False}


@pytest.mark.parametrize(
    "exc",
    [
        kerrors.MessageSizeTooLargeError(),
        kerrors.RecordListTooLargeError(),
        kerrors.InvalidRecordError(),
        kerrors.CorruptRecordError(),
        kerrors.InvalidTopicError(),  # any other non-retriable error response
        kerrors.UnknownError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_about_the_letter_are_permanent(exc: BaseException) -> None:
    assert is_permanent(exc)


@pytest.mark.parametrize(
    "exc",
    [
        kerrors.KafkaTimeoutError(),  # no metadata within max_block_ms, a delivery timeout
        kerrors.UnknownTopicOrPartitionError(),  # the topic deleted
        kerrors.NotLeaderForPartitionError(),
        kerrors.RequestTimedOutError(),
        kerrors.NotEnoughReplicasError(),
        kerrors.KafkaConnectionError(),
        kerrors.IllegalStateError("Producer is closed forcefully."),  # a renewed producer
        kerrors.TopicAuthorizationFailedError(),  # an ACL is granted at run time
        kerrors.ClusterAuthorizationFailedError(),
        kerrors.SaslAuthenticationFailedError(),
        DeadLetterBacklogFull("full"),
        RuntimeError("no dead-letter producer (broker unreachable?)"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_about_the_broker_or_the_topic_are_retried(exc: BaseException) -> None:
    assert not is_permanent(exc)
