"""ConsumerSettings: the typed, validated configuration of the Kafka shards (kafka-python names)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, get_args

from consumers.errors import ConfigError
from consumers.types import (
    AssignmentStrategy,
    AutoOffsetReset,
    GroupProtocol,
    IsolationLevel,
    SaslMechanism,
    SecurityProtocol,
    ShardMode,
    ShardRuntime,
)
from consumers.types import ClientName as KafkaClient

__all__ = [
    "WORKER_COMMIT",
    "AssignmentStrategy",
    "AutoOffsetReset",
    "ConsumerSettings",
    "GroupProtocol",
    "IsolationLevel",
    "KafkaClient",
    "SaslMechanism",
    "Secret",
    "SecurityProtocol",
    "SecuritySettings",
    "ShardMode",
    "ShardRuntime",
    "valid_port",
    "worker_commit_metadata",
]

#: The metadata every worker commit carries (then its worker id): the start rule
#: (streamer.input.starts) tells a worker's lagging commit from an operator's rewind by it.
WORKER_COMMIT = "streamer-worker"


def worker_commit_metadata(worker_id: str) -> str:
    """The metadata of a worker's commits.

    >>> worker_commit_metadata("trainer-0")
    'streamer-worker trainer-0'
    """
    return f"{WORKER_COMMIT} {worker_id}"


_MODES = get_args(ShardMode)
_RESETS = get_args(AutoOffsetReset)
_ISOLATION = get_args(IsolationLevel)
_CLIENTS = get_args(KafkaClient)
_STRATEGIES = get_args(AssignmentStrategy)
_PROTOCOLS_GROUP = get_args(GroupProtocol)
_PROTOCOLS = get_args(SecurityProtocol)
_MECHANISMS = get_args(SaslMechanism)
#: The smallest explicit max_batch_inflated_bytes (1 MiB: Kafka's default max.message.bytes).
_MIN_INFLATE = 1 << 20
_BOOTSTRAP_RE = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5}$")


def valid_port(text: str) -> bool:
    """A TCP port: ASCII digits, 1..65535 (``str.isdigit`` also takes '²' and '٩').

    >>> valid_port("9092"), valid_port("0"), valid_port("65536"), valid_port("\u00b2")
    (True, False, False, False)
    """
    return re.fullmatch(r"[0-9]{1,5}", text) is not None and 0 < int(text) < 65536


class Secret:
    """A string that never shows itself in repr, str, logs or error text.

    >>> s = Secret("hunter2")
    >>> s, str(s), s.get()
    (Secret('***'), '***', 'hunter2')
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def from_env_or_file(
        cls, env: str, file_env: str | None = None, environ: Mapping[str, str] | None = None
    ) -> Secret | None:
        """Read ``$env``, or the file named by ``$file_env`` (Kubernetes Secret volumes)."""
        environ = os.environ if environ is None else environ
        if file_env and environ.get(file_env):
            path = environ[file_env]
            try:
                with open(path, encoding="utf-8") as fh:
                    return cls(fh.read().strip())
            except OSError as exc:
                raise ConfigError(file_env, path, f"cannot read the file: {exc.strerror}") from exc
        value = environ.get(env)
        return cls(value) if value else None


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """SASL and TLS options, passed through to kafka-python under its own names."""

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: Secret | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: Secret | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.security_protocol not in _PROTOCOLS:
            raise ConfigError("security_protocol", self.security_protocol, f"one of {_PROTOCOLS}")
        sasl = self.security_protocol.startswith("SASL_")
        if sasl:
            if self.sasl_mechanism not in _MECHANISMS:
                raise ConfigError(
                    "sasl_mechanism",
                    self.sasl_mechanism,
                    f"one of {_MECHANISMS} with {self.security_protocol}",
                )
            if not self.sasl_plain_username or self.sasl_plain_password is None:
                raise ConfigError(
                    "sasl_plain_username",
                    self.sasl_plain_username,
                    "SASL needs a user name and a password (STREAMER_SASL_PASSWORD or "
                    "STREAMER_SASL_PASSWORD_FILE)",
                )
        elif self.sasl_mechanism is not None:
            raise ConfigError(
                "sasl_mechanism",
                self.sasl_mechanism,
                "only allowed with security_protocol SASL_PLAINTEXT or SASL_SSL",
            )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(name, path, "must name an existing PEM file")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError(
                "ssl_certfile", self.ssl_certfile, "a client certificate needs ssl_keyfile too"
            )

    def kafka_config(self) -> dict[str, Any]:
        """The kafka-python keyword arguments for these options (secrets revealed only here)."""
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.sasl_mechanism:
            out["sasl_mechanism"] = self.sasl_mechanism
            out["sasl_plain_username"] = self.sasl_plain_username
            assert self.sasl_plain_password is not None
            out["sasl_plain_password"] = self.sasl_plain_password.get()
        if self.security_protocol.endswith("SSL"):
            out["ssl_check_hostname"] = self.ssl_check_hostname
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, name):
                    out[name] = getattr(self, name)
            if self.ssl_password is not None:
                out["ssl_password"] = self.ssl_password.get()
        return out


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Everything a shard needs to consume one topic. Validated on construction.

    >>> s = ConsumerSettings(bootstrap_servers="127.0.0.1:9092", topic="samples", group_id="g")
    >>> s.mode, s.auto_offset_reset, s.num_shards, s.isolation_level
    ('group', 'earliest', 2, 'read_committed')

    ``isolation_level`` is ``read_committed`` by default (kafka-python's default is
    ``read_uncommitted``): records of aborted transactions are never handed over.

    Static mode with an empty ``group_id`` belongs to no group and commits nothing (the
    evaluator, a replay without ``--replay-group``); commit requests are dropped.
    ``commit_metadata`` is stored with every commit (a replay marks its commits with it);
    empty: ``streamer-worker <worker_id>`` (``commit_metadata_text``), by which the start
    rule tells a worker's own lagging commit from an operator's rewind.
    """

    bootstrap_servers: str
    topic: str
    group_id: str = "streamer"
    mode: ShardMode = "group"
    partitions: tuple[int, ...] | None = None
    num_shards: int = 2
    worker_id: str = "worker-0"
    auto_offset_reset: AutoOffsetReset = "earliest"
    isolation_level: IsolationLevel = "read_committed"
    max_poll_records: int = 1000
    fetch_max_bytes: int = 52_428_800
    max_partition_fetch_bytes: int = 1_048_576
    max_poll_interval_ms: int = 300_000
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 1_000
    request_timeout_ms: int = 30_000
    metadata_max_age_ms: int = 300_000
    poll_timeout_ms: int = 100
    queue_max_blocks: int = 8
    client_id: str = "streamer"
    bootstrap_timeout_ms: int = 10_000
    shard_runtime: ShardRuntime = "thread"
    #: Which library consumes: kafka-python (pure Python) or confluent-kafka (librdkafka).
    client: KafkaClient = "kafka-python"
    #: Group mode: how partitions move when members come and go; cooperative-sticky revokes
    #: only the partitions that move (KIP-429).
    partition_assignment_strategy: AssignmentStrategy = "cooperative-sticky"
    #: Group mode, confluent only: "consumer" is Kafka 4's broker-side protocol (KIP-848).
    group_protocol: GroupProtocol = "classic"
    #: Stored with every offset commit (Kafka's offset metadata; shown by admin tools).
    commit_metadata: str = ""
    #: The most bytes one record batch may inflate to (fetch limits count compressed bytes);
    #: a batch past it is not inflated but skipped and reported. 0: ``inflate_bound``'s default.
    max_batch_inflated_bytes: int = 0
    security: SecuritySettings = field(default_factory=SecuritySettings)

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str):
            raise ConfigError(
                "bootstrap_servers", self.bootstrap_servers, "a comma-separated list of host:port"
            )
        servers = [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]
        if not servers or not all(
            _BOOTSTRAP_RE.match(s) and valid_port(s.rpartition(":")[2]) for s in servers
        ):
            raise ConfigError(
                "bootstrap_servers", self.bootstrap_servers, "a comma-separated list of host:port"
            )
        if (
            not isinstance(self.topic, str)
            or not re.fullmatch(r"[A-Za-z0-9._\-]{1,249}", self.topic)
            or self.topic in (".", "..")
        ):
            raise ConfigError(
                "topic", self.topic, "1-249 characters of [A-Za-z0-9._-], not '.' or '..'"
            )
        if self.mode not in _MODES:
            raise ConfigError("mode", self.mode, f"one of {_MODES}")
        if self.mode == "group" and not self.group_id:
            raise ConfigError("group_id", self.group_id, "group mode needs a consumer group id")
        if self.mode == "static" and not self.partitions:
            raise ConfigError(
                "partitions", self.partitions, "static mode needs a list of partitions"
            )
        if self.mode == "group" and self.partitions:
            raise ConfigError("partitions", self.partitions, "only allowed in static mode")
        if self.partitions is not None and any(p < 0 for p in self.partitions):
            raise ConfigError("partitions", self.partitions, "partition numbers are >= 0")
        if self.shard_runtime not in ("thread", "process"):
            raise ConfigError("shard_runtime", self.shard_runtime, "thread or process")
        if self.auto_offset_reset not in _RESETS:
            raise ConfigError("auto_offset_reset", self.auto_offset_reset, f"one of {_RESETS}")
        if self.isolation_level not in _ISOLATION:
            raise ConfigError("isolation_level", self.isolation_level, f"one of {_ISOLATION}")
        if self.client not in _CLIENTS:
            raise ConfigError("kafka_client", self.client, f"one of {_CLIENTS}")
        if self.partition_assignment_strategy not in _STRATEGIES:
            raise ConfigError(
                "partition_assignment_strategy",
                self.partition_assignment_strategy,
                f"one of {_STRATEGIES}",
            )
        if self.group_protocol not in _PROTOCOLS_GROUP:
            raise ConfigError("group_protocol", self.group_protocol, f"one of {_PROTOCOLS_GROUP}")
        if self.group_protocol == "consumer" and self.client != "confluent":
            raise ConfigError(
                "group_protocol",
                self.group_protocol,
                "the consumer protocol (KIP-848) needs --kafka-client confluent; kafka-python "
                "3.0 speaks the classic protocol only",
            )
        positive = (
            "num_shards",
            "max_poll_records",
            "fetch_max_bytes",
            "max_partition_fetch_bytes",
            "max_poll_interval_ms",
            "session_timeout_ms",
            "heartbeat_interval_ms",
            "request_timeout_ms",
            "metadata_max_age_ms",
            "poll_timeout_ms",
            "queue_max_blocks",
            "bootstrap_timeout_ms",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(name, value, "a positive integer")
        if not isinstance(self.max_batch_inflated_bytes, int) or not (
            self.max_batch_inflated_bytes == 0 or self.max_batch_inflated_bytes >= _MIN_INFLATE
        ):
            raise ConfigError(
                "max_batch_inflated_bytes",
                self.max_batch_inflated_bytes,
                f"0 (twice fetch_max_bytes, at least 64 MiB) or at least {_MIN_INFLATE} bytes",
            )
        if self.num_shards > 256:
            raise ConfigError("num_shards", self.num_shards, "at most 256")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                "heartbeat_interval_ms",
                self.heartbeat_interval_ms,
                f"must be below session_timeout_ms ({self.session_timeout_ms})",
            )
        if self.poll_timeout_ms * 4 > self.max_poll_interval_ms:
            raise ConfigError(
                "poll_timeout_ms",
                self.poll_timeout_ms,
                f"must be well below max_poll_interval_ms ({self.max_poll_interval_ms})",
            )
        if not re.fullmatch(r"[A-Za-z0-9._\-]{1,200}", self.worker_id):
            raise ConfigError("worker_id", self.worker_id, "1-200 characters of [A-Za-z0-9._-]")

    @property
    def commits(self) -> bool:
        """False for a group-less static consumer: it never commits."""
        return bool(self.group_id)

    @property
    def inflate_bound(self) -> int:
        """The most bytes one record batch may inflate to: ``max_batch_inflated_bytes``, or
        twice ``fetch_max_bytes`` and at least 64 MiB.

        >>> ConsumerSettings(bootstrap_servers="h:9092", topic="t").inflate_bound
        104857600
        """
        return self.max_batch_inflated_bytes or max(2 * self.fetch_max_bytes, 64 << 20)

    @property
    def commit_metadata_text(self) -> str:
        """The metadata every commit carries.

        >>> ConsumerSettings(bootstrap_servers="b:9092", topic="t", worker_id="w1").commit_metadata_text
        'streamer-worker w1'
        """
        return self.commit_metadata or worker_commit_metadata(self.worker_id)

    def group_instance_id(self, shard_index: int) -> str:
        """Stable static-membership id: worker id + shard index."""
        return f"{self.worker_id}-shard-{shard_index}"

    def static_partitions(self, shard_index: int, num_shards: int) -> list[int]:
        """Static mode: shard k takes every N-th partition of the sorted list, from the k-th.

        For the partitions 0..P-1 of a whole topic that is p % N == k; for any other list
        (one worker's share of a multi-worker cluster: 1, 3, 5, ...) every shard still gets
        its part.
        """
        assert self.partitions is not None
        return sorted(set(self.partitions))[shard_index::num_shards]

    def describe(self) -> dict[str, Any]:
        """A loggable view: secrets shown as ***."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "security"}
        sec = asdict(self.security)
        for k in ("sasl_plain_password", "ssl_password"):
            if sec.get(k) is not None:
                sec[k] = "***"
        out["security"] = sec
        return out
