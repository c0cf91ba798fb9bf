"""``streamer simulate``: produce simulator samples (or random records of a schema) into a topic."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from consumers.errors import ConfigError
from streamer.cli.arguments import add_run_arguments
from streamer.cli.base import CODECS, CONNECTION_HELPS, CONNECTION_OPTIONS, Command, connection
from streamer.cli.logs import configure_logging

if TYPE_CHECKING:
    from streamer.input.simulator import Task


class Simulate(Command):
    name = "simulate"
    help = "produce simulator samples into a topic (creates it if missing)"
    description = "Produce samples of the simulator's learnable task into a Kafka topic."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_run_arguments(parser, CONNECTION_HELPS, only=CONNECTION_OPTIONS)
        parser.add_argument(
            "--topic", required=True, help="topic to produce to (created if missing)"
        )
        parser.add_argument(
            "--records",
            type=int,
            default=10_000,
            help="records to produce; 0 = forever [default: 10000]",
        )
        parser.add_argument(
            "--partitions",
            type=int,
            default=None,
            help="partitions of a topic it creates; an existing topic keeps its own (a warning "
            "says so when they differ) [default: 4]",
        )
        parser.add_argument(
            "--rate",
            type=float,
            default=None,
            help="records per second [default: as fast as possible]",
        )
        parser.add_argument(
            "--record-bytes",
            type=int,
            default=0,
            help="pad records to about this many bytes [default: 0, ~80 B]",
        )
        parser.add_argument("--seed", type=int, default=0, help="random seed [default: 0]")
        parser.add_argument(
            "--compression",
            default="none",
            type=str.lower,  # any case, as the run options take them
            choices=CODECS,
            help="compress the produced batches with this codec [default: none]",
        )
        parser.add_argument(
            "--task",
            default="regression",
            type=str.lower,  # any case, as the run options take them
            choices=("regression", "recommender"),
            help="regression: a 16-float vector and its label, which the built-in model learns; "
            "recommender: a user id string, 0-50 item ids and a 16-float vector with a learnable "
            "rating (train it with --model examples.recommender:build) [default: regression]",
        )
        parser.add_argument(
            "--schema",
            default=None,
            help="produce random valid records of this schema file (TOML or JSON) instead of a task",
        )
        parser.add_argument(
            "--log-level",
            default="INFO",
            type=str.upper,
            choices=("DEBUG", "INFO", "WARNING", "ERROR"),
            help="log level, in any case [default: INFO]",
        )

    def run(self, args: argparse.Namespace) -> int:
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
        bootstrap, security = connection(args)
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
