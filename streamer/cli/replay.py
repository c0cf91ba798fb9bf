"""The command line of ``streamer replay``: its description and the help of the run options a
replay treats differently (the replay itself: ``streamer.config.replay``)."""

from __future__ import annotations

import argparse
import logging

from consumers.errors import ConfigError
from streamer.cli.arguments import add_run_arguments
from streamer.cli.base import Command, exit_guard, load_tensorflow
from streamer.cli.logs import configure_logging
from streamer.config import OPTIONS
from streamer.config.replay import COMMIT_METADATA, RANGE_FORMS

__all__ = ["DESCRIPTION", "NOT_FOR_REPLAY", "REPLAY_ONLY", "RUN_OPTION_HELPS", "Replay"]

log = logging.getLogger(__name__)


DESCRIPTION = """\
Train on the records from --from up to (not including) --to of every partition of the topic
(or of --partitions), reading them by assignment, then stop. A read-only side trip for the
live system; it touches exactly this:

  reads      the topic's range; the checkpoint in --restore-from (never written)
  commits    nothing, to no consumer group; with --replay-group G, to G only (refused when G
             has members or commits that no replay wrote, unless
             --force-replay-into-live-group)
  writes     checkpoints to --checkpoint-dir, SavedModels to --export-dir, TensorBoard to
             --logdir, an audit log to --audit-log, dead letters to --dead-letter-topic, and
             serves metrics on --metrics-port: each only when given on this command line
             (in --config or STREAMER_* they are the live worker's, and are not used)
             [default: none of them]

A checkpoint or export directory that holds a live worker's files, --restore-from's directory
and an existing audit log are refused (exit 2). Every other option of `streamer run` applies,
from flags, STREAMER_* variables or --config (bootstrap, topic, security, model, batch size,
...)."""

#: The help of the run options that a replay treats differently (see DESCRIPTION).
#: Options of `streamer run` that mean nothing to a replay: not in its --help. ``group`` and
#: ``start_from`` are still parsed, to be refused with a pointer to what replay takes instead.
NOT_FOR_REPLAY = (
    "group",
    "start_from",
    "worker_id",
    "pass_records",
    "pass_seconds",
    "stop_after_idle",
    "commit_every_steps",
    "commit_every_seconds",
    "eval_topic",
    "eval_every_steps",
    "eval_every_seconds",
    "eval_records",
    "cluster_workers",
    "worker_index",
    "pad_after_seconds",
    "peer_stop_exit_code",
    "sim_partitions",
    "sim_rate",
    "sim_record_bytes",
    "sim_task",
    "stall_timeout",
)

RUN_OPTION_HELPS = {
    "checkpoint_dir": "write the replay's checkpoints here: a new directory or a replay's "
    "(only from this command line) [default: no checkpoints]",
    "export_dir": "export the replay's SavedModels here: a new directory or a replay's (only "
    "from this command line) [default: no exports]",
    "logdir": "TensorBoard log directory of the replay (only from this command line) "
    "[default: none]",
    "profile_steps": "capture a TensorFlow Profiler trace for steps A:B into --logdir (only "
    "from this command line) [default: unset]",
    "audit_log": "write topic,partition,offset of every trained sample to this new file (only "
    "from this command line) [default: none]",
    "dead_letter_topic": "topic for records that fail to decode (only from this command "
    "line) [default: count and skip them]",
    "dead_letter_replication_factor": "replication factor of a dead-letter topic the replay "
    "creates (only from this command line) [default: the broker's]",
    "metrics_port": "port of /metrics, /healthz, /readyz (only from this command line) "
    "[default: 0, no server]",
}

#: The arguments of `streamer replay` that are not run options.
REPLAY_ONLY = (
    "command",
    "replay_from",
    "replay_to",
    "restore_from",
    "replay_group",
    "force_replay_into_live_group",
)


class Replay(Command):
    name = "replay"
    help = (
        "train a separate model on a bounded range of the topic and stop (touches nothing "
        "of the live worker)"
    )
    description = DESCRIPTION
    raw_description = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--from",
            dest="replay_from",
            metavar="FROM",
            required=True,
            help=f"start of the range: {RANGE_FORMS}",
        )
        parser.add_argument(
            "--to",
            dest="replay_to",
            metavar="TO",
            required=True,
            help=f"end of the range, not included: {RANGE_FORMS}; after --from",
        )
        parser.add_argument(
            "--restore-from",
            default=None,
            metavar="DIR",
            help="start from the newest checkpoint in DIR (model, optimizer and step; read, never "
            "written) [default: a new model]",
        )
        parser.add_argument(
            "--replay-group",
            default=None,
            metavar="GROUP",
            help="commit the replay's progress to this consumer group (each commit's metadata "
            f"says {COMMIT_METADATA!r}); refused when the group has members or commits that no "
            "replay wrote [default: commit to no group]",
        )
        parser.add_argument(
            "--force-replay-into-live-group",
            action="store_true",
            help="with --replay-group: commit even into a group that has members or a live "
            "worker's commits, overwriting the live worker's position (dangerous)",
        )
        add_run_arguments(
            parser, RUN_OPTION_HELPS, only=[o.name for o in OPTIONS if o.name not in NOT_FOR_REPLAY]
        )
        for name in ("group", "start_from"):  # refused by name, with what to use instead
            parser.add_argument("--" + name.replace("_", "-"), dest=name, help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
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
        load_tensorflow()
        from streamer.worker import Worker

        code = Worker(config).run()
        exit_guard(code, config.shutdown_timeout)
        return code
