"""The error hierarchy shared by the whole project: one root, typed subclasses, a retriable flag."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError",
    "BrokerUnavailableError",
    "ClientFatalError",
    "ConfigError",
    "FencedError",
    "GroupActiveError",
    "GroupProtocolError",
    "GroupRepairError",
    "GroupResetError",
    "OffsetResetError",
    "ShardFailedError",
    "StreamerError",
    "TlsHandshakeError",
    "TopicCreateError",
    "TopicNotFoundError",
]


class StreamerError(Exception):
    """Root of every error this project raises on purpose.

    ``retriable`` says whether trying the same thing again later can succeed; ``exit_code``
    is the worker's exit status when the error ends it (docs/reference/exit-codes.md).
    """

    retriable: bool = False
    exit_code: int = 1

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take their own arguments, not the message: pickle (a process shard's
        # child sends its error over a pipe) rebuilds the instance from the message and the
        # attributes instead of calling ``__init__`` again.
        # The attributes go as the state (pickle sets them after the rebuild, so an attribute
        # that refers back to the error is fine).
        return (_rebuild, (type(self), str(self)), self.__dict__.copy())


def _rebuild(cls: type[StreamerError], message: str) -> StreamerError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error


class ConfigError(StreamerError, ValueError):
    """A setting, a combination of settings or a schema file is invalid.

    The message names the setting, the value that came and what is allowed.
    """

    exit_code = 2

    def __init__(self, setting: str, value: object, allowed: str) -> None:
        self.setting = setting
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid setting {setting}={value!r}: {allowed}")


class TopicCreateError(ConfigError):
    """A topic the worker writes to does not exist and the worker may not create it.

    A configuration problem of the deployment (exit 2): the message names the topic, why it
    could not be created, and what to do.
    """

    def __init__(self, setting: str, topic: str, partitions: int, detail: str) -> None:
        self.topic = topic
        super().__init__(
            setting,
            topic,
            f"the topic does not exist and the worker could not create it ({detail}). Create "
            f"it with {partitions} partitions (e.g. kafka-topics.sh --create --topic {topic} "
            f"--partitions {partitions}), or allow the worker's principal to create it "
            "(CREATE on the topic or the cluster)",
        )


class BrokerUnavailableError(StreamerError):
    """No broker of the bootstrap list answered within the retry budget."""

    retriable = True

    def __init__(
        self, bootstrap_servers: str, detail: str, *, security_protocol: str | None = None
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        protocol = ""
        if security_protocol is not None:
            # A TLS client gets no answer from a PLAINTEXT listener (nor the other way
            # round): the symptom is the same as no broker at all.
            protocol = (
                f", and that its listener there speaks {security_protocol} (--security-protocol"
                " / STREAMER_SECURITY_PROTOCOL: a listener of another protocol, PLAINTEXT, SSL,"
                " SASL_PLAINTEXT or SASL_SSL, does not answer)"
            )
        super().__init__(
            f"no Kafka broker answered at {bootstrap_servers}: {detail}. "
            f"Check the address (--bootstrap / STREAMER_BOOTSTRAP), that the broker is up{protocol}."
        )


class AuthenticationError(StreamerError):
    """The broker rejected our credentials or certificate. Not retried: it would not help."""

    def __init__(self, bootstrap_servers: str, detail: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        super().__init__(
            f"authentication with {bootstrap_servers} failed: {detail}. "
            "Check the SASL mechanism, user name and password (or the TLS files)."
        )


class TlsHandshakeError(AuthenticationError):
    """The TLS handshake failed: an untrusted or mismatched certificate on either side."""

    def __init__(self, bootstrap_servers: str, detail: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        StreamerError.__init__(
            self,
            f"TLS handshake with {bootstrap_servers} failed: {detail}. Check --ssl-cafile (the "
            "CA that signed the broker's certificate), the broker's host name, and the client "
            "certificate and key (--ssl-certfile, --ssl-keyfile) if the broker requires one.",
        )


class TopicNotFoundError(StreamerError):
    """The topic does not exist (yet, or any more)."""

    retriable = True

    def __init__(
        self, topic: str, *, similar: list[str] | None = None, waited: float | None = None
    ) -> None:
        self.topic = topic
        self.similar = list(similar or [])
        after = f" (waited {waited:.0f}s: --topic-wait-seconds)" if waited else ""
        names = ""
        if self.similar:
            names = f"; topics of a similar name exist: {', '.join(self.similar)}"
        super().__init__(f"topic {topic!r} does not exist{after}{names}; create it or fix --topic")


class FencedError(StreamerError):
    """Another member with the same group_instance_id took our place in the group."""

    def __init__(self, group_instance_id: str) -> None:
        self.group_instance_id = group_instance_id
        super().__init__(
            f"fenced: another consumer joined with group_instance_id {group_instance_id!r}; "
            "each worker needs a unique --worker-id"
        )


class ClientFatalError(StreamerError):
    """The Kafka client library reports a fatal error: its consumer cannot go on."""

    def __init__(self, client: str, detail: str) -> None:
        self.client = client
        super().__init__(f"{client} fatal error: {detail}")


class GroupRepairError(StreamerError):
    """The broker refused to remove a member of a group with a stale assignment."""

    retriable = True

    def __init__(self, group_id: str, instance: str, detail: str) -> None:
        self.group_id = group_id
        super().__init__(
            f"the broker refused to remove group member {instance!r} of group {group_id!r}: "
            f"{detail}"
        )


class GroupActiveError(ConfigError):
    """A consumer group whose offsets were to move has members: its workers are running.

    Kafka moves a group's committed offsets only while the group is empty (exit 2: stop the
    group's workers first).
    """

    def __init__(self, group_id: str, members: int) -> None:
        self.group_id = group_id
        self.members = members
        super().__init__(
            "group",
            group_id,
            f"has {members} active member(s): stop its workers first (a group's offsets can "
            "only be moved while it has no members; a stopped worker's static members leave "
            "when their session times out, --session-timeout-ms, 45 s by default)",
        )


class GroupResetError(StreamerError):
    """The broker refused to move a group's committed offsets (a member joined meanwhile?)."""

    retriable = True

    def __init__(self, group_id: str, failed: dict[int, str]) -> None:
        self.group_id = group_id
        self.failed = failed
        super().__init__(
            f"the broker refused to move the offsets of group {group_id!r} for partitions "
            f"{failed}: stop every member of the group and try again"
        )


class GroupProtocolError(StreamerError):
    """The group's other members use a partition assignment protocol this worker does not."""

    def __init__(self, group_id: str, strategy: str) -> None:
        self.group_id = group_id
        super().__init__(
            f"group {group_id!r} runs another partition assignment protocol than this worker's "
            f"({strategy}): its other members run with a different "
            "--partition-assignment-strategy (an earlier streamer version used range). Every "
            "member of a group must share one: set theirs here until all are upgraded, or stop "
            "every member and start them again with the same setting"
        )


class OffsetResetError(StreamerError):
    """Partitions have no valid position (no committed offset, or one out of range) and
    ``auto_offset_reset`` is ``none``: the shard may not choose where to start."""

    def __init__(self, topic: str, partitions: list[int], out_of_range: bool) -> None:
        self.topic = topic
        self.partitions = sorted(partitions)
        what = "are out of range" if out_of_range else "have no committed offset"
        super().__init__(
            f"partitions {self.partitions} of {topic} {what} and auto_offset_reset=none; "
            "set --auto-offset-reset earliest or latest"
        )


class ShardFailedError(StreamerError):
    """A shard's poller thread died; the cause is chained as ``__cause__``."""

    def __init__(self, shard_index: int, cause: BaseException) -> None:
        self.shard_index = shard_index
        super().__init__(f"shard {shard_index} failed: {type(cause).__name__}: {cause}")
        self.__cause__ = cause
