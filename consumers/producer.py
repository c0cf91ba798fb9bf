"""The producer side of the Kafka adapter: the one place that opens a producer for the
project's writers (the dead-letter writer, the simulator) and says which produce errors are
permanent.

kafka-python is the producer of both (confluent-kafka is a consumer choice only: a writer
sends a few letters, or test data, and one client keeps their settings names one set). Its
quirks live here, not in the writers:

- ``enable_idempotence`` is off: kafka-python 3.0.12's idempotent producer turns any
  non-retriable batch error (a letter too large for the topic) into a fatal state that fails
  every later write of that producer. The writers are at least once anyway (a dead letter
  written twice names the same source offset; the simulator's records are random).
- A topic deleted and created again under its name: kafka-python keeps the old topic's
  metadata (partition leader epochs) and ignores the new one's as stale, so its writes never
  complete. A writer whose write failed makes a new producer (``DeadLetterWriter``).

Importing this module is light: kafka-python is imported when a producer is made or an error
is classified.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRODUCER_DEFAULTS", "is_permanent", "new_producer"]

#: What every producer of the project starts from (a writer's own settings win).
PRODUCER_DEFAULTS: dict[str, Any] = {"acks": "all", "enable_idempotence": False}


def new_producer(**settings: Any) -> Any:
    """A ``kafka.KafkaProducer`` with ``PRODUCER_DEFAULTS`` under ``settings`` (kafka-python's
    names). With ``consumers.clients.kafka_python.connect`` as the factory's caller, a refused
    login or an unreachable broker is a typed error at once."""
    from kafka import KafkaProducer

    return KafkaProducer(**{**PRODUCER_DEFAULTS, **settings})


def is_permanent(exc: BaseException) -> bool:
    """True when writing the same record again can never succeed: the record itself is refused.

    Too large for the topic (``MessageSizeTooLargeError``, raised by the producer's own check
    or by the broker; Java's ``RecordTooLargeException`` is the same error code;
    ``RecordListTooLargeError``), refused as invalid (``InvalidRecordError``,
    ``CorruptRecordError``), and any other error response the broker marks non-retriable.
    Retrying those would freeze the source partition's commit point forever.

    Authorization and authentication errors are not permanent here: they concern the
    writer's principal, not the record; an operator grants the ACL at run time and the same
    write then succeeds. Client-side conditions (timeouts, a lost connection, a producer
    closed under a write, a missing topic) and anything that is not a Kafka error response
    are retried too.
    """
    import kafka.errors as kerrors

    if isinstance(
        exc,
        (
            kerrors.MessageSizeTooLargeError,
            kerrors.RecordListTooLargeError,
            kerrors.InvalidRecordError,
            kerrors.CorruptRecordError,
        ),
    ):
        return True
    if isinstance(exc, (kerrors.AuthorizationError, kerrors.SaslAuthenticationFailedError)):
        return False
    return isinstance(exc, kerrors.BrokerResponseError) and not exc.retriable
