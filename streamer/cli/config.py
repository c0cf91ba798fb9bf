"""WorkerConfig: the worker's settings from defaults, a TOML file, STREAMER_* variables and flags.

The options themselves are declared once, in ``streamer.cli.options``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from consumers.errors import ConfigError
from consumers.positions import parse_position
from consumers.settings import ConsumerSettings, Secret, SecuritySettings, ShardRuntime
from streamer.cli.options import ENV_PREFIX, OPTIONS, OPTIONS_BY_NAME, Option, Options
from streamer.cli.replay import COMMIT_METADATA, FLAG_ONLY, ReplaySpec
from streamer.decode.schema import Schema
from streamer.input.pipeline import PipelineSettings

__all__ = [
    "OPTIONS",
    "Option",
    "WorkerConfig",
    "add_run_arguments",
    "load_config",
    "parse_position",
]

_BY_NAME = OPTIONS_BY_NAME
SECRET_ENV = (
    "STREAMER_SASL_PASSWORD",
    "STREAMER_SASL_PASSWORD_FILE",
    "STREAMER_SSL_PASSWORD",
    "STREAMER_SSL_PASSWORD_FILE",
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


def add_run_arguments(
    parser: argparse.ArgumentParser,
    helps: Mapping[str, str] | None = None,
    *,
    only: Sequence[str] | None = None,
) -> None:
    """Add every option (or those named in ``only``) as a flag whose help shows its env var,
    TOML key and default (no secret flags). A bool option is a plain flag with its negation
    (``--jit-compile`` / ``--no-jit-compile``); an enumeration lists its values and takes them
    in any case.

    ``helps``: the whole help text of some options, instead of the generated one.
    """
    helps = helps or {}
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML config file (keys = option names with underscores) [env STREAMER_CONFIG]",
    )
    groups: dict[str, Any] = {}
    for opt in OPTIONS:
        if only is not None and opt.name not in only:
            continue
        grp = groups.get(opt.group)
        if grp is None:
            grp = groups[opt.group] = parser.add_argument_group(opt.group)
        default = opt.shown or ("unset" if opt.default is None else opt.default)
        if opt.kind is bool:
            forms = f"env {opt.env}=true|false; TOML {opt.name} = true|false"
            grp.add_argument(
                opt.flag,
                dest=opt.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=helps.get(opt.name, f"{opt.help} [{forms}; default: {str(default).lower()}]"),
            )
            continue
        metavar = opt.name.upper() if opt.choices is None else "{" + ",".join(opt.choices) + "}"
        grp.add_argument(
            opt.flag,
            dest=opt.name,
            default=None,
            metavar=metavar,
            help=helps.get(opt.name, f"{opt.help} [env {opt.env}; default: {default}]"),
        )


_KIND_WORDS: dict[type, str] = {int: "an integer", float: "a number"}


def _typed(opt: Option, value: Any, source: str) -> Any:
    """A TOML value (already typed by the TOML parser) checked against the option's type:
    never converted with a loss (``2.7`` is not an int, ``[1.9]`` not a partition list)."""
    kind = opt.kind
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(opt.name, value, f"from {source}: true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(opt.name, value, f"from {source}: an integer")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(opt.name, value, f"from {source}: a number")
        return float(value)
    if kind is tuple:
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(opt.name, value, f"from {source}: a list of integers, e.g. [0, 1]")
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(opt.name, value, f"from {source}: a string")
    return value


def _convert(opt: Option, value: Any, source: str, *, typed: bool = False) -> Any:
    """A value from a flag, a variable (text) or a TOML file (``typed``: TOML has types, so
    ``shards = "2"`` is refused as ``shards = 2.7`` is), as the option's type."""
    if value is None:
        return None
    if isinstance(value, str) and opt.kind is not str and not typed:
        try:
            out = opt.parse(value.strip())
        except (ValueError, TypeError) as exc:
            what = _KIND_WORDS.get(opt.kind) or str(exc)
            raise ConfigError(opt.name, value, f"from {source}: {what}") from exc
    else:
        out = _typed(opt, value, source)
    if opt.choices is not None and out not in opt.choices:
        # Enumerations are case-insensitive: --log-level info is INFO.
        out = next((c for c in opt.choices if c.lower() == str(out).lower()), out)
    if opt.kind is float and not math.isfinite(out):
        raise ConfigError(opt.name, value, f"from {source}: a finite number")
    if opt.choices is not None and out not in opt.choices:
        raise ConfigError(opt.name, value, f"from {source}: one of {', '.join(opt.choices)}")
    return out


def _unknown(name: str, known: Sequence[str], where: str) -> ConfigError:
    """An unknown key or variable: its name and the closest known ones, never its value (it
    may be a secret put under a wrong name)."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else "see streamer run --help"
    if "password" in name.lower() and not name.startswith(ENV_PREFIX):
        hint = "passwords come only from the environment: " + ", ".join(SECRET_ENV)
    return ConfigError(name, "(set)", f"unknown {where}; {hint}")


def load_config(
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    replay: ReplaySpec | None = None,
    sources: dict[str, str] | None = None,
) -> WorkerConfig:
    """Merge defaults < TOML file < STREAMER_* environment < flags into a WorkerConfig.

    ``sources``: filled with where each option's value came from (``default``, the file's
    path, the variable's name or the flag), for ``streamer run --print-config``.

    A ``replay`` takes the options of ``streamer.cli.replay.FLAG_ONLY`` (a live worker's outputs)
    from ``args`` only; their values from the file or the environment are not used, and their
    names are noted in ``config.replay.ignored``.
    """
    env = os.environ if env is None else env
    flags = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args or {})
    values: dict[str, Any] = {o.name: o.default for o in OPTIONS}
    came = dict.fromkeys(values, "default")
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
                raise _unknown(key, sorted(_BY_NAME), f"key in {config_path}")
            values[key] = _convert(opt, value, config_path, typed=True)
            came[key] = str(config_path)
    known_env = {o.env for o in OPTIONS} | set(SECRET_ENV) | {"STREAMER_CONFIG"}
    for key in env:
        if key.startswith(ENV_PREFIX) and key not in known_env:
            raise _unknown(key, sorted(known_env), "STREAMER_ variable")
    for opt in OPTIONS:
        if opt.env in env:
            values[opt.name] = _convert(opt, env[opt.env], opt.env)
            came[opt.name] = opt.env
    if replay is not None:
        ignored = []
        for name, value in FLAG_ONLY.items():
            flagged = flags.get(name) is not None
            if not flagged and values[name] not in (value, _BY_NAME[name].default):
                ignored.append(name)
            values[name] = value
        values["start_from"] = replay.from_text
        replay = dataclasses.replace(replay, ignored=tuple(ignored))
    for key, value in flags.items():
        if key in _BY_NAME and value is not None:
            values[key] = _convert(_BY_NAME[key], value, _BY_NAME[key].flag)
            came[key] = _BY_NAME[key].flag
    if replay is not None:
        values["group"] = replay.group or ""
    sasl = Secret.from_env_or_file("STREAMER_SASL_PASSWORD", "STREAMER_SASL_PASSWORD_FILE", env)
    ssl = Secret.from_env_or_file("STREAMER_SSL_PASSWORD", "STREAMER_SSL_PASSWORD_FILE", env)
    if sources is not None:
        sources.update(came)
        for name, var in (
            ("sasl_password", "STREAMER_SASL_PASSWORD"),
            ("ssl_password", "STREAMER_SSL_PASSWORD"),
        ):
            if var in env or var + "_FILE" in env:
                sources[name] = var if var in env else var + "_FILE"
    return WorkerConfig(**values, sasl_password=sasl, ssl_password=ssl, replay=replay)


def print_config(config: WorkerConfig, sources: Mapping[str, str], out: Any) -> None:
    """The effective settings, one per line: name, value and where it came from; secrets are
    shown as *** (only whether they are set)."""
    names = [o.name for o in OPTIONS] + ["sasl_password", "ssl_password"]
    width = max(map(len, names))
    for name in names:
        value = getattr(config, name)
        if name in ("sasl_password", "ssl_password"):
            shown = "(unset)" if value is None else "***"
        elif value is None:
            shown = "(unset)"
        elif isinstance(value, tuple):
            shown = ",".join(map(str, value))
        else:
            shown = str(value)
        print(f"{name:<{width}}  {shown:<24}  {sources.get(name, 'default')}", file=out)
