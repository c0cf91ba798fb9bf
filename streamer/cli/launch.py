"""``streamer launch``: N workers of one model on this host."""

from __future__ import annotations

import argparse

from streamer.cli.base import Command
from streamer.cli.logs import configure_logging


class Launch(Command):
    name = "launch"
    help = "start N workers of one model on this host (multi-worker training, for demos)"
    description = (
        "Start N `streamer run` processes that train one model together "
        "(MultiWorkerMirroredStrategy), each with its own TF_CONFIG on free local ports. "
        "Everything after -- goes to each worker; {index} in it becomes the worker's index "
        "(e.g. --audit-log audit-{index}.csv), and a non-zero --metrics-port P becomes "
        "P + index. SIGTERM/SIGINT go to every worker; the exit code is the first non-zero "
        "one of the workers."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workers", type=int, required=True, help="number of workers")
        parser.add_argument(
            "--host", default="127.0.0.1", help="address the workers listen on [default: 127.0.0.1]"
        )
        parser.add_argument(
            "run_args", nargs=argparse.REMAINDER, help="-- then the options of `streamer run`"
        )

    def run(self, args: argparse.Namespace) -> int:
        configure_logging("INFO")
        from streamer.cluster.launch import launch

        run_args = list(args.run_args)
        if run_args[:1] == ["--"]:
            run_args = run_args[1:]
        return launch(args.workers, run_args, host=args.host)
