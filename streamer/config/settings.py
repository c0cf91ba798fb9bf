"""WorkerConfig: every worker setting, validated; and the choice of a shard runtime.

The options themselves are declared once, in ``streamer.config.options``; ``load_config``
(``streamer.config.loading``) builds a WorkerConfig from defaults, a TOML file, STREAMER_*
variables and flags.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from consumers.errors import ConfigError
from consumers.positions import parse_position
from consumers.settings import ConsumerSettings, Secret, SecuritySettings, ShardRuntime
from streamer.config.options import OPTIONS, Options
from streamer.config.replay import COMMIT_METADATA, ReplaySpec
from streamer.decode.schema import Schema
from streamer.input.pipeline import PipelineSettings

__all__ = ["WorkerConfig", "resolve_shard_runtime", "shard_runtime_choice", "usable_cores"]


def _check_model_spec(spec: str) -> None:
    """``--model package.module:function`` as far as it can be checked without importing the
    module (which imports Keras and TensorFlow): its form, and that the module can be found
    on the Python path or in the current directory (``streamer.train.model.load_model``'s
    search), so a typo fails in a fraction of a second, not after TensorFlow loaded."""
    import importlib.util

    module, _, function = spec.partition(":")
    if not module or not function.isidentifier():
        raise ConfigError("model", spec, "package.module:function")
    top = module.partition(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found and top.isidentifier():
        cwd = Path.cwd()
        found = (cwd / f"{top}.py").is_file() or (cwd / top).is_dir()
    if not found:
        raise ConfigError(
            "model",
            spec,
            f"no module {top!r} on the Python path or in the current directory ({Path.cwd()}); "
            "package.module:function names a function that takes the schema and returns a "
            "compiled keras.Model",
        )


def _default_worker_id() -> str:
    # Kubernetes sets HOSTNAME to the pod name: a stable static group instance id per replica.
    return os.environ.get("HOSTNAME") or socket.gethostname() or "worker-0"


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity; a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def shard_runtime_choice(
    runtime: str, shards: int, client: str = "kafka-python", cores: int | None = None
) -> tuple[ShardRuntime, str]:
    """The shard runtime to run and why (the start line says it).

    ``auto`` decides by what ``streamer bench`` measured per record (benchmarks/README.md,
    "Cost per record"): the main interpreter's GIL is the one serial resource of a worker, and
    shard processes take the client's per-record work and the decode off it (kafka-python:
    1.7 against 12.5 GIL µs per record in threads; confluent: 1.0 against 2.4). A child
    needs a core of its own to pay: kafka-python's threads share one core's parse rate, so
    processes win from 2 cores; confluent's threads already parse in librdkafka's C threads,
    and on 2 cores its worker's processes only matched them (0.97-1.12x), so processes from
    4 cores. One shard: a process only adds a hop.

    >>> shard_runtime_choice("auto", 4, "confluent", cores=16)[0]
    'process'
    >>> shard_runtime_choice("auto", 4, "confluent", cores=2)[0]
    'thread'
    """
    if runtime != "auto":
        return runtime, "as set"  # type: ignore[return-value]
    cores = usable_cores() if cores is None else cores
    need = 4 if client == "confluent" else 2
    if shards < 2:
        return "thread", "auto: one shard, a process would only add a hop"
    if cores < need:
        return "thread", f"auto: {cores} usable cores, {client} shard processes pay from {need}"
    return "process", (
        f"auto: {shards} shards on {cores} usable cores, per-record work off the main interpreter"
    )


def resolve_shard_runtime(runtime: str, shards: int, client: str = "kafka-python") -> ShardRuntime:
    """``shard_runtime_choice`` without its reason."""
    return shard_runtime_choice(runtime, shards, client)[0]


@dataclass(frozen=True, slots=True)
class WorkerConfig(Options):
    """Every worker setting, validated. Build it with ``load_config``."""

    sasl_password: Secret | None = None
    ssl_password: Secret | None = None
    replay: ReplaySpec | None = None  # streamer replay: its range, group and restore dir
    #: The model is the caller's own (``streamer.Stream``): no ``--model`` and no built-in.
    own_model: bool = False

    def __post_init__(self) -> None:
        if not self.worker_id:
            object.__setattr__(self, "worker_id", _default_worker_id())
        for name in (
            "shards",
            "batch_size",
            "commit_every_steps",
            "checkpoint_every_steps",
            "checkpoint_keep",
            "max_nonfinite_steps",
            "steps_per_execution",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "a positive integer")
        for name in (
            "commit_every_seconds",
            "checkpoint_every_seconds",
            "shutdown_timeout",
            "idle_timeout",
            "status_interval",
            "stall_timeout",
            "pad_after_seconds",
            "broker_wait_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(name, getattr(self, name), "a positive number of seconds")
        if self.checkpoint_failure_seconds < 0:
            raise ConfigError(
                "checkpoint_failure_seconds",
                self.checkpoint_failure_seconds,
                "seconds >= 0 (0: never stop)",
            )
        if self.topic_wait_seconds < 0:
            raise ConfigError(
                "topic_wait_seconds", self.topic_wait_seconds, "seconds >= 0 (0: no bound)"
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError("max_steps", self.max_steps, "a positive integer or unset")
        if self.stop_after_idle is not None and self.stop_after_idle <= 0:
            raise ConfigError(
                "stop_after_idle", self.stop_after_idle, "a positive number of seconds or unset"
            )
        if not 0 <= self.peer_stop_exit_code <= 255:
            raise ConfigError("peer_stop_exit_code", self.peer_stop_exit_code, "an exit code 0-255")
        if self.worker_index is not None and self.worker_index < 0:
            raise ConfigError("worker_index", self.worker_index, "an index from 0, or unset")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                "metrics_port", self.metrics_port, "a port number 0-65535 (0 disables)"
            )
        if self.bootstrap is None:
            for name in (
                "dead_letter_topic",
                "partitions",
                "dead_letter_replication_factor",
                "eval_topic",
            ):
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
        if self.model is not None:
            _check_model_spec(self.model)
        if self.dead_letter_replication_factor is not None and (
            self.dead_letter_replication_factor < 1 or self.dead_letter_topic is None
        ):
            raise ConfigError(
                "dead_letter_replication_factor",
                self.dead_letter_replication_factor,
                "a positive integer, with --dead-letter-topic",
            )
        # The schema file is read now, whichever model takes it: a bad one fails before
        # TensorFlow loads and before the metrics server binds its port.
        schema = self.load_schema()
        if self.model is None and not self.own_model:
            schema.check_builtin_model()
        if self.dead_letter_topic is not None and self.dead_letter_topic == self.topic:
            raise ConfigError(
                "dead_letter_topic", self.dead_letter_topic, "must differ from --topic"
            )
        # Build the component settings now so bad combinations fail at start-up.
        if self.bootstrap is not None:
            self.consumer_settings()
            if self.kafka_client == "confluent":
                import consumers.clients.confluent  # noqa: F401  (a missing extra: ConfigError)
        self.pipeline_settings()

    def start_position(self) -> str | int:
        """``committed``/``earliest``/``latest``, or a time as unix milliseconds."""
        if self.replay is not None:
            return self.replay.start
        return parse_position(self.start_from, "start_from")

    @property
    def commits(self) -> bool:
        """Whether offsets are committed (a replay: only to a group of its own, if named)."""
        return self.replay is None or self.replay.group is not None

    def profile_range(self) -> tuple[int, int] | None:
        if self.profile_steps is None:
            return None
        a, sep, b = self.profile_steps.partition(":")
        if not sep or not a.strip().isdigit() or not b.strip().isdigit() or int(a) >= int(b):
            raise ConfigError(
                "profile_steps", self.profile_steps, "A:B with step numbers A < B, e.g. 100:110"
            )
        return int(a), int(b)

    def _targets(self, prefix: str) -> dict[str, Any]:
        """The options declared ``to="<prefix>.<field>"``, by that field."""
        return {
            o.to.removeprefix(prefix): getattr(self, o.name)
            for o in OPTIONS
            if o.to is not None and o.to.startswith(prefix)
        }

    def security_settings(self) -> SecuritySettings:
        return SecuritySettings(
            **self._targets("security."),
            sasl_plain_password=self.sasl_password,
            ssl_password=self.ssl_password,
        )

    def load_schema(self) -> Schema:
        """The schema: ``--schema``'s file, else that of the embedded simulator's task."""
        if self.schema is not None:
            schema = Schema.from_file(self.schema)
        else:
            from streamer.input.simulator import task_named

            schema = task_named(self.sim_task).schema()
        if self.sample_weight is not None:
            try:
                schema = schema.with_weight(self.sample_weight)
            except ConfigError as exc:
                raise ConfigError("sample_weight", self.sample_weight, exc.allowed) from exc
        return schema

    def consumer_settings(self, partitions: Sequence[int] | None = None) -> ConsumerSettings:
        """The shards' settings; ``partitions`` (static mode) instead of ``self.partitions``.

        A replay without ``--partitions`` reads every partition of the topic: until the
        caller has looked them up (the CLI, or the worker at start-up) partition 0 stands in.
        """
        assert self.bootstrap is not None
        targets = self._targets("consumer.")
        if partitions is not None:
            targets["partitions"] = tuple(partitions)
        elif self.replay is not None and not self.partitions:
            targets["partitions"] = (0,)
        metadata = ""  # a worker's own: ConsumerSettings.commit_metadata_text
        if self.replay is not None:
            # No group unless --replay-group names one; its commits say they are a replay's.
            targets["group_id"] = self.replay.group or ""
            metadata = f"{COMMIT_METADATA} from={self.replay.from_text} to={self.replay.to_text}"
        return ConsumerSettings(
            **targets,
            commit_metadata=metadata,
            mode="static" if targets["partitions"] else "group",
            shard_runtime=resolve_shard_runtime(self.shard_runtime, self.shards, self.kafka_client),
            heartbeat_interval_ms=min(1000, self.session_timeout_ms // 3),
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
            max_reject_fraction=self.max_reject_fraction,
            decoder=self.decoder,
            start_from=self.start_position(),
            stop_at=None if self.replay is None else self.replay.stop,
        )

    def describe(self) -> dict[str, Any]:
        """Loggable settings: secrets are never included."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("sasl_password", "ssl_password")
        }
