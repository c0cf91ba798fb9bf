"""Every closed set of the project, declared once (both packages import them from here).

confluent-kafka's ``_types.py`` is the anchor: centralized type aliases, no logic. A
``Literal`` is the type; where code needs the values, ``get_args`` gives them in order.

>>> REASONS[:3], SHARD_RUNTIMES
(('format', 'truncated', 'extra_data'), ('thread', 'process'))
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = [
    "CLIENTS",
    "KAFKA_ERROR_TYPES",
    "REASONS",
    "SHARD_RUNTIMES",
    "AssignmentStrategy",
    "AutoOffsetReset",
    "ClientName",
    "GroupProtocol",
    "IsolationLevel",
    "KafkaErrorType",
    "Reason",
    "SaslMechanism",
    "SecurityProtocol",
    "ShardMode",
    "ShardRuntime",
    "ShardRuntimeChoice",
]

#: The Kafka client libraries a shard can use (``--kafka-client``).
ClientName = Literal["kafka-python", "confluent"]
#: Where a shard's consumer runs; ``auto`` (an option's value only) picks one of them.
ShardRuntime = Literal["thread", "process"]
ShardRuntimeChoice = Literal["auto", "thread", "process"]
#: Group membership or a static list of partitions.
ShardMode = Literal["group", "static"]

# Kafka's own settings, by kafka-python's names and values.
AutoOffsetReset = Literal["earliest", "latest", "none"]
IsolationLevel = Literal["read_committed", "read_uncommitted"]
AssignmentStrategy = Literal["range", "roundrobin", "cooperative-sticky"]
GroupProtocol = Literal["classic", "consumer"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

#: Why the decoder refused a record (the ``reason`` label of the decode metrics and the dead
#: letters' ``streamer.reason`` header).
Reason = Literal[
    "format", "truncated", "extra_data", "too_large", "too_deep", "schema", "dtype", "shape"
]

#: The kinds of Kafka errors a shard reports (the ``type`` label of kafka_errors_total).
KafkaErrorType = Literal[
    "connection",
    "authentication",
    "topic_missing",
    "fenced",
    "offset_out_of_range",
    "commit",
    "dead_letter",
    "rebalance_stuck",
    "stale_assignment",
    "batch_refused",
    "other",
]

CLIENTS: Final[tuple[ClientName, ...]] = get_args(ClientName)
SHARD_RUNTIMES: Final[tuple[ShardRuntime, ...]] = get_args(ShardRuntime)
REASONS: Final[tuple[Reason, ...]] = get_args(Reason)
KAFKA_ERROR_TYPES: Final[tuple[KafkaErrorType, ...]] = get_args(KafkaErrorType)
