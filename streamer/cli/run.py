"""``streamer run``: the long-running worker (one of a cluster with TF_CONFIG)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from streamer.cli.arguments import add_run_arguments
from streamer.cli.base import Command, exit_guard, load_tensorflow
from streamer.cli.logs import configure_logging

if TYPE_CHECKING:
    from streamer.config import WorkerConfig


def run_worker(config: WorkerConfig) -> int:
    """The worker, or with TF_CONFIG / --cluster-workers naming several workers, one worker
    of a model trained on all of them (streamer/cluster/worker.py)."""
    from streamer.cluster.topology import topology_from

    topology = topology_from(
        os.environ, cluster_workers=config.cluster_workers, worker_index=config.worker_index
    )
    if topology is not None and topology.count > 1:
        from streamer.ops.tfstart import load_tensorflow as load_without_devices

        load_without_devices(devices=False)
        from streamer.cluster.worker import DistributedWorker

        worker = DistributedWorker(config, topology)
        code = worker.run()
        if worker.exit_now:  # a lost peer: TensorFlow's collective runtime may never let go
            logging.shutdown()
            os._exit(code)
        exit_guard(code, config.shutdown_timeout)
        return code
    load_tensorflow()
    from streamer.worker import Worker

    code = Worker(config).run()
    exit_guard(code, config.shutdown_timeout)
    return code


class Run(Command):
    name = "run"
    help = "run the worker (with no --bootstrap: on the embedded simulator)"
    description = (
        "Run the long-running training worker. Every option can also come from a TOML config "
        "file (--config) and from STREAMER_* environment variables; flags win over the "
        "environment, which wins over the file. Secrets only from the environment: "
        "STREAMER_SASL_PASSWORD or STREAMER_SASL_PASSWORD_FILE, STREAMER_SSL_PASSWORD(_FILE)."
    )
    raw_description = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_run_arguments(parser)
        parser.add_argument(
            "--print-config",
            action="store_true",
            help="print the effective settings after the config file, STREAMER_* and the flags, "
            "with where each came from (secrets masked), and exit",
        )

    def run(self, args: argparse.Namespace) -> int:
        from streamer.config import load_config, print_config

        params = {k: v for k, v in vars(args).items() if k not in ("command", "print_config")}
        sources: dict[str, str] = {}
        config = load_config(params, sources=sources)
        if args.print_config:
            print_config(config, sources, sys.stdout)
            return 0
        configure_logging(config.log_level, config.log_format)
        return run_worker(config)
