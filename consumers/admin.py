"""Admin-side Kafka reads: wait for the broker and topic at start-up, and a group's lag."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import kafka.errors as kerrors
from kafka import KafkaConsumer, TopicPartition

from consumers.errors import AuthenticationError, BrokerUnavailableError, TopicNotFoundError
from consumers.settings import ConsumerSettings, SecuritySettings
from consumers.shard import _AUTH_ERRORS

__all__ = ["PartitionLag", "group_lag", "wait_for_topic"]

log = logging.getLogger(__name__)


class _Readiness(Protocol):
    def set_ready(self, flag: bool, reason: str) -> None: ...
    def waiting(self, component: str, reason: str) -> None: ...


def _probe_consumer(bootstrap: str, security: SecuritySettings, timeout_ms: int) -> Any:
    try:
        return KafkaConsumer(
            bootstrap_servers=[s.strip() for s in bootstrap.split(",")],
            client_id="streamer-probe",
            enable_auto_commit=False,
            bootstrap_timeout_ms=timeout_ms,
            request_timeout_ms=max(timeout_ms, 5000),
            **security.kafka_config(),
        )
    except (kerrors.NoBrokersAvailable, kerrors.KafkaTimeoutError) as exc:
        raise BrokerUnavailableError(bootstrap, type(exc).__name__) from exc
    except _AUTH_ERRORS as exc:
        raise AuthenticationError(bootstrap, type(exc).__name__) from exc


def wait_for_topic(
    settings: ConsumerSettings,
    *,
    attempts: int = 6,
    first_backoff_s: float = 1.0,
    max_backoff_s: float = 30.0,
    health: _Readiness | None = None,
    stop: threading.Event | None = None,
    topic_wait_s: float | None = None,
) -> list[int]:
    """Wait until the broker answers and the topic exists; returns its partitions.

    Bounded retries with exponential backoff while no broker answers (then
    ``BrokerUnavailableError`` naming the bootstrap servers, never credentials); an
    authentication failure is raised at once (retrying would not help). A missing topic is
    waited for (not ready, backoff, one log line per attempt) for ``topic_wait_s`` seconds
    (default: forever), then ``TopicNotFoundError``.
    """
    backoff = first_backoff_s
    waited_topic = 0.0
    attempt = 0
    while True:
        attempt += 1
        try:
            consumer = _probe_consumer(
                settings.bootstrap_servers, settings.security, settings.bootstrap_timeout_ms
            )
        except BrokerUnavailableError:
            if attempt >= attempts:
                raise
            log.warning(
                "no Kafka broker answered at %s (attempt %d of %d); retrying in %.0fs",
                settings.bootstrap_servers,
                attempt,
                attempts,
                backoff,
            )
            if health is not None:
                health.set_ready(False, f"no broker at {settings.bootstrap_servers}")
            if stop is not None and stop.wait(backoff):
                raise
            if stop is None:
                time.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_s)
            continue
        try:
            parts = consumer.partitions_for_topic(settings.topic)
        finally:
            consumer.close(autocommit=False)
        if parts:
            return sorted(parts)
        if topic_wait_s is not None and waited_topic >= topic_wait_s:
            raise TopicNotFoundError(settings.topic)
        log.warning("topic %r does not exist yet; waiting %.0fs", settings.topic, backoff)
        if health is not None:
            health.set_ready(False, f"topic {settings.topic} does not exist")
        if stop is not None and stop.wait(backoff):
            raise TopicNotFoundError(settings.topic)
        if stop is None:
            time.sleep(backoff)
        waited_topic += backoff
        attempt = 0
        backoff = min(backoff * 2, max_backoff_s)


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_lag(
    bootstrap: str,
    group: str,
    topic: str | None = None,
    *,
    security: SecuritySettings | None = None,
    timeout_ms: int = 10_000,
) -> list[PartitionLag]:
    """Committed offset, end offset and lag per partition of ``group`` (from outside the worker)."""
    from kafka.admin import KafkaAdminClient

    sec = (security or SecuritySettings()).kafka_config()
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="streamer-lag",
            request_timeout_ms=timeout_ms,
            **sec,
        )
    except (kerrors.NoBrokersAvailable, kerrors.KafkaTimeoutError) as exc:
        raise BrokerUnavailableError(bootstrap, type(exc).__name__) from exc
    except _AUTH_ERRORS as exc:
        raise AuthenticationError(bootstrap, type(exc).__name__) from exc
    try:
        committed_raw = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    committed = {
        tp: om.offset for tp, om in committed_raw.items() if om is not None and om.offset >= 0
    }
    consumer = _probe_consumer(bootstrap, security or SecuritySettings(), timeout_ms)
    try:
        topics = [topic] if topic else sorted({tp.topic for tp in committed})
        tps: list[TopicPartition] = []
        for t in topics:
            parts = consumer.partitions_for_topic(t)
            if not parts:
                raise TopicNotFoundError(t)
            tps.extend(TopicPartition(t, p) for p in sorted(parts))
        ends = consumer.end_offsets(tps) if tps else {}
    finally:
        consumer.close(autocommit=False)
    out = []
    for tp in tps:
        end = int(ends.get(tp, 0))
        c = committed.get(tp)
        out.append(PartitionLag(tp.topic, tp.partition, c, end, end - (c if c is not None else 0)))
    return out
