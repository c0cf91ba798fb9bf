"""Every worker option, declared once: its typed field gives the flag, STREAMER_* variable,
TOML key, parser, allowed values (a ``Literal``) and where the value goes.

Times are seconds (``float``) everywhere, except Kafka client settings, which keep
kafka-python's names and units (``*_ms``). ``to="consumer.x"`` / ``to="security.x"`` says which
field of ``ConsumerSettings`` / ``SecuritySettings`` the option is.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal

from consumers.types import (
    AssignmentStrategy,
    AutoOffsetReset,
    GroupProtocol,
    IsolationLevel,
    SaslMechanism,
    SecurityProtocol,
    ShardRuntimeChoice,
)
from consumers.types import ClientName as KafkaClientChoice

__all__ = ["ENV_PREFIX", "OPTIONS", "Option", "Options", "option"]

ENV_PREFIX = "STREAMER_"

SimTask = Literal["regression", "recommender"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["text", "json"]
DecoderChoice = Literal["auto", "python"]


def option(
    default: Any, help: str, *, group: str, to: str | None = None, shown: str | None = None
) -> Any:
    """A dataclass field that is an option (``shown``: the default as ``--help`` shows it)."""
    return field(default=default, metadata={"help": help, "group": group, "to": to, "shown": shown})


@dataclass(frozen=True, slots=True)
class Options:
    """The worker's options as declared (``streamer.config.WorkerConfig`` validates them)."""

    # ---- kafka -------------------------------------------------------------------------------
    bootstrap: str | None = option(
        None,
        "Kafka bootstrap servers host:port[,host:port]; unset = the embedded simulator (no Kafka)",
        group="kafka",
        to="consumer.bootstrap_servers",
    )
    topic: str = option("samples", "topic to consume", group="kafka", to="consumer.topic")
    kafka_client: KafkaClientChoice = option(
        "kafka-python",
        "the Kafka client library: kafka-python (pure Python, the default) or confluent "
        "(librdkafka: fetch, decompression and parsing in C, several times less CPU per record; "
        "needs the confluent extra, and says how to install it where it is missing)",
        group="kafka",
        to="consumer.client",
    )
    shard_runtime: ShardRuntimeChoice = option(
        "auto",
        "run each shard's consumer on a thread, or in a child process (its per-record work, "
        "client objects and decode, off the main interpreter's GIL); auto: processes with 2+ "
        "shards and 2+ usable CPU cores (kafka-python) or 4+ (confluent), else threads; the "
        "start line says which and why",
        group="kafka",
    )
    group: str = option(
        "streamer",
        "consumer group id (offsets are committed here)",
        group="kafka",
        to="consumer.group_id",
    )
    worker_id: str = option(
        "",
        "static group instance id prefix, unique per worker (the pod name under Kubernetes)",
        group="kafka",
        to="consumer.worker_id",
        shown="$HOSTNAME",
    )
    partitions: tuple[int, ...] | None = option(
        None,
        "static mode: consume exactly these partitions (comma-separated) instead of joining "
        "the group",
        group="kafka",
        to="consumer.partitions",
    )
    shards: int = option(
        2,
        "consumer shards: Kafka consumers, each polling in a child process or on a thread "
        "(--shard-runtime: by default child processes with kafka-python, 2+ shards and 2+ "
        "usable CPU cores, else threads; the start line names the runtime in use)",
        group="kafka",
        to="consumer.num_shards",
    )
    partition_assignment_strategy: AssignmentStrategy = option(
        "cooperative-sticky",
        "how the group moves partitions when members come and go: cooperative-sticky revokes "
        "only the partitions that move (KIP-429); range and roundrobin revoke everything. "
        "Every member of a group needs the same one",
        group="kafka",
        to="consumer.partition_assignment_strategy",
    )
    group_protocol: GroupProtocol = option(
        "classic",
        "consumer: Kafka 4's group protocol, the broker assigns (KIP-848; --kafka-client "
        "confluent only; the broker's session timeout applies)",
        group="kafka",
        to="consumer.group_protocol",
    )
    auto_offset_reset: AutoOffsetReset = option(
        "earliest",
        "where to start without a committed offset",
        group="kafka",
        to="consumer.auto_offset_reset",
    )
    isolation_level: IsolationLevel = option(
        "read_committed",
        "read_committed: records of aborted transactions are skipped and lag counts up to the "
        "last stable offset; read_uncommitted: every record is read, aborted ones too",
        group="kafka",
        to="consumer.isolation_level",
    )
    max_poll_records: int = option(
        1000,
        "records per poll and per block (kafka-python's max_poll_records)",
        group="kafka",
        to="consumer.max_poll_records",
    )
    queue_max_blocks: int = option(
        8,
        "blocks a shard buffers before it pauses its partitions (backpressure)",
        group="kafka",
        to="consumer.queue_max_blocks",
    )
    max_poll_interval_ms: int = option(
        300_000,
        "kafka-python max_poll_interval_ms",
        group="kafka",
        to="consumer.max_poll_interval_ms",
    )
    session_timeout_ms: int = option(
        45_000, "kafka-python session_timeout_ms", group="kafka", to="consumer.session_timeout_ms"
    )
    metadata_max_age_ms: int = option(
        300_000,
        "kafka-python metadata_max_age_ms: topic metadata is refreshed at least this often, so "
        "partitions added to the topic are consumed within about this time",
        group="kafka",
        to="consumer.metadata_max_age_ms",
    )
    max_batch_inflated_bytes: int = option(
        0,
        "the most bytes one record batch may inflate to; a batch past it (a decompression "
        "bomb) is not inflated but skipped, logged and counted (kafka_errors_total"
        '{type="batch_refused"}); 0: twice fetch_max_bytes, at least 64 MiB',
        group="kafka",
        to="consumer.max_batch_inflated_bytes",
    )
    broker_wait_seconds: float = option(
        30.0,
        "at start-up, how long to wait for a broker to answer before one error (exit 1); "
        "every command that talks to Kafka ends the same way",
        group="kafka",
    )
    topic_wait_seconds: float = option(
        300.0,
        "at start-up, how long to wait for --topic to exist before one error that names the "
        "existing topics of a similar name (exit 1); 0: wait as long as it takes (a topic its "
        "producer creates later)",
        group="kafka",
    )
    dead_letter_topic: str | None = option(
        None,
        "topic for records that fail to decode and those of skipped non-finite steps, each "
        "written whole with headers naming its origin (unset: count and skip them); created at "
        "start-up when missing, with the source topic's partition count",
        group="kafka",
    )
    dead_letter_replication_factor: int | None = option(
        None,
        "replication factor of a dead-letter topic the worker creates (unset: the broker's "
        "default.replication.factor)",
        group="kafka",
    )

    # ---- security ----------------------------------------------------------------------------
    security_protocol: SecurityProtocol = option(
        "PLAINTEXT",
        "kafka-python security_protocol",
        group="security",
        to="security.security_protocol",
    )
    sasl_mechanism: SaslMechanism | None = option(
        None, "SASL mechanism", group="security", to="security.sasl_mechanism"
    )
    sasl_username: str | None = option(
        None,
        "SASL user name (the password only from STREAMER_SASL_PASSWORD or "
        "STREAMER_SASL_PASSWORD_FILE)",
        group="security",
        to="security.sasl_plain_username",
    )
    ssl_cafile: str | None = option(
        None,
        "CA certificate (PEM) to verify the broker",
        group="security",
        to="security.ssl_cafile",
    )
    ssl_certfile: str | None = option(
        None,
        "client certificate (PEM) for TLS client authentication",
        group="security",
        to="security.ssl_certfile",
    )
    ssl_keyfile: str | None = option(
        None,
        "client key (PEM); its password only from STREAMER_SSL_PASSWORD(_FILE)",
        group="security",
        to="security.ssl_keyfile",
    )

    # ---- training ----------------------------------------------------------------------------
    batch_size: int = option(256, "training batch size", group="training")
    steps_per_execution: int = option(
        1,
        "training steps per call of the compiled step function, as Keras' steps_per_execution: "
        "the batches are taken from tf.data inside the graph, so the main interpreter's "
        "per-step Python is paid once per call (each step is still Keras' train_step with its "
        "own non-finite guard; its records are acknowledged when the call returns, before any "
        "checkpoint; stops and --max-steps take effect between calls)",
        group="training",
    )
    schema: str | None = option(
        None, "schema file (TOML or JSON); unset = the simulator's schema", group="training"
    )
    model: str | None = option(
        None,
        "model factory package.module:function (gets the schema); unset = the built-in MLP",
        group="training",
    )
    decoder: DecoderChoice = option(
        "auto",
        "msgpack decoder: auto (the compiled fast path, the GIL released, where it is built and "
        "every feature is a fixed-shape number; the pure-Python reference decides every other "
        "record, with the same results) or python (the reference alone)",
        group="training",
    )
    max_reject_fraction: float = option(
        0.5,
        "stop (exit 4) without committing past them when more than this share of the last "
        "1,000 records (20 at least) was rejected by the decoder: a wrong schema or a bad "
        "producer deploy, not a stray bad record; 1 turns the breaker off",
        group="training",
    )
    sample_weight: str | None = option(
        None,
        "the schema feature (a numeric scalar) given to Keras as sample_weight, never to the "
        "model; unset = the schema's weight, if any",
        group="training",
    )
    max_nonfinite_steps: int = option(
        20,
        "stop (exit 3, the last good checkpoint kept) after this many steps in a row whose "
        "loss or gradients were not finite and so were not applied: the model diverges",
        group="training",
    )
    learning_rate: float = option(0.001, "learning rate of the built-in model", group="training")
    jit_compile: bool = option(False, "compile the train step with XLA", group="training")
    mixed_precision: bool = option(False, "train with mixed_float16", group="training")
    pass_records: int | None = option(
        None, "end a pass after this many records (consumers are reopened)", group="training"
    )
    pass_seconds: float | None = option(
        None, "end a pass after this many seconds", group="training"
    )
    idle_timeout: float = option(
        10.0, "end a pass when no record came for this many seconds", group="training"
    )
    max_steps: int | None = option(None, "stop after this many training steps", group="training")
    stop_after_idle: float | None = option(
        None, "stop when no record came for this many seconds", group="training"
    )
    commit_every_steps: int = option(50, "send offset commits every N steps", group="training")
    commit_every_seconds: float = option(
        5.0, "... or every this many seconds, whichever comes first", group="training"
    )
    checkpoint_dir: str | None = option(
        None,
        "checkpoint directory (model + optimizer + step + offsets), one worker's only: the "
        "worker holds a lease on it (streamer-lease.json) and a second worker is refused "
        "(exit 2); unset = no checkpoints",
        group="training",
    )
    # A save costs 25-40 ms (built-in model) to ~0.3 s (100 MB of weights); a kill -9 retrains
    # what was trained since the last checkpoint: docs/how-to/tuning.md, checkpoint cadence.
    checkpoint_every_steps: int = option(2000, "checkpoint every N steps", group="training")
    checkpoint_every_seconds: float = option(
        30.0, "... or every this many seconds, whichever comes first", group="training"
    )
    checkpoint_failure_seconds: float = option(
        600.0,
        "how long checkpoints may keep failing (a full or read-only disk; retried with "
        "back-off, commits waiting for them) before the worker stops with exit 1 rather than "
        "train records it cannot save; 0: never stop",
        group="training",
    )
    checkpoint_keep: int = option(3, "checkpoints to keep", group="training")
    audit_log: str | None = option(
        None,
        "append topic,partition,offset of every trained sample to this file (flushed at each "
        "commit)",
        group="training",
    )
    shutdown_timeout: float = option(
        25.0,
        "seconds allowed for a clean stop after SIGTERM/SIGINT (below Kubernetes' 30 s grace)",
        group="training",
    )
    seed: int | None = option(None, "random seed for TensorFlow", group="training")

    # ---- online ------------------------------------------------------------------------------
    shuffle_buffer: int = option(
        0,
        "mix records across partitions and blocks in a window of this many records before "
        "batching (0: off)",
        group="online",
    )
    start_from: str = option(
        "committed",
        "where a run starts: committed, earliest, latest, an ISO 8601 time or unix milliseconds",
        group="online",
    )
    eval_topic: str | None = option(
        None, "held-out topic read by its own shards, never committed", group="online"
    )
    eval_every_steps: int = option(500, "evaluate every N steps", group="online")
    eval_every_seconds: float | None = option(
        None,
        "... or when this many seconds passed since the last evaluation (unset: steps only)",
        group="online",
    )
    eval_records: int = option(2048, "records per evaluation", group="online")
    logdir: str | None = option(
        None,
        "TensorBoard log directory (scalars; profiler traces go here too); viewing it needs "
        "the tensorboard extra (TensorFlow does not install TensorBoard)",
        group="online",
    )
    export_dir: str | None = option(
        None,
        "export SavedModel versions here in TF Serving's layout (<dir>/<version>/)",
        group="online",
    )
    export_every_steps: int = option(
        1000, "export every N steps (and at a clean stop)", group="online"
    )
    export_keep: int = option(3, "exported versions to keep", group="online")
    profile_steps: str | None = option(
        None, "capture a TensorFlow Profiler trace for steps A:B into --logdir", group="online"
    )

    # ---- multi-worker (issue 15: one model on N workers; streamer/cluster/worker.py) -------------
    cluster_workers: str | None = option(
        None,
        "train one model on N workers (MultiWorkerMirroredStrategy) described by their "
        "host:port list, comma-separated, worker 0 (the chief) first, instead of TF_CONFIG "
        "(which, when set, describes the cluster; never both)",
        group="multi-worker",
    )
    worker_index: int | None = option(
        None,
        "this worker's place in --cluster-workers",
        group="multi-worker",
        shown="$JOB_COMPLETION_INDEX",
    )
    pad_after_seconds: float = option(
        0.5,
        "multi-worker: a batch still short of --batch-size records after this many seconds is "
        "completed with weight-0 padding, so a worker whose partitions are quiet never holds "
        "the others up for longer",
        group="multi-worker",
    )
    peer_stop_exit_code: int = option(
        0,
        "multi-worker: exit code of a worker that checkpointed and stopped because another "
        "worker was stopped (SIGTERM); 75 under a Kubernetes JobSet, so that one evicted pod "
        "restarts the whole set instead of completing it",
        group="multi-worker",
    )

    # ---- simulator ---------------------------------------------------------------------------
    sim_partitions: int = option(4, "embedded simulator: virtual partitions", group="simulator")
    sim_rate: float | None = option(
        None,
        "embedded simulator: records/s per shard (unset: as fast as possible)",
        group="simulator",
    )
    sim_record_bytes: int = option(
        0, "embedded simulator: pad records to about this size", group="simulator"
    )
    sim_task: SimTask = option(
        "regression",
        "embedded simulator: the task (regression: the built-in model learns it; recommender: "
        "a user id string, a list of item ids and a dense vector, for a model of your own such "
        "as examples.recommender:build); with --schema, random records of that schema instead",
        group="simulator",
    )

    # ---- operations --------------------------------------------------------------------------
    metrics_host: str = option(
        "127.0.0.1",
        "bind address of /metrics, /healthz, /readyz (0.0.0.0 in the container image)",
        group="operations",
    )
    metrics_port: int = option(
        9464, "port of /metrics, /healthz, /readyz; 0 disables the server", group="operations"
    )
    stall_timeout: float = option(
        120.0,
        "/healthz fails when the trainer finished no step (multi-worker: no round of the "
        "cluster) for this many seconds while not waiting for input",
        group="operations",
    )
    log_level: LogLevel = option("INFO", "log level", group="operations")
    log_format: LogFormat = option("text", "log line format", group="operations")
    status_interval: float = option(
        10.0,
        "seconds between progress log lines (a live status line on a terminal)",
        group="operations",
    )


# ---- the derived view: what the CLI, the environment and TOML files need -----------------------


def _bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("true or false")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError as exc:
        raise ValueError("a comma-separated list of partition numbers, e.g. 0,1,2") from exc


@dataclass(frozen=True, slots=True)
class Option:
    """One option as the outside sees it: flag, variable, TOML key, parser, allowed values.

    >>> OPTIONS_BY_NAME["kafka_client"].flag, OPTIONS_BY_NAME["kafka_client"].env
    ('--kafka-client', 'STREAMER_KAFKA_CLIENT')
    >>> OPTIONS_BY_NAME["isolation_level"].choices
    ('read_committed', 'read_uncommitted')
    """

    name: str
    parse: Callable[[str], Any]
    kind: type  # int, float, bool, str or tuple (a list of ints)
    default: Any
    help: str
    group: str
    choices: tuple[str, ...] | None = None
    to: str | None = None
    shown: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _option_of(f: Field[Any], hint: Any) -> Option:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any]
    kind: type
    if typing.get_origin(hint) is Literal:
        choices, kind, parse = tuple(args), str, str
    elif hint is bool:
        kind, parse = bool, _bool
    elif typing.get_origin(hint) is tuple:
        kind, parse = tuple, _int_list
    else:
        kind, parse = hint, hint
    meta = f.metadata
    return Option(
        f.name,
        parse,
        kind,
        f.default,
        meta["help"],
        meta["group"],
        choices,
        meta["to"],
        meta["shown"],
    )


def _options() -> tuple[Option, ...]:
    hints = typing.get_type_hints(Options)
    return tuple(_option_of(f, hints[f.name]) for f in fields(Options))


OPTIONS: tuple[Option, ...] = _options()
OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
