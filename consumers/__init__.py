"""Kafka consumer shards: polling RecordBlocks with backpressure and commits (no TensorFlow here)."""

from consumers.block import RecordBlock
from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ConfigError,
    FencedError,
    ShardFailedError,
    StreamerError,
    TopicNotFoundError,
)
from consumers.settings import ConsumerSettings, Secret, SecuritySettings
from consumers.shard import Shard, ShardHooks, open_consumer

__all__ = [
    "AuthenticationError",
    "BrokerUnavailableError",
    "ConfigError",
    "ConsumerSettings",
    "FencedError",
    "RecordBlock",
    "Secret",
    "SecuritySettings",
    "Shard",
    "ShardFailedError",
    "ShardHooks",
    "StreamerError",
    "TopicNotFoundError",
    "open_consumer",
]
