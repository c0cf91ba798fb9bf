"""Every read of kafka-python's private attributes, in one place, each with the reason for it.

kafka-python 3.0.12 leaves a few things a long-running consumer needs out of its public API:
the consumed positions without a network round trip, the state of a group join, whether this
member computed the group's assignment, the metadata cache's age, a topic's id, and the
connection state of a failed login. Each function here degrades to a safe answer when the
attribute it reads is missing (another kafka-python version): the shard then loses only the
workaround, never correctness of its commits.
"""

from __future__ import annotations

import logging
import re
import ssl
from typing import Any

import kafka.errors as kerrors
from kafka.structs import MemberState

__all__ = [
    "AUTH_ERRORS",
    "FailureWatch",
    "await_join",
    "cached_partitions",
    "classify_failure",
    "consumed_positions",
    "is_group_leader",
    "last_metadata_refresh_ms",
    "repair_unfinished_join",
    "topic_id",
]

log = logging.getLogger(__name__)

#: kafka-python's errors that retrying cannot fix: a refused login or missing permission.
AUTH_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(kerrors, name)
    for name in (
        "AuthenticationFailedError",
        "SaslAuthenticationFailedError",
        "AuthenticationMethodNotSupported",
        "IllegalSaslStateError",
        "UnsupportedSaslMechanismError",
        "TopicAuthorizationFailedError",
        "GroupAuthorizationFailedError",
    )
    if hasattr(kerrors, name)
)

_TLS_FAILURE = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|ALERT_BAD_CERTIFICATE|ALERT_CERTIFICATE_[A-Z_]+|ALERT_UNKNOWN_CA"
    r"|ALERT_HANDSHAKE_FAILURE|ALERT_ACCESS_DENIED|ALERT_DECRYPT_ERROR"
)


def classify_failure(value: object) -> str | None:
    """'auth' or 'tls' when ``value`` is an exception that retrying cannot fix, else None."""
    if isinstance(value, AUTH_ERRORS):
        return "auth"
    if isinstance(value, ssl.SSLCertVerificationError) or (
        isinstance(value, BaseException) and _TLS_FAILURE.search(str(value))
    ):
        return "tls"
    return None


# ---- positions and metadata ---------------------------------------------------------------


def consumed_positions(consumer: Any, topic: str) -> dict[int, int]:
    """The consumer's position per assigned partition of ``topic``, without a network call.

    ``KafkaConsumer.position()`` may refresh committed offsets and await resets (a round trip);
    the subscription state holds the positions, moved past control batches and aborted
    transactions by the fetcher. Empty if that state is unreadable: commit points then stop at
    the last record (a trailing transaction marker would show as a lag of 1).
    """
    subscription = getattr(consumer, "_subscription", None)
    try:
        consumed = subscription.all_consumed_offsets() if subscription is not None else {}
    except Exception:
        return {}
    return {tp.partition: int(om.offset) for tp, om in consumed.items() if tp.topic == topic}


def cached_partitions(consumer: Any, topic: str) -> frozenset[int] | None:
    """The topic's partitions in the metadata cache (None: the last refresh lacked the topic).

    ``partitions_for_topic`` on the consumer may block on a refresh; the cache answers at once.
    """
    cluster = getattr(consumer, "_cluster", None)
    if cluster is None:
        return frozenset()  # unknown internals: never claim the topic is gone
    parts = cluster.partitions_for_topic(topic)
    return None if parts is None else frozenset(parts)


def last_metadata_refresh_ms(consumer: Any) -> int:
    """When the metadata cache last refreshed successfully (0 if unknown)."""
    return int(getattr(getattr(consumer, "_cluster", None), "_last_successful_refresh_ms", 0) or 0)


def topic_id(client: Any, topic: str) -> str | None:
    """The topic's id (Kafka's UUID) from a client's metadata cache, where the broker sent it."""
    cluster = getattr(client, "_cluster", None)
    if cluster is None or not hasattr(cluster, "topic_id"):
        return None
    found = cluster.topic_id(topic)
    return None if found is None else str(found)


# ---- the group join ------------------------------------------------------------------------


def await_join(consumer: Any, timeout_ms: int) -> None:
    """While the member (re)joins its group, wait for the join in one long call.

    kafka-python 3.0.12 runs a join as a task that ``poll()`` awaits for at most its timeout.
    When a rejoin was triggered by a metadata change (the leader assigned from stale metadata)
    rather than by a rebalance notice, and the task finishes while no ``poll()`` awaits it,
    nothing ever takes its result: the member stays out of the group, heartbeats off, until
    its session expires. Short polls (100 ms) leave a gap at every poll; awaiting the join here
    for seconds leaves almost none, and ``repair_unfinished_join`` mends the rare case that
    still slips through.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None:
        return
    if coordinator.state is not MemberState.STABLE or coordinator.need_rejoin():
        coordinator.poll(timeout_ms=timeout_ms)


def repair_unfinished_join(consumer: Any) -> bool:
    """Make kafka-python take up a join whose result nothing took (see ``await_join``).

    The member asks to rejoin; the group goes through one more (quick) rebalance instead of
    waiting for this member's session to expire. True when it asked.
    """
    coordinator: Any = getattr(consumer, "_coordinator", None)
    task = getattr(coordinator, "_join_task", None)
    if coordinator is None or task is None or not getattr(task, "is_done", False):
        return False
    if coordinator.need_rejoin():
        return False
    coordinator.request_rejoin()
    return True


def is_group_leader(consumer: Any) -> bool:
    """This member computed the group's assignment (and so watches the topic's metadata).

    True when unknown: the caller then skips a check it needs only for followers.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    return coordinator is None or bool(getattr(coordinator, "_is_leader", True))


# ---- a failed login ------------------------------------------------------------------------


class FailureWatch(logging.Handler):
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
            kind = classify_failure(arg)
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

    def __enter__(self) -> FailureWatch:
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
