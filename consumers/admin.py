"""Admin-side Kafka calls: wait for the broker and topic at start-up, create a topic, a group's
lag.

These run on kafka-python's admin client (and a group-less probe consumer) whichever client the
shards consume with: kafka-python is always installed, and none of this is on the hot path.
"""

from __future__ import annotations

import difflib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

import kafka.errors as kerrors
from kafka import TopicPartition

from consumers.clients import kafka_python_internals as internals
from consumers.clients.kafka_python import connect, probe_consumer
from consumers.errors import (
    BrokerUnavailableError,
    GroupActiveError,
    GroupResetError,
    TopicCreateError,
    TopicNotFoundError,
)
from consumers.settings import ConsumerSettings, SecuritySettings

__all__ = [
    "EnsuredTopic",
    "GroupActivity",
    "PartitionLag",
    "ensure_topic",
    "group_activity",
    "group_lag",
    "reset_group",
    "wait_for_topic",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class _Readiness(Protocol):
    def set_ready(self, flag: bool, reason: str) -> None: ...
    def waiting(self, component: str, reason: str) -> None: ...


def similar_topics(topic: str, existing: Iterable[str]) -> list[str]:
    """Existing topics whose name is close to ``topic`` (a typo's likely meaning), Kafka's
    internal ones left out.

    >>> similar_topics("smaples", {"samples", "clicks", "__consumer_offsets"})
    ['samples']
    """
    names = [t for t in existing if not t.startswith("__")]
    return difflib.get_close_matches(topic, names, n=3, cutoff=0.6)


def wait_for_topic(
    settings: ConsumerSettings,
    *,
    attempts: int = 100,
    broker_wait_seconds: float = 30.0,
    first_backoff_seconds: float = 1.0,
    max_backoff_seconds: float = 30.0,
    health: _Readiness | None = None,
    stop: threading.Event | None = None,
    topic_wait_seconds: float | None = None,
    topic_ids: dict[str, str] | None = None,
) -> list[int]:
    """Wait until the broker answers and the topic exists; returns its partitions.

    ``topic_ids``, if given, receives the topic's id (Kafka's UUID, where the broker sends it).

    Bounded retries with exponential backoff while no broker answers: probes of up to
    ``settings.bootstrap_timeout_ms`` each, 1 s doubling between them, for ``broker_wait_seconds``
    seconds in all (default 30; at most ``attempts`` probes), then one ``BrokerUnavailableError``
    naming the bootstrap servers (never credentials). Each retry is one INFO line. A failed authentication or TLS handshake is raised at once
    (``AuthenticationError``, ``TlsHandshakeError``): retrying would not help. A missing topic
    is waited for (not ready, backoff, one log line per attempt) for ``topic_wait_seconds`` seconds
    (default: forever), then ``TopicNotFoundError``.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    backoff = first_backoff_seconds
    waited_topic = 0.0
    attempt = 0
    t0 = time.monotonic()
    deadline = t0 + broker_wait_seconds
    while True:
        attempt += 1
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        timeout_ms = max(1000, min(settings.bootstrap_timeout_ms, remaining_ms))
        try:
            consumer = probe_consumer(settings.bootstrap_servers, settings.security, timeout_ms)
        except BrokerUnavailableError as exc:
            if attempt >= attempts or time.monotonic() + backoff >= deadline:
                raise BrokerUnavailableError(
                    settings.bootstrap_servers,
                    f"gave up after {attempt} attempts in {time.monotonic() - t0:.0f}s "
                    f"(--broker-wait-seconds {broker_wait_seconds:g})",
                    security_protocol=settings.security.security_protocol,
                ) from exc
            log.info(
                "no Kafka broker answered at %s (attempt %d); retrying in %.0fs, for %.0fs more",
                settings.bootstrap_servers,
                attempt,
                backoff,
                max(0.0, deadline - time.monotonic()),
            )
            if health is not None:
                health.set_ready(False, f"no broker at {settings.bootstrap_servers}")
            if stop is not None and stop.wait(backoff):
                raise
            if stop is None:
                time.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_seconds)
            continue
        similar: list[str] = []
        try:
            parts = consumer.partitions_for_topic(settings.topic)
            topic_id = internals.topic_id(consumer, settings.topic) if parts else None
            if not parts:
                similar = similar_topics(settings.topic, consumer.topics())
        finally:
            consumer.close(autocommit=False)
        if topic_ids is not None and topic_id is not None:
            topic_ids[settings.topic] = topic_id
        if parts:
            if waited_topic:
                log.info("topic %r exists now: %d partitions", settings.topic, len(parts))
            return sorted(parts)
        if topic_wait_seconds is not None and waited_topic >= topic_wait_seconds:
            raise TopicNotFoundError(settings.topic, similar=similar, waited=waited_topic)
        bound = "" if topic_wait_seconds is None else f", at most {topic_wait_seconds:.0f}s in all"
        like = f" (topics of a similar name exist: {', '.join(similar)})" if similar else ""
        log.warning(
            "topic %r does not exist yet%s; waiting %.0fs%s", settings.topic, like, backoff, bound
        )
        if health is not None:
            health.set_ready(False, f"topic {settings.topic} does not exist")
        if stop is not None and stop.wait(backoff):
            raise TopicNotFoundError(settings.topic, similar=similar)
        if stop is None:
            time.sleep(backoff)
        waited_topic += backoff
        attempt = 0
        backoff = min(backoff * 2, max_backoff_seconds)


#: The topic config that bounds a record batch's size on the broker.
MAX_MESSAGE_BYTES = "max.message.bytes"


@dataclass(frozen=True, slots=True)
class EnsuredTopic:
    """What :func:`ensure_topic` found or made.

    ``max_message_bytes``: the topic's ``max.message.bytes`` (its own or the broker's default);
    ``source_max_message_bytes``: that of the topic it is sized for. None where the broker did
    not say (no DESCRIBE_CONFIGS permission, a broker error).
    """

    topic: str
    created: bool
    max_message_bytes: int | None
    source_max_message_bytes: int | None


def ensure_topic(
    settings: ConsumerSettings,
    topic: str,
    *,
    partitions: int,
    replication_factor: int | None = None,
    setting: str = "dead_letter_topic",
    timeout_ms: int = 10_000,
) -> EnsuredTopic:
    """Create ``topic`` unless it exists (as Kafka Connect does for its dead-letter queue).

    The topic takes the records of the source topic ``settings.topic``: it is created with a
    ``max.message.bytes`` of the source's (read with ``describe_configs``), so a rejected record
    of any size the source allows fits whole. Without it, the broker's default (1 MB) would
    refuse the letter of every larger record. An existing topic is never changed; one that
    allows less than the source is logged once, at WARNING, with the command that raises it
    (the worker then writes such records as header-only letters). Sizes the broker does not
    describe are logged and left to the broker's default.

    ``replication_factor`` None takes the broker's default (``default.replication.factor``).
    A broker that refuses (no CREATE permission, a policy, a replication factor above the
    broker count) raises ``TopicCreateError`` naming ``setting`` and the topic: a deployment
    problem, found at start-up.
    """
    from kafka.admin import KafkaAdminClient

    admin = connect(
        KafkaAdminClient,
        settings.bootstrap_servers,
        settings.security,
        timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
    )
    try:
        source_max = _max_message_bytes(admin, [settings.topic]).get(settings.topic)
        created = topic not in set(admin.list_topics())
        if created:
            spec: dict[str, Any] = {
                "num_partitions": partitions,
                "replication_factor": replication_factor or -1,
            }
            if source_max is not None:
                spec["configs"] = {MAX_MESSAGE_BYTES: str(source_max)}
            try:
                admin.create_topics({topic: spec}, timeout_ms=timeout_ms, wait_for_metadata=True)
            except kerrors.TopicAlreadyExistsError:
                created = False  # another worker created it first
            except kerrors.BrokerResponseError as exc:
                raise TopicCreateError(setting, topic, partitions, type(exc).__name__) from exc
        own_max = _max_message_bytes(admin, [topic]).get(topic)
    finally:
        admin.close()
    if created:
        log.info(
            "created topic %r (%d partitions, replication factor %s, max.message.bytes %s)",
            topic,
            partitions,
            replication_factor or "the broker's default",
            own_max if own_max is not None else "the broker's default",
        )
    if source_max is None or own_max is None:
        log.warning(
            "could not read max.message.bytes of %r (%s) and %r (%s): %r keeps the broker's "
            "default, and a rejected record larger than it allows is written to it as a "
            "header-only letter. Allow the worker's principal DESCRIBE_CONFIGS on both topics "
            "to size it at start-up",
            settings.topic,
            source_max if source_max is not None else "unknown",
            topic,
            own_max if own_max is not None else "unknown",
            topic,
        )
    elif own_max < source_max:
        log.warning(
            "%s %r allows records of up to %d bytes (max.message.bytes), less than the %d "
            "bytes of source topic %r: a larger rejected record is written to it as a "
            "header-only letter (no value, its size and the produce error in headers). To keep "
            "them whole, raise it: kafka-configs.sh --bootstrap-server %s --alter "
            "--entity-type topics --entity-name %s --add-config %s=%d",
            setting,
            topic,
            own_max,
            source_max,
            settings.topic,
            settings.bootstrap_servers,
            topic,
            MAX_MESSAGE_BYTES,
            source_max,
        )
    return EnsuredTopic(topic, created, own_max, source_max)


def _max_message_bytes(admin: Any, topics: list[str]) -> dict[str, int]:
    """Each topic's ``max.message.bytes``, as the broker applies it (its own or the default).

    A topic the broker did not describe (missing, no DESCRIBE_CONFIGS permission: kafka-python
    leaves it empty) or a failed request leaves it out: sizing is best effort and never fails
    a start-up.
    """
    from kafka.admin import ConfigResource, ConfigResourceType

    resources = [ConfigResource(ConfigResourceType.TOPIC, t, [MAX_MESSAGE_BYTES]) for t in topics]
    try:
        described = admin.describe_configs(resources, config_filter="all")
    except kerrors.KafkaError as exc:
        log.debug("describe_configs of %s failed: %r", topics, exc)
        return {}
    out: dict[str, int] = {}
    for t, configs in (described.get("topic") or {}).items():
        value = (configs.get(MAX_MESSAGE_BYTES) or {}).get("value")
        if isinstance(value, str) and value.isdigit():
            out[t] = int(value)
    return out


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: A group's coordinator can be briefly unknown (a fresh broker creating __consumer_offsets,
#: a coordinator moving): these are retried within the call's timeout.
_COORDINATOR_RETRIABLE = (
    kerrors.CoordinatorNotAvailableError,
    kerrors.CoordinatorLoadInProgressError,
    kerrors.NotCoordinatorError,
)


def _with_coordinator(call: Callable[[], _T], timeout_ms: int) -> _T:
    """``call()``, again after 0.5 s (doubling) while the group's coordinator is not ready,
    for up to ``timeout_ms``; then the last error."""
    deadline = time.monotonic() + timeout_ms / 1000
    backoff = 0.5
    while True:
        try:
            return call()
        except _COORDINATOR_RETRIABLE:
            if time.monotonic() + backoff >= deadline:
                raise
            log.debug("group coordinator not ready; asking again in %.1fs", backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, 4.0)


def group_lag(
    bootstrap: str,
    group: str,
    topic: str | None = None,
    *,
    security: SecuritySettings | None = None,
    timeout_ms: int = 10_000,
    isolation_level: str = "read_committed",
) -> list[PartitionLag]:
    """Committed offset, end offset and lag per partition of ``group`` (from outside the worker).

    The end offset is what a consumer of ``isolation_level`` can read: the last stable offset
    under read_committed (the worker's default), so an open transaction is not lag; the log
    end (high watermark) under read_uncommitted, which is what Kafka's
    ``kafka-consumer-groups --describe`` shows.
    """

    admin = _admin_client(bootstrap, security, timeout_ms)
    try:
        committed_raw = _with_coordinator(
            lambda: admin.list_group_offsets(group).get(group, {}), timeout_ms
        )
    finally:
        admin.close()
    committed = {
        tp: om.offset for tp, om in committed_raw.items() if om is not None and om.offset >= 0
    }
    consumer = probe_consumer(
        bootstrap, security or SecuritySettings(), timeout_ms, isolation_level
    )
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


@dataclass(frozen=True, slots=True)
class GroupActivity:
    """What a consumer group holds now: its state, members and committed offsets.

    ``committed``: (topic, partition) → (offset, metadata) of every offset it committed.
    """

    group: str
    state: str
    members: int
    committed: dict[tuple[str, int], tuple[int, str]]

    @property
    def known(self) -> bool:
        """False for a group the broker knows nothing of (no members, no commits)."""
        return self.members > 0 or bool(self.committed) or self.state not in ("Dead", "")

    def committed_on(self, topic: str) -> dict[int, tuple[int, str]]:
        return {p: v for (t, p), v in self.committed.items() if t == topic}


def group_activity(
    bootstrap: str,
    group: str,
    *,
    security: SecuritySettings | None = None,
    timeout_ms: int = 10_000,
) -> GroupActivity:
    """A group's state, member count and committed offsets (with their metadata).

    >>> group_activity("127.0.0.1:9092", "trainer").members   # doctest: +SKIP
    2
    """

    admin = _admin_client(bootstrap, security, timeout_ms)
    try:
        described: dict[str, Any] = (
            _with_coordinator(lambda: admin.describe_groups([group]), timeout_ms).get(group) or {}
        )
        raw = _with_coordinator(lambda: admin.list_group_offsets(group).get(group, {}), timeout_ms)
    finally:
        admin.close()
    committed = {
        (tp.topic, tp.partition): (int(om.offset), om.metadata or "")
        for tp, om in raw.items()
        if om is not None and om.offset >= 0
    }
    return GroupActivity(
        group,
        str(described.get("group_state") or ""),
        len(described.get("members") or []),
        committed,
    )


def reset_group(
    bootstrap: str,
    group: str,
    topic: str,
    offsets: dict[int, int],
    *,
    security: SecuritySettings | None = None,
    timeout_ms: int = 10_000,
) -> None:
    """Commit ``offsets`` of ``topic`` for ``group``, as Kafka's
    ``kafka-consumer-groups --reset-offsets --execute`` does.

    The group must have no members (:class:`GroupActiveError`, checked first); a broker that
    refuses a partition anyway (a member joined meanwhile) raises :class:`GroupResetError`.

    >>> reset_group("127.0.0.1:9092", "trainer", "samples", {0: 120, 1: 98})   # doctest: +SKIP
    """
    from kafka.structs import OffsetAndMetadata

    admin = _admin_client(bootstrap, security, timeout_ms)
    try:
        described: dict[str, Any] = (
            _with_coordinator(lambda: admin.describe_groups([group]), timeout_ms).get(group) or {}
        )
        members = len(described.get("members") or [])
        if members:
            raise GroupActiveError(group, members)
        result = admin.alter_group_offsets(
            group,
            {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()},
        )
    finally:
        admin.close()
    failed = {
        tp.partition: getattr(err, "__name__", str(err))
        for tp, err in result.items()
        if err is not kerrors.NoError
    }
    if failed:
        raise GroupResetError(group, failed)


def _admin_client(bootstrap: str, security: SecuritySettings | None, timeout_ms: int) -> Any:
    """A KafkaAdminClient for the group commands (connection errors typed by ``connect``)."""
    from kafka.admin import KafkaAdminClient

    return connect(
        KafkaAdminClient,
        bootstrap,
        security or SecuritySettings(),
        timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
    )
