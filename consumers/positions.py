"""Start and stop positions: the one parser of their text (``parse_position``) and their
offsets per partition (``start_offsets``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from consumers.errors import ConfigError, TopicNotFoundError
from consumers.settings import ConsumerSettings

__all__ = ["parse_position", "start_offsets"]

log = logging.getLogger(__name__)


_POSITION_FORMS = "committed, earliest, latest, an ISO 8601 time or unix milliseconds"


def parse_position(
    text: str,
    setting: str,
    *,
    names: tuple[str, ...] = ("committed", "earliest", "latest"),
    forms: str = _POSITION_FORMS,
) -> str | int:
    """A stream position: one of ``names``, or a time as unix ms (``forms`` says what is
    allowed when ``text`` is none of them). The one parser of start and stop positions.

    >>> parse_position("earliest", "from"), parse_position("1767225600000", "from")
    ('earliest', 1767225600000)
    >>> parse_position("2026-01-01T00:00:00Z", "from")
    1767225600000
    """
    value = text.strip()
    if value in names:
        return value
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(setting, value, forms) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def start_offsets(settings: ConsumerSettings, position: str | int) -> dict[int, int]:
    """Offsets to seek to per partition for ``position`` (``earliest``, ``latest``, unix ms).

    A time uses Kafka's offsets-for-times: the first record at or after it; partitions with
    none start at their end. Only the partitions this run consumes (static) or all (group).

    >>> start_offsets(settings, 1767225600000)   # doctest: +SKIP
    {0: 1200, 1: 1187}
    """
    from kafka import TopicPartition  # kafka-python only when offsets are looked up

    from consumers.clients.kafka_python import probe_consumer

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
