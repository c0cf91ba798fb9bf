"""The ``streamer`` command: run the worker, replay a range, simulate a producer, show a group's
lag and reset it."""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from consumers.errors import ConfigError, StreamerError

if TYPE_CHECKING:
    from consumers.settings import SecuritySettings
    from streamer.config import WorkerConfig
    from streamer.input.simulator import Task

__all__ = ["main"]

log = logging.getLogger(__name__)

#: The options of ``streamer run`` that say how to reach and log in to Kafka: every command
#: that talks to Kafka takes them, from flags, STREAMER_* and --config alike.
CONNECTION_OPTIONS = (
    "bootstrap",
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
)
#: The tools that talk to Kafka need a broker: their --bootstrap has no simulator fallback.
_CONNECTION_HELPS = {
    "bootstrap": "Kafka bootstrap servers host:port[,host:port]; required "
    "[env STREAMER_BOOTSTRAP; TOML bootstrap]",
}

#: Kafka's compression codecs, all readable by the worker (DESIGN section 3).
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
_ALL_MODES = "default"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """The library never configures logging; the CLI does, once."""
    from consumers.redact import RedactingFilter
    from streamer.ops.status import LiveLineHandler

    # On a terminal a record never lands on the live status line (it moves out of the way).
    handler = LiveLineHandler(sys.stderr)
    # Whatever level a logger runs at, no Kafka secret reaches the output: the handler masks
    # the values the client adapters registered (consumers/redact.py) in every record.
    handler.addFilter(RedactingFilter())
    # A broker that is down, unreachable or restarting makes kafka-python log every failed
    # connection, backoff and lost coordinator (about 90 lines before the one error that
    # says what happened). The worker reports those conditions itself (one line per retry
    # at most, readiness, one final error): the library's transport lines are DEBUG.
    handler.addFilter(_TransportNoise(logging.getLevelName(level)))
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kafka-python is chatty at INFO (every connection and rebalance step), and at DEBUG logs
    # every request (the SASL login among them) and its admin client's configuration.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("confluent_kafka").setLevel(max(logging.WARNING, root.level))
    # TensorFlow's Python loggers at INFO: every collective multi-worker training builds,
    # "Assets written to ..." at every export, absl's "Sharding callback duration" at every
    # checkpoint.
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # "Task ran for 0.1s ... blocking the event loop": kafka-python's IO thread noticing that
    # another thread held the GIL (decode, training). Expected in a busy worker, not an error.
    logging.getLogger("kafka.net.selector").setLevel(max(logging.ERROR, root.level))
    # "Metadata refresh: failed Cancelled": a consumer closed (every pass end, every
    # evaluation) while its metadata request was in flight. Not a failure.
    logging.getLogger("kafka.cluster").addFilter(_drop_cancelled_refresh)


#: kafka-python's loggers of connections, bootstrap, metadata and the coordinator's
#: connection: their WARNING/ERROR lines repeat what the worker reports once.
_TRANSPORT_LOGGERS = (
    "kafka.net",
    "kafka.conn",
    "kafka.client",
    "kafka.cluster",
    "kafka.protocol",
)
#: Lines of other kafka-python loggers that only say a connection dropped.
_TRANSPORT_TEXT = (
    "Node Disconnected",
    "NodeNotReadyError",
    "KafkaConnectionError",
    "Connection lost",
    "Cancelled",
    "Marking the coordinator dead",
    "NotCoordinatorError",
    "CoordinatorNotAvailableError",
    "Unable to bootstrap",
    # A static member's heartbeat racing its own rejoin: the next heartbeat carries the new id.
    "member_id was not recognized",
)


class _TransportNoise(logging.Filter):
    """kafka-python's transport lines at DEBUG: shown only with --log-level DEBUG."""

    def __init__(self, level: int | str) -> None:
        super().__init__()
        self.debug = level == logging.DEBUG or level == "DEBUG"

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if not name.startswith("kafka") or record.levelno < logging.WARNING:
            return True
        transport = name.startswith(_TRANSPORT_LOGGERS) or any(
            t in record.getMessage() for t in _TRANSPORT_TEXT
        )
        if not transport:
            return True
        if not self.debug:
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def _drop_cancelled_refresh(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not ("Metadata refresh" in message and "Cancelled" in message)


def _quiet_tensorflow() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _load_tensorflow() -> None:
    """Every impossible setting has failed by now: load TensorFlow, without its noise."""
    from streamer.ops.tfstart import load_tensorflow

    load_tensorflow()


class _Parser(argparse.ArgumentParser):
    """argparse with the habits of a careful CLI: no abbreviations (``--max-step`` is not
    ``--max-steps``), and an error that is one line with a suggestion, not the whole usage."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        hint = self._suggestion(message)
        self.exit(2, f"{self.prog}: error: {message}{hint}\n(see {self.prog} --help)\n")

    def _suggestion(self, message: str) -> str:
        if "unrecognized arguments:" not in message:
            return ""
        known = [o for action in self._actions for o in action.option_strings]
        tips = []
        for token in message.split("unrecognized arguments:", 1)[1].split():
            if not token.startswith("-"):
                continue
            close = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                tips.append(f"{token} -> {close[0]}")
        return f"; did you mean: {', '.join(tips)}?" if tips else ""


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``streamer`` parser and each command's own (whose usage its errors show)."""
    from streamer import __version__
    from streamer.cli.arguments import add_run_arguments
    from streamer.cli.replay import DESCRIPTION, NOT_FOR_REPLAY, RUN_OPTION_HELPS
    from streamer.config import OPTIONS
    from streamer.config.replay import COMMIT_METADATA, RANGE_FORMS

    parser = _Parser(
        prog="streamer",
        description="Train a TensorFlow model continuously on msgpack records from Kafka.",
    )
    parser.add_argument("--version", action="version", version=f"streamer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser(
        "run",
        help="run the worker (with no --bootstrap: on the embedded simulator)",
        description=(
            "Run the long-running training worker. Every option can also come from a TOML config "
            "file (--config) and from STREAMER_* environment variables; flags win over the "
            "environment, which wins over the file. Secrets only from the environment: "
            "STREAMER_SASL_PASSWORD or STREAMER_SASL_PASSWORD_FILE, STREAMER_SSL_PASSWORD(_FILE)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(run)
    run.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective settings after the config file, STREAMER_* and the flags, "
        "with where each came from (secrets masked), and exit",
    )

    replay = sub.add_parser(
        "replay",
        help="train a separate model on a bounded range of the topic and stop (touches nothing "
        "of the live worker)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument(
        "--from",
        dest="replay_from",
        metavar="FROM",
        required=True,
        help=f"start of the range: {RANGE_FORMS}",
    )
    replay.add_argument(
        "--to",
        dest="replay_to",
        metavar="TO",
        required=True,
        help=f"end of the range, not included: {RANGE_FORMS}; after --from",
    )
    replay.add_argument(
        "--restore-from",
        default=None,
        metavar="DIR",
        help="start from the newest checkpoint in DIR (model, optimizer and step; read, never "
        "written) [default: a new model]",
    )
    replay.add_argument(
        "--replay-group",
        default=None,
        metavar="GROUP",
        help="commit the replay's progress to this consumer group (each commit's metadata "
        f"says {COMMIT_METADATA!r}); refused when the group has members or commits that no "
        "replay wrote [default: commit to no group]",
    )
    replay.add_argument(
        "--force-replay-into-live-group",
        action="store_true",
        help="with --replay-group: commit even into a group that has members or a live "
        "worker's commits, overwriting the live worker's position (dangerous)",
    )
    add_run_arguments(
        replay, RUN_OPTION_HELPS, only=[o.name for o in OPTIONS if o.name not in NOT_FOR_REPLAY]
    )
    for name in ("group", "start_from"):  # refused by name, with what to use instead
        replay.add_argument("--" + name.replace("_", "-"), dest=name, help=argparse.SUPPRESS)

    sim = sub.add_parser(
        "simulate",
        help="produce simulator samples into a topic (creates it if missing)",
        description="Produce samples of the simulator's learnable task into a Kafka topic.",
    )
    add_run_arguments(sim, _CONNECTION_HELPS, only=CONNECTION_OPTIONS)
    sim.add_argument("--topic", required=True, help="topic to produce to (created if missing)")
    sim.add_argument(
        "--records",
        type=int,
        default=10_000,
        help="records to produce; 0 = forever [default: 10000]",
    )
    sim.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions of a topic it creates; an existing topic keeps its own (a warning "
        "says so when they differ) [default: 4]",
    )
    sim.add_argument(
        "--rate", type=float, default=None, help="records per second [default: as fast as possible]"
    )
    sim.add_argument(
        "--record-bytes",
        type=int,
        default=0,
        help="pad records to about this many bytes [default: 0, ~80 B]",
    )
    sim.add_argument("--seed", type=int, default=0, help="random seed [default: 0]")
    sim.add_argument(
        "--compression",
        default="none",
        type=str.lower,  # any case, as the run options take them
        choices=CODECS,
        help="compress the produced batches with this codec [default: none]",
    )
    sim.add_argument(
        "--task",
        default="regression",
        type=str.lower,  # any case, as the run options take them
        choices=("regression", "recommender"),
        help="regression: a 16-float vector and its label, which the built-in model learns; "
        "recommender: a user id string, 0-50 item ids and a 16-float vector with a learnable "
        "rating (train it with --model examples.recommender:build) [default: regression]",
    )
    sim.add_argument(
        "--schema",
        default=None,
        help="produce random valid records of this schema file (TOML or JSON) instead of a task",
    )
    sim.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level, in any case [default: INFO]",
    )

    lag = sub.add_parser(
        "lag",
        help="a consumer group's committed offset, end offset and lag per partition",
        description="Show a group's committed offset, end offset and lag per partition, from outside the worker.",
    )
    add_run_arguments(lag, _CONNECTION_HELPS, only=CONNECTION_OPTIONS)
    lag.add_argument("--group", required=True, help="consumer group id")
    lag.add_argument(
        "--topic", default=None, help="only this topic [default: every topic the group committed]"
    )
    lag.add_argument(
        "--isolation-level",
        default="read_committed",
        type=str.lower,  # any case, as the run options take them
        choices=("read_committed", "read_uncommitted"),
        help="END is what a consumer of this isolation level can read: the last stable offset "
        "(read_committed, the worker's default) or the log end (read_uncommitted, what "
        "kafka-consumer-groups shows); they differ only while a transaction is open "
        "[default: read_committed]",
    )
    lag.add_argument("--json", action="store_true", help="print JSON instead of a table")
    launch = sub.add_parser(
        "launch",
        help="start N workers of one model on this host (multi-worker training, for demos)",
        description=(
            "Start N `streamer run` processes that train one model together "
            "(MultiWorkerMirroredStrategy), each with its own TF_CONFIG on free local ports. "
            "Everything after -- goes to each worker; {index} in it becomes the worker's index "
            "(e.g. --audit-log audit-{index}.csv), and a non-zero --metrics-port P becomes "
            "P + index. SIGTERM/SIGINT go to every worker; the exit code is the first non-zero "
            "one of the workers."
        ),
    )
    launch.add_argument("--workers", type=int, required=True, help="number of workers")
    launch.add_argument(
        "--host", default="127.0.0.1", help="address the workers listen on [default: 127.0.0.1]"
    )
    launch.add_argument(
        "run_args", nargs=argparse.REMAINDER, help="-- then the options of `streamer run`"
    )

    reset = sub.add_parser(
        "reset-group",
        help="move a stopped consumer group's committed offsets to a time, the earliest or "
        "the latest records (a dry run unless --execute)",
        description=(
            "Show, and with --execute commit, new offsets of a consumer group on a topic: the "
            "first record at or after a time (inclusive), or the topic's earliest or latest "
            "offsets, as Kafka's kafka-consumer-groups --reset-offsets does. The group must "
            "have no members (stop its workers first). A worker with --checkpoint-dir starts "
            "from its checkpoint, not from the group's offsets: move it with --start-from."
        ),
    )
    add_run_arguments(reset, _CONNECTION_HELPS, only=CONNECTION_OPTIONS)
    reset.add_argument("--group", required=True, help="consumer group id")
    reset.add_argument("--topic", required=True, help="the topic whose offsets move")
    reset.add_argument(
        "--to",
        dest="reset_to",
        metavar="TO",
        required=True,
        help=f"where the group resumes: {RANGE_FORMS}; a partition with no record at or after "
        "a time resumes at its end",
    )
    reset.add_argument(
        "--execute", action="store_true", help="commit the new offsets [default: a dry run]"
    )

    bench = sub.add_parser(
        "bench",
        help="measure raw kafka-python, a naive pipeline, ours and the worker on one topic",
        description=(
            "Fill a fresh topic with simulator records (unless --topic is given), then measure, "
            "alternating and repeated so drift cancels: raw (a plain kafka-python poll loop), naive "
            "(one record per generator call and per numpy_function), pipeline (ours, input only, "
            "thread shards), pipeline-process (the same with process shards) and worker (ours "
            "with the default model). Prints a table, or JSON with --json."
        ),
    )
    add_run_arguments(bench, _CONNECTION_HELPS, only=CONNECTION_OPTIONS)
    bench.add_argument(
        "--records", type=int, default=100_000, help="records in the topic [default: 100000]"
    )
    bench.add_argument(
        "--record-bytes",
        type=int,
        default=None,
        help="record size in bytes [default: 1024; with --schema or --task: the records as "
        "they are]",
    )
    bench.add_argument(
        "--shards", type=int, default=4, help="shards of the pipeline and worker [default: 4]"
    )
    bench.add_argument("--repeats", type=int, default=3, help="rounds of all modes [default: 3]")
    bench.add_argument(
        "--topic", default=None, help="measure an existing topic instead of filling a new one"
    )
    bench.add_argument(
        "--modes",
        default=_ALL_MODES,
        help="comma-separated subset of raw (a plain kafka-python poll loop), naive (one record "
        "per generator call and numpy_function), pipeline (ours, thread shards), "
        "pipeline-shuffle (a 10,000-record shuffle window), pipeline-process (shards in child "
        "processes), worker (the default model, thread shards), worker-process (the same, "
        "shards in child processes), raw-confluent, pipeline-confluent, "
        "pipeline-confluent-process, worker-confluent and worker-confluent-process (the same "
        "with confluent-kafka) "
        "[default: the seven kafka-python modes; with --schema or --task the four that take "
        "any schema: raw, pipeline, pipeline-shuffle, pipeline-process]",
    )
    bench.add_argument(
        "--naive-records",
        type=int,
        default=20_000,
        help="records read by the slow naive mode [default: 20000]",
    )
    bench.add_argument(
        "--soak-seconds",
        type=float,
        default=0.0,
        help="after the modes, read the topic through the pipeline again and again for this "
        "long and report resident memory at start and end (a leak check) [default: 0, off]",
    )
    bench.add_argument(
        "--soak-client",
        default="kafka-python",
        type=str.lower,  # any case, as the run options take them
        choices=("kafka-python", "confluent"),
        help="Kafka client of the memory soak (thread shards) [default: kafka-python]",
    )
    bench.add_argument(
        "--compression",
        default="none",
        help="codec of the filled topic, or a comma-separated list of them (one topic each, "
        f"every mode measured on each, and each codec's rate against the first): "
        f"{', '.join(CODECS)} [default: none]",
    )
    bench.add_argument(
        "--schema",
        default=None,
        help="fill the topic with random records of this schema file and measure "
        "raw,pipeline,pipeline-shuffle,pipeline-process on it and, alternating, on fixed-shape "
        "regression records of the same mean size (the fixed: modes, and ratios to them)",
    )
    bench.add_argument(
        "--task",
        default=None,
        type=str.lower,  # any case, as the run options take them
        choices=("regression", "recommender"),
        help="like --schema, with the records of a simulator task",
    )
    bench.add_argument(
        "--scaling",
        action="store_true",
        help="the scaling table instead of the default modes: the pipeline with 1 and 2 shards "
        "in threads and in child processes, on each client (mode@N), and the decode-only and "
        "TensorFlow-only ceilings over the same records, alternating",
    )
    bench.add_argument(
        "--decoders",
        default="auto",
        metavar="D1,D2",
        help="measure every mode with each of these --decoder values, alternating: auto (the "
        "compiled fast path where it takes the schema), python (the reference alone); a mode "
        "with a decoder other than auto is named mode/decoder [default: auto]",
    )
    bench.add_argument(
        "--freshness-rates",
        default="",
        metavar="R1,R2",
        help="after the modes, for each rate (records/s) and client: a producer writes 1 KiB "
        "records at that rate into a fresh topic while the worker trains it live; reports "
        "p50/p90/p99 of streamer_record_age_at_train_seconds [default: none]",
    )
    bench.add_argument(
        "--freshness-seconds",
        type=float,
        default=20.0,
        help="how long each freshness producer writes [default: 20]",
    )
    bench.add_argument(
        "--steps-per-execution",
        default="1",
        metavar="K1,K2",
        help="run every worker and pipeline mode with each of these --steps-per-execution "
        "values, alternating (a pipeline mode then takes its batches in a compiled loop, as "
        "such a worker does); a value other than 1 is the mode's suffix (worker-process+spe8) "
        "[default: 1]",
    )
    bench.add_argument(
        "--ceiling-cores",
        type=int,
        default=16,
        metavar="N",
        help="the host the cost table projects to: the ceiling of one worker on N cores, the "
        "lower of 1 / (main-interpreter GIL us per record) and N / (CPU us per record of all "
        "its processes) [default: 16]",
    )
    bench.add_argument(
        "--json", action="store_true", help="print one JSON object instead of a table"
    )
    commands = {"run": run, "replay": replay, "simulate": sim, "lag": lag, "bench": bench}
    return parser, {**commands, "reset-group": reset, "launch": launch}


def _cmd_bench(args: argparse.Namespace) -> int:
    configure_logging("WARNING")
    _load_tensorflow()
    from streamer.bench import (
        CEILINGS,
        DEFAULT_MODES,
        MODES,
        SCALING_MODES,
        SCHEMA_MODES,
        format_table,
        run_bench,
    )

    modes = (
        DEFAULT_MODES
        if args.modes == _ALL_MODES
        else tuple(m.strip() for m in args.modes.split(",") if m.strip())
    )
    task: Task | None = None
    task_name: str | None = None
    if args.scaling:
        modes = SCALING_MODES
    allowed: tuple[str, ...] = MODES + CEILINGS
    if args.schema is not None and args.task is not None:
        raise ConfigError("task", args.task, "either --schema or --task, not both")
    if args.schema is not None or args.task is not None:
        from streamer.decode.schema import Schema
        from streamer.input.simulator import RandomRecords, task_named

        if args.schema is not None:
            task, task_name = RandomRecords(Schema.from_file(args.schema)), args.schema
        else:
            task, task_name = task_named(args.task), f"task {args.task}"
        if args.modes == _ALL_MODES:
            modes = SCHEMA_MODES
        allowed = SCHEMA_MODES
    for m in modes:
        base, _, n = m.partition("@")
        if base not in allowed or (n and not (n.isdigit() and int(n) >= 1)):
            raise ConfigError(
                "modes", m, f"one of {', '.join(allowed)}, optionally @N for N shards"
            )
    try:
        rates = tuple(float(r) for r in args.freshness_rates.split(",") if r.strip())
    except ValueError as exc:
        raise ConfigError(
            "freshness_rates", args.freshness_rates, "records/s, comma-separated"
        ) from exc
    record_bytes = args.record_bytes
    if record_bytes is None:
        record_bytes = 0 if task is not None else 1024
    for name in ("records", "shards", "repeats", "naive_records", "ceiling_cores"):
        if getattr(args, name) < 1:
            raise ConfigError(name, getattr(args, name), "a positive integer")
    codecs = tuple(c.strip() for c in args.compression.split(",") if c.strip())
    for c in codecs:
        if c not in CODECS:
            raise ConfigError("compression", c, f"one of {', '.join(CODECS)}")
    if not codecs or len(set(codecs)) != len(codecs):
        raise ConfigError("compression", args.compression, "distinct codecs, comma-separated")
    if args.topic and len(codecs) > 1:
        raise ConfigError("compression", args.compression, "one codec with --topic")
    if task is not None and len(codecs) > 1:
        raise ConfigError("compression", args.compression, "one codec with --schema or --task")
    if task is not None and args.steps_per_execution.strip() != "1":
        raise ConfigError(
            "steps_per_execution", args.steps_per_execution, "1 with --schema or --task"
        )
    decoders = tuple(d.strip().lower() for d in args.decoders.split(",") if d.strip())
    if not decoders or len(set(decoders)) != len(decoders) or set(decoders) - {"auto", "python"}:
        raise ConfigError("decoders", args.decoders, "auto and/or python, comma-separated")
    try:
        spes = tuple(int(k) for k in args.steps_per_execution.split(",") if k.strip())
    except ValueError:
        spes = ()
    if not spes or min(spes) < 1 or len(set(spes)) != len(spes):
        raise ConfigError(
            "steps_per_execution", args.steps_per_execution, "positive integers, comma-separated"
        )
    bootstrap, security = _connection(args)
    result = run_bench(
        bootstrap,
        records=args.records,
        record_bytes=record_bytes,
        shards=args.shards,
        repeats=args.repeats,
        topic=args.topic,
        modes=modes,
        naive_records=args.naive_records,
        soak_seconds=args.soak_seconds,
        soak_client=args.soak_client,
        codecs=codecs,
        task=task,
        task_name=task_name,
        freshness_rates=rates,
        freshness_seconds=args.freshness_seconds,
        decoders=decoders,
        security=security,
        steps_per_execution=spes,
    )
    result.ceiling_cores = args.ceiling_cores
    summary = result.summary()
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from streamer.config import load_config, print_config

    params = {k: v for k, v in vars(args).items() if k not in ("command", "print_config")}
    sources: dict[str, str] = {}
    config = load_config(params, sources=sources)
    if args.print_config:
        print_config(config, sources, sys.stdout)
        return 0
    configure_logging(config.log_level, config.log_format)
    return _run_worker(config)


def _run_worker(config: WorkerConfig) -> int:
    """The worker, or with TF_CONFIG / --cluster-workers naming several workers, one worker
    of a model trained on all of them (streamer/cluster/worker.py)."""
    from streamer.cluster.topology import topology_from

    topology = topology_from(
        os.environ, cluster_workers=config.cluster_workers, worker_index=config.worker_index
    )
    if topology is not None and topology.count > 1:
        from streamer.ops.tfstart import load_tensorflow

        load_tensorflow(devices=False)
        from streamer.cluster.worker import DistributedWorker

        worker = DistributedWorker(config, topology)
        code = worker.run()
        if worker.exit_now:  # a lost peer: TensorFlow's collective runtime may never let go
            logging.shutdown()
            os._exit(code)
        _exit_guard(code, config.shutdown_timeout)
        return code
    _load_tensorflow()
    from streamer.worker import Worker

    code = Worker(config).run()
    _exit_guard(code, config.shutdown_timeout)
    return code


def _cmd_launch(args: argparse.Namespace) -> int:
    configure_logging("INFO")
    from streamer.cluster.launch import launch

    run_args = list(args.run_args)
    if run_args[:1] == ["--"]:
        run_args = run_args[1:]
    return launch(args.workers, run_args, host=args.host)


def _exit_guard(code: int, seconds: float) -> None:
    """The worker is done; if some library thread keeps the interpreter from exiting, exit anyway.

    SIGINT and SIGTERM are ignored from here on: the stop is over, and a late copy of the one
    that asked for it (a terminal's Ctrl-C reaches the process two or three times) must not
    turn a clean exit into death by signal. A Python-level handler would not do: the
    interpreter's finalization puts the default action back (a copy landing then killed the
    process with SIGINT, exit -2, in CI); an ignored signal stays ignored. The exit itself is
    bounded by this guard.
    """
    import signal
    import threading

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)

    def guard() -> None:
        import time

        time.sleep(seconds)
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=guard, name="streamer-exit-guard", daemon=True).start()


def _cmd_replay(args: argparse.Namespace) -> int:
    import dataclasses

    from streamer.cli.replay import REPLAY_ONLY
    from streamer.config import load_config
    from streamer.config.replay import ReplaySpec, check_outputs, check_replay_group

    # Everything that can be checked without Kafka first: impossible input fails at once.
    if args.group is not None:
        raise ConfigError(
            "group",
            args.group,
            "replay commits to no group; name one of its own with --replay-group",
        )
    if args.start_from is not None:
        raise ConfigError("start_from", args.start_from, "replay starts at --from")
    spec = ReplaySpec.parse(
        args.replay_from,
        args.replay_to,
        group=args.replay_group,
        force_live_group=args.force_replay_into_live_group,
        restore_from=args.restore_from,
    )
    params = {k: v for k, v in vars(args).items() if k not in REPLAY_ONLY}
    config = load_config(params, replay=spec)
    if config.bootstrap is None:
        raise ConfigError(
            "bootstrap",
            None,
            "replay reads a Kafka topic: give --bootstrap, bootstrap in --config, or "
            "STREAMER_BOOTSTRAP",
        )
    check_outputs(
        spec,
        checkpoint_dir=config.checkpoint_dir,
        export_dir=config.export_dir,
        audit_log=config.audit_log,
    )
    configure_logging(config.log_level, config.log_format)
    if not config.partitions:
        from consumers.admin import wait_for_topic

        parts = wait_for_topic(
            config.consumer_settings(),
            broker_wait_seconds=config.broker_wait_seconds,
            topic_wait_seconds=0,
        )
        config = dataclasses.replace(config, partitions=tuple(parts))
    check_replay_group(config.consumer_settings(), spec)
    if config.replay is not None and config.replay.ignored:
        log.info(
            "replay: not using the live worker's %s from the config file or environment "
            "(a replay takes its outputs from its own command line only)",
            ", ".join(config.replay.ignored),
        )
    _load_tensorflow()
    from streamer.worker import Worker

    code = Worker(config).run()
    _exit_guard(code, config.shutdown_timeout)
    return code


def _connection(args: argparse.Namespace) -> tuple[str, SecuritySettings]:
    """Bootstrap servers and security settings of a command that talks to Kafka, from its
    flags, STREAMER_* and --config, as ``streamer run`` reads them."""
    from streamer.config import load_config

    params = {n: getattr(args, n, None) for n in CONNECTION_OPTIONS}
    params["config"] = getattr(args, "config", None)
    config = load_config(params)
    if config.bootstrap is None:
        raise ConfigError(
            "bootstrap",
            None,
            f"streamer {args.command} talks to Kafka: give --bootstrap, bootstrap in --config, "
            "or STREAMER_BOOTSTRAP",
        )
    return config.bootstrap, config.security_settings()


def _cmd_simulate(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    from streamer.input.simulator import RandomRecords, produce, task_named

    if args.records < 0:
        raise ConfigError("records", args.records, "0 (forever) or a positive count")
    if args.partitions is not None and args.partitions < 1:
        raise ConfigError("partitions", args.partitions, "a positive integer")
    if args.schema is not None:
        from streamer.decode.schema import Schema

        task: Task = RandomRecords(Schema.from_file(args.schema))
    else:
        task = task_named(args.task)
    bootstrap, security = _connection(args)
    total = args.records or None  # 0: until Ctrl-C
    produce(
        bootstrap,
        args.topic,
        total,
        partitions=args.partitions,
        rate=args.rate,
        record_bytes=args.record_bytes,
        seed=args.seed,
        compression=args.compression,
        task=task,
        security=security,
    )
    return 0


def _cmd_lag(args: argparse.Namespace) -> int:
    configure_logging("WARNING")
    from consumers.admin import group_activity, group_lag

    bootstrap, security = _connection(args)
    rows = group_lag(
        bootstrap,
        args.group,
        args.topic,
        isolation_level=args.isolation_level,
        security=security,
    )
    note = None
    if all(r.committed is None for r in rows):
        known = group_activity(bootstrap, args.group, security=security).known
        what = "no committed offsets" + (f" on {args.topic}" if args.topic else "")
        note = f"group {args.group!r} has {what}" + ("" if known else " (unknown group)")
        if args.topic is None:
            print(f"streamer: {note}", file=sys.stderr)
            return 1
        note += f": its lag is the whole topic, from offset 0 ({sum(r.lag for r in rows)})"
    if args.json:
        out: dict[str, object] = {
            "group": args.group,
            "partitions": [r.as_dict() for r in rows],
        }
        if note is not None:
            out["note"] = note
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'TOPIC':<30} {'PARTITION':>9} {'COMMITTED':>12} {'END':>12} {'LAG':>10}")
    for r in rows:
        committed = "-" if r.committed is None else str(r.committed)
        print(f"{r.topic:<30} {r.partition:>9} {committed:>12} {r.end:>12} {r.lag:>10}")
    print(f"{'TOTAL':<30} {'':>9} {'':>12} {'':>12} {sum(r.lag for r in rows):>10}")
    if note is not None:
        print(f"note: {note}")
    return 0


def _cmd_reset_group(args: argparse.Namespace) -> int:
    configure_logging("WARNING")
    from consumers.admin import group_activity, reset_group
    from consumers.errors import GroupActiveError
    from consumers.positions import start_offsets
    from consumers.settings import ConsumerSettings
    from streamer.config.replay import parse_bound

    position = parse_bound(args.reset_to, "to")
    bootstrap, security = _connection(args)
    activity = group_activity(bootstrap, args.group, security=security)
    if activity.members:
        raise GroupActiveError(args.group, activity.members)
    settings = ConsumerSettings(
        bootstrap_servers=bootstrap, topic=args.topic, group_id=args.group, security=security
    )
    new = start_offsets(settings, position)
    current = {p: offset for p, (offset, _meta) in activity.committed_on(args.topic).items()}
    print(f"{'GROUP':<30} {'TOPIC':<30} {'PARTITION':>9} {'CURRENT':>12} {'NEW':>12}")
    for p in sorted(new):
        now = "-" if current.get(p) is None else str(current[p])
        print(f"{args.group:<30} {args.topic:<30} {p:>9} {now:>12} {new[p]:>12}")
    if not args.execute:
        print("dry run: nothing changed; add --execute to commit these offsets")
        return 0
    reset_group(bootstrap, args.group, args.topic, new, security=security)
    print(
        f"committed: group {args.group!r} resumes {args.topic} at NEW (a worker with "
        "--checkpoint-dir too: an operator's rewind wins over its checkpoint, and it says so)"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    _quiet_tensorflow()
    parser, commands = _parsers()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's usage, not the top level's: that is where the flag belongs
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    handlers = {
        "run": _cmd_run,
        "replay": _cmd_replay,
        "simulate": _cmd_simulate,
        "lag": _cmd_lag,
        "reset-group": _cmd_reset_group,
        "bench": _cmd_bench,
        "launch": _cmd_launch,
    }
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"streamer: error: {exc}", file=sys.stderr)
        return 2
    except StreamerError as exc:
        print(f"streamer: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A Kafka client's own error that no layer above typed (an operations tool asking a
        # broker mid-change): one line that names it, not a traceback.
        if not type(exc).__module__.startswith(("kafka.", "confluent_kafka")):
            raise
        print(
            f"streamer: error: the broker answered {type(exc).__name__} ({exc}); "
            "it may be starting or moving a coordinator: try again in a few seconds",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
