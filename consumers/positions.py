"""Start positions: earliest, latest or a point in time, as offsets per partition."""

from __future__ import annotations

import logging

from kafka import TopicPartition

from consumers.clients.kafka_python import probe_consumer
from consumers.errors import TopicNotFoundError
from consumers.settings import ConsumerSettings

__all__ = ["start_offsets"]

log = logging.getLogger(__name__)


def start_offsets(settings: ConsumerSettings, position: str | int) -> dict[int, int]:
    """Offsets to seek to per partition for ``position`` (``earliest``, ``latest``, unix ms).

    A time uses Kafka's offsets-for-times: the first record at or after it; partitions with
    none start at their end. Only the partitions this run consumes (static) or all (group).

    >>> start_offsets(settings, 1767225600000)   # doctest: +SKIP
    {0: 1200, 1: 1187}
    """
    consumer = probe_consumer(
        settings.bootstrap_servers,
        settings.security,
        settings.bootstrap_timeout_ms,
        settings.isolation_level,
    )
    try:
        parts = consumer.partitions_for_topic(settings.topic)
        if not parts:
            raise TopicNotFoundError(settings.topic)
        wanted = sorted(settings.partitions) if settings.partitions else sorted(parts)
        tps = [TopicPartition(settings.topic, p) for p in wanted]
        ends = consumer.end_offsets(tps)
        if position == "earliest":
            found = consumer.beginning_offsets(tps)
            out = {tp.partition: int(found[tp]) for tp in tps}
        elif position == "latest":
            out = {tp.partition: int(ends[tp]) for tp in tps}
        elif isinstance(position, int):
            times = consumer.offsets_for_times({tp: position for tp in tps})
            out = {
                tp.partition: int(times[tp].offset) if times.get(tp) is not None else int(ends[tp])
                for tp in tps
            }
        else:
            raise ValueError(f"unknown start position {position!r}")
    finally:
        consumer.close(autocommit=False)
    log.info("start position %s of %s: %s", position, settings.topic, out)
    return out
