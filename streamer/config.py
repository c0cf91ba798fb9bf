"""WorkerConfig: the worker's settings from defaults, a TOML file, STREAMER_* variables and flags."""

from __future__ import annotations

import argparse
import os
import socket
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from consumers.errors import ConfigError
from consumers.settings import ConsumerSettings, Secret, SecuritySettings, ShardRuntime
from streamer.schema import Schema
from streamer.settings import PipelineSettings

__all__ = ["OPTIONS", "Option", "WorkerConfig", "add_run_arguments", "load_config"]

ENV_PREFIX = "STREAMER_"


def _default_worker_id() -> str:
    # Kubernetes sets HOSTNAME to the pod name: a stable static group instance id per replica.
    return os.environ.get("HOSTNAME") or socket.gethostname() or "worker-0"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError as exc:
        raise ValueError("a comma-separated list of partition numbers, e.g. 0,1,2") from exc


def _bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("true or false")


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: flag, type, default and help; env var and TOML key derive from the name."""

    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    group: str = "general"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


_F, _I, _S, _B = float, int, str, _bool

OPTIONS: tuple[Option, ...] = (
    # Kafka
    Option(
        "bootstrap",
        _S,
        None,
        "Kafka bootstrap servers host:port[,host:port]; unset = the embedded simulator (no Kafka)",
        group="kafka",
    ),
    Option("topic", _S, "samples", "topic to consume", group="kafka"),
    Option(
        "shard_runtime",
        _S,
        "auto",
        "run each shard's consumer on a thread, or in a child process (past one core's parse "
        "rate); auto: processes when there are 2+ shards and 2+ usable CPU cores, else threads",
        choices=("auto", "thread", "process"),
        group="kafka",
    ),
    Option(
        "group", _S, "streamer", "consumer group id (offsets are committed here)", group="kafka"
    ),
    Option(
        "worker_id",
        _S,
        None,
        "static group instance id prefix, unique per worker (default: $HOSTNAME, the pod name under Kubernetes)",
        group="kafka",
    ),
    Option(
        "partitions",
        _int_list,
        None,
        "static mode: consume exactly these partitions (comma-separated) instead of joining the group",
        group="kafka",
    ),
    Option(
        "shards",
        _I,
        2,
        "consumer shards (KafkaConsumers, each on its own poller thread)",
        group="kafka",
    ),
    Option(
        "auto_offset_reset",
        _S,
        "earliest",
        "where to start without a committed offset",
        choices=("earliest", "latest", "none"),
        group="kafka",
    ),
    Option(
        "isolation_level",
        _S,
        "read_committed",
        "read_committed: records of aborted transactions are skipped and lag counts up to the "
        "last stable offset; read_uncommitted: every record is read, aborted ones too "
        "(kafka-python's isolation_level)",
        choices=("read_committed", "read_uncommitted"),
        group="kafka",
    ),
    Option(
        "max_poll_records",
        _I,
        1000,
        "kafka-python max_poll_records: records per poll and per block",
        group="kafka",
    ),
    Option(
        "queue_max_blocks",
        _I,
        8,
        "blocks a shard buffers before it pauses its partitions (backpressure)",
        group="kafka",
    ),
    Option("max_poll_interval_ms", _I, 300_000, "kafka-python max_poll_interval_ms", group="kafka"),
    Option("session_timeout_ms", _I, 45_000, "kafka-python session_timeout_ms", group="kafka"),
    Option(
        "metadata_max_age_ms",
        _I,
        300_000,
        "kafka-python metadata_max_age_ms: topic metadata is refreshed at least this often, "
        "so partitions added to the topic are consumed within about this time",
        group="kafka",
    ),
    Option(
        "dead_letter_topic",
        _S,
        None,
        "topic for records that fail to decode (unset: count and skip them); created at "
        "start-up when missing, with the source topic's partition count",
        group="kafka",
    ),
    Option(
        "dead_letter_replication_factor",
        _I,
        None,
        "replication factor of a dead-letter topic the worker creates (unset: the broker's "
        "default.replication.factor)",
        group="kafka",
    ),
    Option(
        "security_protocol",
        _S,
        "PLAINTEXT",
        "kafka-python security_protocol",
        choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
        group="security",
    ),
    Option(
        "sasl_mechanism",
        _S,
        None,
        "SASL mechanism",
        choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        group="security",
    ),
    Option(
        "sasl_username",
        _S,
        None,
        "SASL user name (the password only from STREAMER_SASL_PASSWORD or STREAMER_SASL_PASSWORD_FILE)",
        group="security",
    ),
    Option("ssl_cafile", _S, None, "CA certificate (PEM) to verify the broker", group="security"),
    Option(
        "ssl_certfile",
        _S,
        None,
        "client certificate (PEM) for TLS client authentication",
        group="security",
    ),
    Option(
        "ssl_keyfile",
        _S,
        None,
        "client key (PEM); its password only from STREAMER_SSL_PASSWORD(_FILE)",
        group="security",
    ),
    # pipeline and training
    Option("batch_size", _I, 256, "training batch size", group="training"),
    Option(
        "schema",
        _S,
        None,
        "schema file (TOML or JSON); unset = the simulator's schema",
        group="training",
    ),
    Option(
        "model",
        _S,
        None,
        "model factory package.module:function (gets the schema); unset = the built-in MLP",
        group="training",
    ),
    Option("learning_rate", _F, 1e-3, "learning rate of the built-in model", group="training"),
    Option("jit_compile", _B, False, "compile the train step with XLA", group="training"),
    Option("mixed_precision", _B, False, "train with mixed_float16", group="training"),
    Option(
        "pass_records",
        _I,
        None,
        "end a pass after this many records (consumers are reopened)",
        group="training",
    ),
    Option("pass_seconds", _F, None, "end a pass after this many seconds", group="training"),
    Option(
        "idle_timeout",
        _F,
        10.0,
        "end a pass when no record came for this many seconds",
        group="training",
    ),
    Option("max_steps", _I, None, "stop after this many training steps", group="training"),
    Option(
        "stop_after_idle",
        _F,
        None,
        "stop when no record came for this many seconds",
        group="training",
    ),
    Option("commit_every_steps", _I, 50, "send offset commits every N steps", group="training"),
    Option(
        "commit_every_seconds",
        _F,
        5.0,
        "... or every this many seconds, whichever comes first",
        group="training",
    ),
    Option(
        "checkpoint_dir",
        _S,
        None,
        "checkpoint directory (model + optimizer + step + offsets); unset = no checkpoints",
        group="training",
    ),
    Option("checkpoint_every_steps", _I, 1000, "checkpoint every N steps", group="training"),
    Option(
        "checkpoint_every_seconds", _F, 300.0, "... or every this many seconds", group="training"
    ),
    Option("checkpoint_keep", _I, 3, "checkpoints to keep", group="training"),
    Option(
        "audit_log",
        _S,
        None,
        "append topic,partition,offset of every trained sample to this file (flushed at each commit)",
        group="training",
    ),
    Option(
        "shutdown_timeout",
        _F,
        25.0,
        "seconds allowed for a clean stop after SIGTERM/SIGINT (below Kubernetes' 30 s grace)",
        group="training",
    ),
    Option("seed", _I, None, "random seed for TensorFlow", group="training"),
    # online learning
    Option(
        "shuffle_buffer",
        _I,
        0,
        "mix records across partitions and blocks in a window of this many records before batching (0: off)",
        group="online",
    ),
    Option(
        "start_from",
        _S,
        "committed",
        "where a run starts: committed, earliest, latest, an ISO 8601 time or unix milliseconds",
        group="online",
    ),
    Option(
        "eval_topic",
        _S,
        None,
        "held-out topic read by its own shards, never committed",
        group="online",
    ),
    Option("eval_every_steps", _I, 500, "evaluate every N steps", group="online"),
    Option(
        "eval_every_seconds",
        _F,
        None,
        "... or when this many seconds passed since the last evaluation (unset: steps only)",
        group="online",
    ),
    Option("eval_records", _I, 2048, "records per evaluation", group="online"),
    Option(
        "logdir",
        _S,
        None,
        "TensorBoard log directory (scalars; profiler traces go here too)",
        group="online",
    ),
    Option(
        "export_dir",
        _S,
        None,
        "export SavedModel versions here in TF Serving's layout (<dir>/<version>/)",
        group="online",
    ),
    Option(
        "export_every_steps", _I, 1000, "export every N steps (and at a clean stop)", group="online"
    ),
    Option("export_keep", _I, 3, "exported versions to keep", group="online"),
    Option(
        "profile_steps",
        _S,
        None,
        "capture a TensorFlow Profiler trace for steps A:B into --logdir",
        group="online",
    ),
    # simulator
    Option("sim_partitions", _I, 4, "embedded simulator: virtual partitions", group="simulator"),
    Option(
        "sim_rate",
        _F,
        None,
        "embedded simulator: records/s per shard (unset: as fast as possible)",
        group="simulator",
    ),
    Option(
        "sim_record_bytes",
        _I,
        0,
        "embedded simulator: pad records to about this size",
        group="simulator",
    ),
    Option(
        "sim_task",
        _S,
        "regression",
        "embedded simulator: the task (regression: the built-in model learns it; recommender: "
        "a user id string, a list of item ids and a dense vector, for a model of your own such "
        "as examples.recommender:build); with --schema, random records of that schema instead",
        choices=("regression", "recommender"),
        group="simulator",
    ),
    # operations
    Option(
        "metrics_host",
        _S,
        "127.0.0.1",
        "bind address of /metrics, /healthz, /readyz (0.0.0.0 in the container image)",
        group="operations",
    ),
    Option(
        "metrics_port",
        _I,
        9464,
        "port of /metrics, /healthz, /readyz; 0 disables the server",
        group="operations",
    ),
    Option(
        "log_level",
        _S,
        "INFO",
        "log level",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        group="operations",
    ),
    Option(
        "log_format", _S, "text", "log line format", choices=("text", "json"), group="operations"
    ),
    Option(
        "status_interval",
        _F,
        10.0,
        "seconds between progress log lines (a live status line on a terminal)",
        group="operations",
    ),
)

_BY_NAME = {o.name: o for o in OPTIONS}
SECRET_ENV = (
    "STREAMER_SASL_PASSWORD",
    "STREAMER_SASL_PASSWORD_FILE",
    "STREAMER_SSL_PASSWORD",
    "STREAMER_SSL_PASSWORD_FILE",
)


def resolve_shard_runtime(runtime: str, shards: int) -> ShardRuntime:
    """``auto``: child processes where they pay (2+ shards, 2+ usable cores), else threads.

    kafka-python parses records in Python, so thread shards share one core's parse rate; on
    the 2-core benchmark machine process shards gave the worker 1.42x the samples/s of thread
    shards (benchmarks/README.md). With one core or one shard a process only adds a hop.
    """
    if runtime != "auto":
        return runtime  # type: ignore[return-value]
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return "process" if shards >= 2 and cores >= 2 else "thread"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Every worker setting, validated. Build it with ``load_config``."""

    bootstrap: str | None
    topic: str
    group: str
    worker_id: str
    partitions: tuple[int, ...] | None
    shards: int
    shard_runtime: str
    auto_offset_reset: str
    isolation_level: str
    max_poll_records: int
    queue_max_blocks: int
    max_poll_interval_ms: int
    session_timeout_ms: int
    metadata_max_age_ms: int
    dead_letter_topic: str | None
    dead_letter_replication_factor: int | None
    security_protocol: str
    sasl_mechanism: str | None
    sasl_username: str | None
    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    batch_size: int
    schema: str | None
    model: str | None
    learning_rate: float
    jit_compile: bool
    mixed_precision: bool
    pass_records: int | None
    pass_seconds: float | None
    idle_timeout: float
    max_steps: int | None
    stop_after_idle: float | None
    commit_every_steps: int
    commit_every_seconds: float
    checkpoint_dir: str | None
    checkpoint_every_steps: int
    checkpoint_every_seconds: float
    checkpoint_keep: int
    audit_log: str | None
    shutdown_timeout: float
    seed: int | None
    shuffle_buffer: int
    start_from: str
    eval_topic: str | None
    eval_every_steps: int
    eval_every_seconds: float | None
    eval_records: int
    logdir: str | None
    export_dir: str | None
    export_every_steps: int
    export_keep: int
    profile_steps: str | None
    sim_partitions: int
    sim_rate: float | None
    sim_record_bytes: int
    sim_task: str
    metrics_host: str
    metrics_port: int
    log_level: str
    log_format: str
    status_interval: float
    sasl_password: Secret | None = None
    ssl_password: Secret | None = None
    stop_at: str | None = None  # replay: end of the range (same forms as start_from)

    def __post_init__(self) -> None:
        for name in (
            "shards",
            "batch_size",
            "commit_every_steps",
            "checkpoint_every_steps",
            "checkpoint_keep",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "a positive integer")
        for name in (
            "commit_every_seconds",
            "checkpoint_every_seconds",
            "shutdown_timeout",
            "idle_timeout",
            "status_interval",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(name, getattr(self, name), "a positive number of seconds")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError("max_steps", self.max_steps, "a positive integer or unset")
        if self.stop_after_idle is not None and self.stop_after_idle <= 0:
            raise ConfigError(
                "stop_after_idle", self.stop_after_idle, "a positive number of seconds or unset"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                "metrics_port", self.metrics_port, "a port number 0-65535 (0 disables)"
            )
        if self.bootstrap is None:
            for name in ("dead_letter_topic", "partitions", "dead_letter_replication_factor"):
                if getattr(self, name) is not None:
                    raise ConfigError(
                        name,
                        getattr(self, name),
                        "needs --bootstrap (Kafka); the embedded simulator has no such thing",
                    )
        for name in ("eval_every_steps", "eval_records", "export_every_steps", "export_keep"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "a positive integer")
        if self.eval_every_seconds is not None and not self.eval_every_seconds > 0:
            raise ConfigError(
                "eval_every_seconds",
                self.eval_every_seconds,
                "a positive number of seconds or unset",
            )
        if self.shuffle_buffer < 0:
            raise ConfigError(
                "shuffle_buffer", self.shuffle_buffer, "0 (off) or a number of records"
            )
        self.start_position()
        self.profile_range()
        if self.profile_steps is not None and self.logdir is None:
            raise ConfigError(
                "profile_steps", self.profile_steps, "needs --logdir (the trace goes there)"
            )
        if self.sim_partitions < 1:
            raise ConfigError("sim_partitions", self.sim_partitions, "a positive integer")
        if self.schema is not None and not Path(self.schema).is_file():
            raise ConfigError(
                "schema", self.schema, "must name an existing TOML or JSON schema file"
            )
        if self.model is not None and ":" not in self.model:
            raise ConfigError("model", self.model, "package.module:function")
        if self.dead_letter_replication_factor is not None and (
            self.dead_letter_replication_factor < 1 or self.dead_letter_topic is None
        ):
            raise ConfigError(
                "dead_letter_replication_factor",
                self.dead_letter_replication_factor,
                "a positive integer, with --dead-letter-topic",
            )
        if self.model is None:
            self.load_schema().check_builtin_model()
        if self.dead_letter_topic is not None and self.dead_letter_topic == self.topic:
            raise ConfigError(
                "dead_letter_topic", self.dead_letter_topic, "must differ from --topic"
            )
        # Build the component settings now so bad combinations fail at start-up.
        if self.bootstrap is not None:
            self.consumer_settings()
        self.pipeline_settings()

    def start_position(self) -> str | int:
        """``committed``/``earliest``/``latest``, or a time as unix milliseconds."""
        value = self.start_from.strip()
        if value in ("committed", "earliest", "latest"):
            return value
        if value.isdigit():
            return int(value)
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ConfigError(
                "start_from",
                value,
                "committed, earliest, latest, an ISO 8601 time or unix milliseconds",
            ) from exc
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return int(when.timestamp() * 1000)

    def profile_range(self) -> tuple[int, int] | None:
        if self.profile_steps is None:
            return None
        a, sep, b = self.profile_steps.partition(":")
        if not sep or not a.strip().isdigit() or not b.strip().isdigit() or int(a) >= int(b):
            raise ConfigError(
                "profile_steps", self.profile_steps, "A:B with step numbers A < B, e.g. 100:110"
            )
        return int(a), int(b)

    def security_settings(self) -> SecuritySettings:
        return SecuritySettings(
            security_protocol=self.security_protocol,  # type: ignore[arg-type]
            sasl_mechanism=self.sasl_mechanism,  # type: ignore[arg-type]
            sasl_plain_username=self.sasl_username,
            sasl_plain_password=self.sasl_password,
            ssl_cafile=self.ssl_cafile,
            ssl_certfile=self.ssl_certfile,
            ssl_keyfile=self.ssl_keyfile,
            ssl_password=self.ssl_password,
        )

    def load_schema(self) -> Schema:
        """The schema: ``--schema``'s file, else that of the embedded simulator's task."""
        if self.schema is not None:
            return Schema.from_file(self.schema)
        from streamer.simulator import task_named

        return task_named(self.sim_task).schema()

    def consumer_settings(self) -> ConsumerSettings:
        assert self.bootstrap is not None
        return ConsumerSettings(
            bootstrap_servers=self.bootstrap,
            topic=self.topic,
            group_id=self.group,
            mode="static" if self.partitions else "group",
            partitions=self.partitions,
            num_shards=self.shards,
            shard_runtime=resolve_shard_runtime(self.shard_runtime, self.shards),
            worker_id=self.worker_id,
            auto_offset_reset=self.auto_offset_reset,  # type: ignore[arg-type]
            isolation_level=self.isolation_level,  # type: ignore[arg-type]
            max_poll_records=self.max_poll_records,
            queue_max_blocks=self.queue_max_blocks,
            max_poll_interval_ms=self.max_poll_interval_ms,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=min(1000, self.session_timeout_ms // 3),
            metadata_max_age_ms=self.metadata_max_age_ms,
            security=self.security_settings(),
        )

    def pipeline_settings(self) -> PipelineSettings:
        idle = self.idle_timeout
        if self.stop_after_idle is not None:
            idle = min(idle, self.stop_after_idle)
        return PipelineSettings(
            num_shards=self.shards,
            batch_size=self.batch_size,
            pass_records=self.pass_records,
            pass_seconds=self.pass_seconds,
            idle_timeout_seconds=idle,
            linger=True,
            shuffle_buffer=self.shuffle_buffer,
            start_from=self.start_position(),
            stop_at=None if self.stop_at is None else _position(self.stop_at, "to"),
        )

    def describe(self) -> dict[str, Any]:
        """Loggable settings: secrets are never included."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("sasl_password", "ssl_password")
        }


def _position(text: str, setting: str) -> str | int:
    value = text.strip()
    if value in ("committed", "earliest", "latest"):
        return value
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(
            setting, value, "committed, earliest, latest, an ISO 8601 time or unix milliseconds"
        ) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option as a flag whose help shows its env var and default (no secret flags)."""
    parser.add_argument(
        "--config",
        default=None,
        help="TOML config file (keys = option names with underscores) [env STREAMER_CONFIG]",
    )
    groups: dict[str, Any] = {}
    for opt in OPTIONS:
        grp = groups.get(opt.group)
        if grp is None:
            grp = groups[opt.group] = parser.add_argument_group(opt.group)
        default = "unset" if opt.default is None else opt.default
        grp.add_argument(
            opt.flag,
            dest=opt.name,
            default=None,
            metavar=opt.name.upper() if opt.choices is None else None,
            choices=opt.choices,
            help=f"{opt.help} [env {opt.env}; default: {default}]",
        )


def _convert(opt: Option, value: Any, source: str) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            out = opt.type(value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                opt.name, value, f"from {source}: {exc or opt.type.__name__}"
            ) from exc
    else:
        out = value
        if opt.type is _int_list and isinstance(value, list):
            out = tuple(int(v) for v in value)
        elif opt.type in (int, float) and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            raise ConfigError(opt.name, value, f"from {source}: a number")
        elif opt.type is _bool and not isinstance(value, bool):
            raise ConfigError(opt.name, value, f"from {source}: true or false")
        elif opt.type is float:
            out = float(value)
    if opt.choices is not None and out not in opt.choices:
        raise ConfigError(opt.name, value, f"from {source}: one of {', '.join(opt.choices)}")
    return out


def load_config(
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    stop_at: str | None = None,
) -> WorkerConfig:
    """Merge defaults < TOML file < STREAMER_* environment < flags into a WorkerConfig."""
    env = os.environ if env is None else env
    flags = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args or {})
    values: dict[str, Any] = {o.name: o.default for o in OPTIONS}
    config_path = flags.pop("config", None) or env.get("STREAMER_CONFIG")
    if config_path:
        try:
            data = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(
                "config", config_path, f"cannot read the file: {exc.strerror}"
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("config", config_path, f"not valid TOML: {exc}") from exc
        for key, value in data.items():
            opt = _BY_NAME.get(key)
            if opt is None:
                raise ConfigError(
                    key,
                    value,
                    f"unknown key in {config_path}; known keys: {', '.join(sorted(_BY_NAME))}",
                )
            values[key] = _convert(opt, value, config_path)
    known_env = {o.env for o in OPTIONS} | set(SECRET_ENV) | {"STREAMER_CONFIG"}
    for key in env:
        if key.startswith(ENV_PREFIX) and key not in known_env:
            raise ConfigError(key, "(set)", "unknown STREAMER_ variable; see streamer run --help")
    for opt in OPTIONS:
        if opt.env in env:
            values[opt.name] = _convert(opt, env[opt.env], opt.env)
    for key, value in flags.items():
        if key in _BY_NAME and value is not None:
            values[key] = _convert(_BY_NAME[key], value, _BY_NAME[key].flag)
    if values["worker_id"] is None:
        values["worker_id"] = _default_worker_id()
    sasl = Secret.from_env_or_file("STREAMER_SASL_PASSWORD", "STREAMER_SASL_PASSWORD_FILE", env)
    ssl = Secret.from_env_or_file("STREAMER_SSL_PASSWORD", "STREAMER_SSL_PASSWORD_FILE", env)
    return WorkerConfig(**values, sasl_password=sasl, ssl_password=ssl, stop_at=stop_at)


def option_names() -> Sequence[str]:
    return [o.name for o in OPTIONS]
