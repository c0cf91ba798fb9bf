"""Admin-side Kafka calls: wait for the broker and topic at start-up, a group's lag, and the
repair of a group assignment that no longer matches its topic."""

from __future__ import annotations

import logging
import re
import ssl
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import kafka.errors as kerrors
from kafka import KafkaConsumer, TopicPartition

from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    StreamerError,
    TlsHandshakeError,
    TopicCreateError,
    TopicNotFoundError,
)
from consumers.settings import ConsumerSettings, SecuritySettings
from consumers.shard import _AUTH_ERRORS

__all__ = [
    "GroupCheck",
    "PartitionLag",
    "ensure_topic",
    "group_lag",
    "rebalance_if_stale",
    "wait_for_topic",
]

log = logging.getLogger(__name__)


class _Readiness(Protocol):
    def set_ready(self, flag: bool, reason: str) -> None: ...
    def waiting(self, component: str, reason: str) -> None: ...


# kafka-python 3.x has no NoBrokersAvailable (2.x raised it); naming a missing attribute in an
# ``except`` clause raises AttributeError the moment any exception reaches that clause.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(kerrors, name)
    for name in ("NoBrokersAvailable", "KafkaTimeoutError")
    if hasattr(kerrors, name)
)
_TLS_FAILURE = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|ALERT_BAD_CERTIFICATE|ALERT_CERTIFICATE_[A-Z_]+|ALERT_UNKNOWN_CA"
    r"|ALERT_HANDSHAKE_FAILURE|ALERT_ACCESS_DENIED|ALERT_DECRYPT_ERROR"
)


def _classify(value: object) -> str | None:
    """'auth' or 'tls' when ``value`` is an exception that retrying cannot fix, else None."""
    if isinstance(value, _AUTH_ERRORS):
        return "auth"
    if isinstance(value, ssl.SSLCertVerificationError) or (
        isinstance(value, BaseException) and _TLS_FAILURE.search(str(value))
    ):
        return "tls"
    return None


class _FailureWatch(logging.Handler):
    """Watches one client's IO thread for a failed SASL authentication or TLS handshake.

    kafka-python 3.0.12 retries a failed SASL authentication or TLS handshake until
    ``bootstrap_timeout_ms`` and then raises a bare ``KafkaTimeoutError``: its bootstrap loop
    catches the error, and its per-node cache of authentication failures is never filled on
    that path. The error does reach the client's log records (on its IO thread
    ``kafka-io-<client_id>``); this handler takes it from there, remembers it, and closes the
    client's connection manager so the bootstrap ends at once: one refused attempt instead of
    a retry storm until the timeout. Needs kafka-python's WARNING records enabled (the CLI
    does); without them the failure surfaces after ``bootstrap_timeout_ms`` as
    ``BrokerUnavailableError``.

    kafka-python 3.0.12 also drops bytes that arrive together with the connection's end (its
    transport's ``_sock_recv`` returns the error and the loop discards the data), and a broker
    sends its SASL error response right before it closes: most refused logins therefore show
    up only as "socket disconnected". So with SASL the handler also counts connections that
    the broker closed after answering ApiVersions but before the connection's set-up (the SASL
    exchange) finished: a live broker hanging up in the middle of a login. Two of those in a
    row end the probe as a refused login (``sasl_hangups``). It also counts the bootstrap
    attempts that ended in "socket disconnected" (``disconnects``) and those that failed any
    other way (``others``, e.g. connection refused), for the caller's last word after the
    timeout.
    """

    def __init__(self, client_id: str, sasl: bool = False) -> None:
        super().__init__(logging.DEBUG)
        self.thread_name = f"kafka-io-{client_id}"
        self.sasl = sasl
        self.sasl_hangups = 0
        self.kind: str | None = None
        self.error: BaseException | None = None
        self.client: Any = None
        self.disconnects = 0
        self.others = 0

    def make_client(self, **configs: Any) -> Any:
        """``kafka_client`` factory: the default client, kept so it can be stopped."""
        from kafka.net.compat import KafkaNetClient

        self.client = KafkaNetClient(**configs)
        return self.client

    def emit(self, record: logging.LogRecord) -> None:
        if self.kind is not None or record.threadName != self.thread_name:
            return
        args = record.args if isinstance(record.args, tuple) else ()
        if self.sasl and "Connection lost" in str(record.msg) and args:
            if _lost_during_login(args[0]):
                self.sasl_hangups += 1
                if self.sasl_hangups >= 2:
                    self._fail(
                        "auth",
                        kerrors.KafkaConnectionError(
                            f"the broker closed {self.sasl_hangups} connections in a row "
                            "during the SASL login (refused credentials, or a mechanism "
                            "this listener does not enable)"
                        ),
                    )
                    return
            else:
                self.sasl_hangups = 0
        for arg in args:
            kind = _classify(arg)
            if kind is None:
                if isinstance(arg, BaseException) and str(record.msg).startswith(
                    "Bootstrap connection to"
                ):
                    if "socket disconnected" in str(arg):
                        self.disconnects += 1
                    else:
                        self.others += 1
                continue
            assert isinstance(arg, BaseException)
            self._fail(kind, arg)
            return

    def _fail(self, kind: str, error: BaseException) -> None:
        self.kind, self.error = kind, error
        manager = getattr(self.client, "_manager", None)
        if manager is not None:
            try:
                manager.close()  # ends the bootstrap loop: no more attempts
            except Exception:  # pragma: no cover - then the bootstrap times out instead
                log.debug("could not end the bootstrap early", exc_info=True)

    def __enter__(self) -> _FailureWatch:
        logging.getLogger("kafka").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("kafka").removeHandler(self)

    def stop_client(self) -> None:
        """Stop the IO thread of a client whose constructor failed (it would leak otherwise)."""
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # pragma: no cover - best effort
                log.debug("closing a failed probe client", exc_info=True)


def _lost_during_login(conn: object) -> bool:
    """True for a kafka-python connection that the broker closed mid-set-up, after ApiVersions.

    ``broker_version_data`` is set once ApiVersions answered on this connection (a bootstrap
    connection starts without it); a failed ``init_future`` means the set-up that follows
    (the SASL exchange) never finished.
    """
    try:
        init = getattr(conn, "init_future", None)
        return (
            getattr(conn, "broker_version_data", None) is not None
            and init is not None
            and bool(init.failed())
        )
    except Exception:  # pragma: no cover - a kafka-python without these attributes
        return False


def _detail(exc: BaseException, security: SecuritySettings) -> str:
    """An error's text for our messages, with any secret of ``security`` masked."""
    text = str(exc)
    if type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    for secret in (security.sasl_plain_password, security.ssl_password):
        if secret is not None and secret.get():
            text = text.replace(secret.get(), "***")
    return text


def _connect(
    factory: Any, bootstrap: str, security: SecuritySettings, timeout_ms: int, **configs: Any
) -> Any:
    """Build a kafka-python client; a failed authentication or TLS handshake fails at once.

    Raises ``AuthenticationError``/``TlsHandshakeError`` (never retried) or
    ``BrokerUnavailableError`` (no broker answered within ``timeout_ms``).
    """
    client_id = f"streamer-probe-{uuid.uuid4().hex[:8]}"
    watch = _FailureWatch(client_id, sasl=security.security_protocol.startswith("SASL_"))
    with watch:
        try:
            return factory(
                bootstrap_servers=[s.strip() for s in bootstrap.split(",")],
                client_id=client_id,
                kafka_client=watch.make_client,
                **configs,
                **security.kafka_config(),
            )
        except _AUTH_ERRORS as exc:
            watch.stop_client()
            raise AuthenticationError(bootstrap, _detail(exc, security)) from exc
        except _UNAVAILABLE_ERRORS as exc:
            watch.stop_client()
            if watch.kind == "tls" and watch.error is not None:
                raise TlsHandshakeError(bootstrap, _detail(watch.error, security)) from watch.error
            if watch.kind == "auth" and watch.error is not None:
                raise AuthenticationError(
                    bootstrap, _detail(watch.error, security)
                ) from watch.error
            if (
                security.security_protocol.startswith("SASL_")
                and watch.disconnects >= 2
                and watch.others == 0
            ):
                # Every attempt reached the broker, which hung up during the handshake: that
                # is how a refused login looks when kafka-python loses the error response.
                raise AuthenticationError(
                    bootstrap,
                    f"the broker closed all {watch.disconnects} connections during the SASL "
                    f"handshake within {timeout_ms} ms (refused credentials, or a mechanism "
                    "or security protocol this listener does not use)",
                ) from exc
            raise BrokerUnavailableError(
                bootstrap, f"no answer within {timeout_ms} ms ({type(exc).__name__})"
            ) from exc
        except BaseException:
            watch.stop_client()
            raise


def _probe_consumer(
    bootstrap: str,
    security: SecuritySettings,
    timeout_ms: int,
    isolation_level: str = "read_uncommitted",
) -> Any:
    return _connect(
        KafkaConsumer,
        bootstrap,
        security,
        timeout_ms,
        enable_auto_commit=False,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=max(timeout_ms, 5000),
        isolation_level=isolation_level,
    )


def wait_for_topic(
    settings: ConsumerSettings,
    *,
    attempts: int = 4,
    first_backoff_s: float = 1.0,
    max_backoff_s: float = 30.0,
    health: _Readiness | None = None,
    stop: threading.Event | None = None,
    topic_wait_s: float | None = None,
    topic_ids: dict[str, str] | None = None,
) -> list[int]:
    """Wait until the broker answers and the topic exists; returns its partitions.

    ``topic_ids``, if given, receives the topic's id (Kafka's UUID, where the broker sends it).

    Bounded retries with exponential backoff while no broker answers: ``attempts`` probes of
    up to ``settings.bootstrap_timeout_ms`` each (defaults: 4 x 10 s plus 1 + 2 + 4 s of
    backoff, under a minute), then ``BrokerUnavailableError`` naming the bootstrap servers
    (never credentials). A failed authentication or TLS handshake is raised at once
    (``AuthenticationError``, ``TlsHandshakeError``): retrying would not help. A missing topic
    is waited for (not ready, backoff, one log line per attempt) for ``topic_wait_s`` seconds
    (default: forever), then ``TopicNotFoundError``.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    backoff = first_backoff_s
    waited_topic = 0.0
    attempt = 0
    t0 = time.monotonic()
    while True:
        attempt += 1
        try:
            consumer = _probe_consumer(
                settings.bootstrap_servers, settings.security, settings.bootstrap_timeout_ms
            )
        except BrokerUnavailableError as exc:
            if attempt >= attempts:
                raise BrokerUnavailableError(
                    settings.bootstrap_servers,
                    f"gave up after {attempt} attempts in {time.monotonic() - t0:.0f}s",
                ) from exc
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
            cluster: Any = getattr(consumer, "_cluster", None)
            topic_id = (
                cluster.topic_id(settings.topic) if parts and hasattr(cluster, "topic_id") else None
            )
        finally:
            consumer.close(autocommit=False)
        if topic_ids is not None and topic_id is not None:
            topic_ids[settings.topic] = str(topic_id)
        if parts:
            if waited_topic:
                log.info("topic %r exists now: %d partitions", settings.topic, len(parts))
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


def ensure_topic(
    settings: ConsumerSettings,
    topic: str,
    *,
    partitions: int,
    replication_factor: int | None = None,
    setting: str = "dead_letter_topic",
    timeout_ms: int = 10_000,
) -> bool:
    """Create ``topic`` unless it exists (as Kafka Connect does for its dead-letter queue).

    ``replication_factor`` None takes the broker's default (``default.replication.factor``).
    Returns True when this call created it. A broker that refuses (no CREATE permission, a
    policy, a replication factor above the broker count) raises ``TopicCreateError`` naming
    ``setting`` and the topic: a deployment problem, found at start-up.
    """
    from kafka.admin import KafkaAdminClient

    admin = _connect(
        KafkaAdminClient,
        settings.bootstrap_servers,
        settings.security,
        timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
    )
    try:
        if topic in set(admin.list_topics()):
            return False
        spec = {"num_partitions": partitions, "replication_factor": replication_factor or -1}
        try:
            admin.create_topics({topic: spec}, timeout_ms=timeout_ms, wait_for_metadata=True)
        except kerrors.TopicAlreadyExistsError:
            return False  # another worker created it first
        except kerrors.BrokerResponseError as exc:
            raise TopicCreateError(setting, topic, partitions, type(exc).__name__) from exc
    finally:
        admin.close()
    log.info(
        "created topic %r (%d partitions, replication factor %s)",
        topic,
        partitions,
        replication_factor or "the broker's default",
    )
    return True


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
    isolation_level: str = "read_committed",
) -> list[PartitionLag]:
    """Committed offset, end offset and lag per partition of ``group`` (from outside the worker).

    The end offset is what a consumer of ``isolation_level`` can read: the last stable offset
    under read_committed (the worker's default), so an open transaction is not lag; the log
    end (high watermark) under read_uncommitted, which is what Kafka's
    ``kafka-consumer-groups --describe`` shows.
    """
    from kafka.admin import KafkaAdminClient

    admin = _connect(
        KafkaAdminClient,
        bootstrap,
        security or SecuritySettings(),
        timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
    )
    try:
        committed_raw = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    committed = {
        tp: om.offset for tp, om in committed_raw.items() if om is not None and om.offset >= 0
    }
    consumer = _probe_consumer(
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


@dataclass(frozen=True)
class GroupCheck:
    """What ``rebalance_if_stale`` found: ``outcome`` is ``"ok"`` (the group's assignment
    matches the topic), ``"repaired"`` (it did not; the group was made to rebalance) or
    ``"busy"`` (rebalancing already, or not readable: ask again later)."""

    outcome: Literal["ok", "repaired", "busy"]
    held: frozenset[int] = frozenset()
    partitions: frozenset[int] = frozenset()


def rebalance_if_stale(
    settings: ConsumerSettings, shard_index: int, *, timeout_ms: int = 5_000
) -> GroupCheck:
    """Make the group rebalance when its stored assignment does not match the topic.

    A static member (``group_instance_id``) that rejoins a stable group gets its stored
    assignment back without a rebalance, and kafka-python (JoinGroup v7, no KIP-814
    ``skip_assignment``) then has no member that watches the topic's partitions. An
    assignment made while the topic was deleted (nothing), or before partitions were added,
    then stays until something else rebalances the group.

    Reads the topic's partitions and the group (DescribeGroups) through one admin client;
    when the partitions of ``settings.topic`` the members hold differ from the topic's,
    removes this shard's static member (LeaveGroup by instance id). The group rebalances
    with a leader that assigns from fresh metadata, and the removed consumer rejoins on its
    own (its partitions are lost, not committed: duplicates, never a gap).

    Raises ``StreamerError`` when the broker refused the removal, and kafka-python's
    errors when a request failed.
    """
    from kafka.admin import KafkaAdminClient, MemberToRemove

    admin = _connect(
        KafkaAdminClient,
        settings.bootstrap_servers,
        settings.security,
        timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
    )
    try:
        topic: dict[str, Any] = next(iter(admin.describe_topics([settings.topic])), {})
        if topic.get("error_code") or not topic.get("partitions"):
            return GroupCheck("busy")  # the topic is gone (again): the shard deals with that
        partitions = frozenset(int(p["partition_index"]) for p in topic["partitions"])
        group = admin.describe_groups([settings.group_id]).get(settings.group_id) or {}
        if group.get("error") or group.get("group_state") != "Stable":
            return GroupCheck("busy", partitions=partitions)
        held: set[int] = set()
        for member in group.get("members") or []:
            assignment = member.get("member_assignment")
            if not assignment:
                continue  # an empty assignment (kafka-python leaves b"" undecoded)
            if not isinstance(assignment, dict):
                return GroupCheck("busy", partitions=partitions)  # not the consumer protocol
            for entry in assignment.get("assigned_partitions") or []:
                if entry.get("topic") == settings.topic:
                    held.update(int(p) for p in entry.get("partitions") or [])
        if held == partitions:
            return GroupCheck("ok", frozenset(held), partitions)
        instance = settings.group_instance_id(shard_index)
        result = admin.remove_group_members(
            settings.group_id,
            [
                MemberToRemove(
                    member_id=None,
                    group_instance_id=instance,
                    reason="stale assignment: the topic's partitions changed",
                )
            ],
        )
        errors = [err for err in result.values() if err is not kerrors.NoError]
        if errors:
            raise StreamerError(
                f"the broker refused to remove group member {instance!r} of group "
                f"{settings.group_id!r}: {errors[0].__name__}"
            )
        return GroupCheck("repaired", frozenset(held), partitions)
    finally:
        admin.close()
