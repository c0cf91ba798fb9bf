"""``streamer bench``: the command line of the benchmark runner (``streamer.bench``)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from consumers.errors import ConfigError
from streamer.cli.arguments import add_run_arguments
from streamer.cli.base import (
    CODECS,
    CONNECTION_HELPS,
    CONNECTION_OPTIONS,
    Command,
    connection,
    load_tensorflow,
)
from streamer.cli.logs import configure_logging

if TYPE_CHECKING:
    from streamer.input.simulator import Task


#: --modes when not given: the default modes (or, with --schema or --task, the schema modes).
ALL_MODES = "default"


class Bench(Command):
    name = "bench"
    help = "measure raw kafka-python, a naive pipeline, ours and the worker on one topic"
    description = (
        "Fill a fresh topic with simulator records (unless --topic is given), then measure, "
        "alternating and repeated so drift cancels: raw (a plain kafka-python poll loop), naive "
        "(one record per generator call and per numpy_function), pipeline (ours, input only, "
        "thread shards), pipeline-process (the same with process shards) and worker (ours "
        "with the default model). Prints a table, or JSON with --json."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_run_arguments(parser, CONNECTION_HELPS, only=CONNECTION_OPTIONS)
        parser.add_argument(
            "--records", type=int, default=100_000, help="records in the topic [default: 100000]"
        )
        parser.add_argument(
            "--record-bytes",
            type=int,
            default=None,
            help="record size in bytes [default: 1024; with --schema or --task: the records as "
            "they are]",
        )
        parser.add_argument(
            "--shards", type=int, default=4, help="shards of the pipeline and worker [default: 4]"
        )
        parser.add_argument(
            "--repeats", type=int, default=3, help="rounds of all modes [default: 3]"
        )
        parser.add_argument(
            "--topic", default=None, help="measure an existing topic instead of filling a new one"
        )
        parser.add_argument(
            "--modes",
            default=ALL_MODES,
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
        parser.add_argument(
            "--naive-records",
            type=int,
            default=20_000,
            help="records read by the slow naive mode [default: 20000]",
        )
        parser.add_argument(
            "--soak-seconds",
            type=float,
            default=0.0,
            help="after the modes, read the topic through the pipeline again and again for this "
            "long and report resident memory at start and end (a leak check) [default: 0, off]",
        )
        parser.add_argument(
            "--soak-client",
            default="kafka-python",
            type=str.lower,  # any case, as the run options take them
            choices=("kafka-python", "confluent"),
            help="Kafka client of the memory soak (thread shards) [default: kafka-python]",
        )
        parser.add_argument(
            "--compression",
            default="none",
            help="codec of the filled topic, or a comma-separated list of them (one topic each, "
            f"every mode measured on each, and each codec's rate against the first): "
            f"{', '.join(CODECS)} [default: none]",
        )
        parser.add_argument(
            "--schema",
            default=None,
            help="fill the topic with random records of this schema file and measure "
            "raw,pipeline,pipeline-shuffle,pipeline-process on it and, alternating, on fixed-shape "
            "regression records of the same mean size (the fixed: modes, and ratios to them)",
        )
        parser.add_argument(
            "--task",
            default=None,
            type=str.lower,  # any case, as the run options take them
            choices=("regression", "recommender"),
            help="like --schema, with the records of a simulator task",
        )
        parser.add_argument(
            "--scaling",
            action="store_true",
            help="the scaling table instead of the default modes: the pipeline with 1 and 2 shards "
            "in threads and in child processes, on each client (mode@N), and the decode-only and "
            "TensorFlow-only ceilings over the same records, alternating",
        )
        parser.add_argument(
            "--decoders",
            default="auto",
            metavar="D1,D2",
            help="measure every mode with each of these --decoder values, alternating: auto (the "
            "compiled fast path where it takes the schema), python (the reference alone); a mode "
            "with a decoder other than auto is named mode/decoder [default: auto]",
        )
        parser.add_argument(
            "--freshness-rates",
            default="",
            metavar="R1,R2",
            help="after the modes, for each rate (records/s) and client: a producer writes 1 KiB "
            "records at that rate into a fresh topic while the worker trains it live; reports "
            "p50/p90/p99 of streamer_record_age_at_train_seconds [default: none]",
        )
        parser.add_argument(
            "--freshness-seconds",
            type=float,
            default=20.0,
            help="how long each freshness producer writes [default: 20]",
        )
        parser.add_argument(
            "--steps-per-execution",
            default="1",
            metavar="K1,K2",
            help="run every worker and pipeline mode with each of these --steps-per-execution "
            "values, alternating (a pipeline mode then takes its batches in a compiled loop, as "
            "such a worker does); a value other than 1 is the mode's suffix (worker-process+spe8) "
            "[default: 1]",
        )
        parser.add_argument(
            "--ceiling-cores",
            type=int,
            default=16,
            metavar="N",
            help="the host the cost table projects to: the ceiling of one worker on N cores, the "
            "lower of 1 / (main-interpreter GIL us per record) and N / (CPU us per record of all "
            "its processes) [default: 16]",
        )
        parser.add_argument(
            "--json", action="store_true", help="print one JSON object instead of a table"
        )

    def run(self, args: argparse.Namespace) -> int:
        configure_logging("WARNING")
        load_tensorflow()
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
            if args.modes == ALL_MODES
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
            if args.modes == ALL_MODES:
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
        if (
            not decoders
            or len(set(decoders)) != len(decoders)
            or set(decoders) - {"auto", "python"}
        ):
            raise ConfigError("decoders", args.decoders, "auto and/or python, comma-separated")
        try:
            spes = tuple(int(k) for k in args.steps_per_execution.split(",") if k.strip())
        except ValueError:
            spes = ()
        if not spes or min(spes) < 1 or len(set(spes)) != len(spes):
            raise ConfigError(
                "steps_per_execution",
                args.steps_per_execution,
                "positive integers, comma-separated",
            )
        bootstrap, security = connection(args)
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
