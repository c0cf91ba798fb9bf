"""The command line of ``streamer replay``: its description and the help of the run options a
replay treats differently (the replay itself: ``streamer.config.replay``)."""

from __future__ import annotations

__all__ = ["DESCRIPTION", "NOT_FOR_REPLAY", "REPLAY_ONLY", "RUN_OPTION_HELPS"]


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
