"""Kafka client adapters: one module per library behind ``consumers.clients.base``."""

from __future__ import annotations

from collections.abc import Iterator

from consumers.clients.base import ConsumerClient
from consumers.settings import ConsumerSettings

__all__ = ["open_client", "read_values"]


def open_client(settings: ConsumerSettings, shard_index: int) -> ConsumerClient:
    """The consumer of one shard, from the library ``settings`` name.

    Raises ``BrokerUnavailableError`` (retried by the shard) or ``AuthenticationError``.
    """
    if settings.client == "confluent":
        from consumers.clients.confluent import open_client as open_confluent

        return open_confluent(settings, shard_index)
    from consumers.clients.kafka_python import open_client as open_kafka_python

    return open_kafka_python(settings, shard_index)


def read_values(settings: ConsumerSettings) -> Iterator[list[bytes]]:
    """The values of ``settings.partitions`` from their beginning, one list per poll, in the
    library's plain loop (no group, no shard): the benchmark's reference for a client's cost."""
    if settings.client == "confluent":
        from consumers.clients.confluent import read_values as read_confluent

        return read_confluent(settings)
    from consumers.clients.kafka_python import read_values as read_kafka_python

    return read_kafka_python(settings)
