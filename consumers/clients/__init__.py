"""Kafka client adapters: one module per library behind ``consumers.clients.base``."""

from __future__ import annotations

from consumers.clients.base import ConsumerClient
from consumers.settings import ConsumerSettings

__all__ = ["open_client"]


def open_client(settings: ConsumerSettings, shard_index: int) -> ConsumerClient:
    """The consumer of one shard, from the library ``settings`` name.

    Raises ``BrokerUnavailableError`` (retried by the shard) or ``AuthenticationError``.
    """
    if settings.client == "confluent":
        from consumers.clients.confluent import open_client as open_confluent

        return open_confluent(settings, shard_index)
    from consumers.clients.kafka_python import open_client as open_kafka_python

    return open_kafka_python(settings, shard_index)
