"""Lifecycle: the life both loops share -- signals, health and metrics, the readiness and queue
watch, runs of skipped (non-finite) steps, exit codes and shutdown.

``streamer.worker.Worker`` (a worker of its own: passes of batches) and
``streamer.cluster.worker.DistributedWorker`` (one of N workers of one model: rounds in
lock-step) differ only in how they build their model and input, how they step, and what a
stop means; everything else is here, once. The anchor is prometheus_client's
``MetricWrapperBase``: the shared life in the base, each kind a few hooks.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Generic

import numpy as np

from consumers.errors import StreamerError
from streamer.committer import Committer
from streamer.config import WorkerConfig
from streamer.ops.gctune import release_free_memory, tune_gc
from streamer.ops.health import Health
from streamer.ops.metrics import LEFT_BEHIND_SECONDS, Metrics
from streamer.ops.signals import SignalWatch, StopOnSignal
from streamer.ops.status import StatusLine
from streamer.ops.tboard import ProfileWindow, TrainingSummaries
from streamer.parts import MissingPartError, Parts, Plan, StepT, build_parts, new_committer
from streamer.stopping import StopReason
from streamer.train.callbacks import CallbackList, LeaseCheck, Profiler, TensorBoard
from streamer.train.errors import ModelDivergedError
from streamer.train.nonfinite import NonFiniteSteps, describe_offsets

if TYPE_CHECKING:
    from streamer.input.deadletter import DeadLetterWriter
    from streamer.input.source import StreamSource

__all__ = ["Lifecycle"]

log = logging.getLogger(__name__)

#: How often a worker hands freed heap back to the OS (gctune.release_free_memory): a pass
#: may last for days, and a cluster's pass lasts the whole run.
TRIM_EVERY_S = 60.0


class Lifecycle(Generic[StepT]):
    """The shared life of a worker; subclasses implement ``_run`` (``build``, then loop).

    ``run()`` installs the signal answer (on the main thread), builds, runs the loop and
    returns the exit code (docs/reference/exit-codes.md); whatever happens, ``_shutdown`` closes what
    was opened, and the shutdown watchdog of a signal is released. ``build(plan)`` builds
    the run's parts once (``streamer.parts``), its committer, status line and watch.
    """

    #: What a first SIGTERM/SIGINT does, in the log line that acknowledges it.
    stop_plan = "finishing the current step, then checkpoint, commit and exit"

    def __init__(self, config: WorkerConfig, *, status_out: IO[str] | None = None) -> None:
        self.config = config
        self.status_out = status_out or sys.stderr
        self.step = 0
        self.loss = float("nan")
        self.health = Health(config.stall_timeout)
        #: Everything the run needs, built once by ``build`` (``streamer.parts``).
        self.parts: Parts[StepT] | None = None
        self._committer: Committer | None = None
        self.status: StatusLine | None = None
        #: What happens around steps (``streamer.train.callbacks``), in order; each loop
        #: appends its own, so the run's end closes whatever was opened.
        self.callbacks = CallbackList()
        #: The input was closed (shutdown): the source is not read nor watched again.
        self._input_closed = False
        #: When the probe last found no broker (an outage is not idleness).
        self._broker_down_at = -math.inf
        self.nonfinite = NonFiniteSteps(config.max_nonfinite_steps)
        self._stopping = threading.Event()
        self._stop_reason: StopReason | None = None
        self._finished = threading.Event()
        self._signal_stop = StopOnSignal(
            plan=self.stop_plan,
            stop=self.request_stop,
            finished=self._finished,
            timeout=config.shutdown_timeout,
            log=log,
        )
        self._signal_watch: SignalWatch | None = None
        #: Partitions left behind when last watched: partition -> (seconds, lag); and since when.
        self._behind: dict[int, tuple[float, int]] = {}
        self._behind_since: dict[int, float] = {}

    # ---- the parts ------------------------------------------------------------------------------

    def build(self, plan: Plan[StepT]) -> Parts[StepT]:
        """The run's parts (``build_parts``), then what the loops share on top of them: the
        committer (commit and checkpoint schedules, ``_save``), the status line, the lease
        check, the watch thread. The configuration from here on is the resolved one."""
        parts = build_parts(self.config, plan, health=self.health, stop=self._stopping)
        self.parts = parts
        cfg = self.config = parts.config
        self.step = parts.step
        save = None if parts.checkpointer is None else self._save
        checkpointer = parts.checkpointer
        self._committer = new_committer(
            cfg,
            parts.input,
            parts.metrics,
            step=self.step,
            save=save,
            failure_cause=None if checkpointer is None else lambda: checkpointer.last_error,
        )
        self.status = StatusLine(
            self.status_out, cfg.status_interval, parts.metrics, lag=self.status_lag()
        )
        if parts.lease is not None:
            self.callbacks.append(LeaseCheck(parts.lease))
        self.start_watch()
        return parts

    def logdir_callbacks(self, parts: Parts[StepT]) -> TrainingSummaries | None:
        """--logdir: TensorBoard summaries (loss, samples/s, input wait, lag every interval;
        the train metrics at each report) and the --profile-steps window, appended as
        callbacks; the summaries (None without --logdir)."""
        cfg, metrics = self.config, parts.metrics
        if not cfg.logdir:
            return None
        summaries = TrainingSummaries(
            cfg.logdir,
            cfg.status_interval,
            lag=lambda: metrics.snapshot()["consumer_lag_records"],
        )
        window = cfg.profile_range()
        if window is not None:
            self.callbacks.append(Profiler(ProfileWindow(cfg.logdir, *window)))
        self.callbacks.append(TensorBoard(summaries))
        return summaries

    @property
    def built(self) -> Parts[StepT]:
        """The run's parts (MissingPartError before ``build``)."""
        if self.parts is None:
            raise MissingPartError("parts yet", "they are built as the run starts")
        return self.parts

    @property
    def metrics(self) -> Metrics:
        return self.built.metrics

    @property
    def committer(self) -> Committer:
        if self._committer is None:
            raise MissingPartError("committer yet", "it is built with the parts")
        return self._committer

    @property
    def source(self) -> StreamSource | None:
        """The input, while it is open (None before the build and once shut down)."""
        if self.parts is None or self._input_closed:
            return None
        return self.parts.source

    def _save(self, step: int, positions: dict[int, int]) -> dict[int, int] | None:
        """Write a checkpoint of ``step`` at ``positions``; what to commit, or None when it
        failed (the committer's save; a hook)."""
        raise NotImplementedError

    # ---- stopping -----------------------------------------------------------------------------

    def request_stop(self, reason: StopReason) -> None:
        """Stop soon (the first reason is the one reported)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stopping.set()
        self._on_stop()

    def _on_stop(self) -> None:
        """What a stop request does at once, besides being noted (a hook)."""

    def _drain_seconds(self) -> float:
        """How long a clean stop may train the records already read: at most 10 s, or half
        of --shutdown-timeout (the rest is for the checkpoint, the commits and closing)."""
        return min(10.0, self.config.shutdown_timeout / 2)

    def _begin_drain(self) -> float:
        """A clean stop trains the records already read first (with N workers, every worker
        at the same round): the decode map hands blocks on as they finish, so a partition's
        later block may be trained before an earlier one, and a shuffle window holds records
        behind later ones; the commit cannot pass a record not trained, so without this a
        restart would train everything after it again. The shards stop reading (again: a
        stop that came as a pass began was cleared by its resume()); returns the deadline."""
        seconds = self._drain_seconds()
        log.info(
            "stopping: training the records already read first (at most %.0fs), then the "
            "checkpoint, the commits and the shards' close (the whole stop within %.0fs, "
            "--shutdown-timeout)",
            seconds,
            self.config.shutdown_timeout,
        )
        self.built.source.stop()
        return time.monotonic() + seconds

    # ---- the run ------------------------------------------------------------------------------

    def run(self) -> int:
        """Build, run the loop until it stops, shut down; the process exit code."""
        if threading.current_thread() is threading.main_thread():
            self._signal_watch = SignalWatch(self._signal_stop, (signal.SIGTERM, signal.SIGINT))
        try:
            return self._run()
        except StreamerError as exc:  # ConfigError: 2; docs/reference/exit-codes.md
            # A retriable error (a broker away, a topic not yet there) may pass with no change:
            # the line says so, so an operator does not go looking for one.
            again = " (this may pass on its own: a restart as it is tries again)"
            log.error("%s%s", exc, again if exc.retriable else "")
            return self._failed(exc)
        except Exception as exc:
            return self._crashed(exc)
        finally:
            self._shutdown()
            self._finished.set()
            if self._signal_watch is not None:
                self._signal_watch.close(self._signal_stop.quiet_until())

    def _run(self) -> int:
        raise NotImplementedError

    def _failed(self, exc: StreamerError) -> int:
        """The exit code of a run that ended with ``exc`` (a hook: a cluster ends at once)."""
        return exc.exit_code

    def _crashed(self, exc: Exception) -> int:
        """A bug or an unexpected library error (a hook; by default it propagates)."""
        raise exc

    def status_lag(self) -> Callable[[], int] | None:
        """What the status line shows as lag, where not the consumer's lag (a hook)."""
        return None

    # ---- steps that were not applied ------------------------------------------------------------

    def skipped_step(
        self, partition: np.ndarray, offset: np.ndarray, *, everywhere: bool = False
    ) -> None:
        """A step whose loss or gradients were not finite: nothing was applied. Its records
        wait (not acknowledged) for the next applied step; --max-nonfinite-steps in a row stop
        the worker (ModelDivergedError: exit 3, no checkpoint). ``everywhere``: a cluster's
        verdict, the same on every worker."""
        self.metrics.observe_nonfinite_step()
        self.health.beat("trainer")
        limit = self.config.max_nonfinite_steps
        stop = self.nonfinite.skipped(partition, offset)
        letters = self._dead_letters()
        log.warning(
            "step %d: loss or a gradient not finite%s: update skipped, model unchanged (%d "
            "records, partition:offsets %s); %d in a row, the worker stops at %d; once a step "
            "is applied, these records %s",
            self.step + 1,
            " on some worker (skipped on every worker)" if everywhere else "",
            len(offset),
            describe_offsets(partition, offset) or "-",
            self.nonfinite.in_a_row,
            limit,
            f"go to the dead-letter topic {letters.topic!r} (reason nonfinite_step)"
            if letters is not None
            else "are committed past, untrained (--dead-letter-topic would keep them)",
        )
        if stop:
            checkpointer = self.built.checkpointer
            checkpoint = checkpointer.latest if checkpointer is not None else None
            raise ModelDivergedError(
                f"{limit} steps in a row had a non-finite loss or gradients (the last at step "
                f"{self.step + 1}; {self.nonfinite.held_records} records held, not committed)",
                checkpoint,
            )

    def applied_step(self, ack: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """A step was applied: the records of the run of skipped steps before it are done: sent
        to the dead-letter topic (reason ``nonfinite_step``; done once written), or
        acknowledged at once without one."""
        held = self.nonfinite.applied()
        if not held:
            return
        letters = self._dead_letters()
        for part, off in held:
            if letters is None:
                ack(part, off)
                continue
            # A partition revoked meanwhile is its next owner's: it reads these records
            # again (they were never committed here); no letter of them from this worker.
            mine = np.isin(part, list(self.metrics.assigned()))
            if mine.any():
                letters.send_held(self.config.topic, part[mine], off[mine])

    def _dead_letters(self) -> DeadLetterWriter | None:
        """The dead-letter writer, where the run has one (and its input is open)."""
        source = self.source
        return None if source is None else source.dead_letter

    # ---- watching -------------------------------------------------------------------------------

    def start_watch(self) -> None:
        """Once the parts are built: the GC tuned (start-up's objects leave every later
        collection) and the watch thread: every second readiness (the parts' broker probe)
        and queue depths, every ``TRIM_EVERY_S`` the freed heap back to the OS. Both loops
        alike."""
        tune_gc()
        threading.Thread(target=self._watch, name="streamer-readiness", daemon=True).start()

    def _watch(self) -> None:
        trimmed = time.monotonic()
        probe = self.built.probe
        while not self._finished.wait(1.0):
            if probe is not None and not probe.up:
                self._broker_down_at = time.monotonic()
                self._broker_down()
            self.update_ready()
            if time.monotonic() - trimmed >= TRIM_EVERY_S:
                release_free_memory()
                trimmed = time.monotonic()
            self.watch_queues()
            self.watch_partitions()

    def watch_partitions(self) -> None:
        """A partition left behind (records waiting, nothing of it trained for
        ``LEFT_BEHIND_SECONDS``: a fetch stalled after a broker fault, or a partition starved
        while others' backlog is served) is named in one WARNING when it falls behind and one
        line when it trains again; the status line shows it meanwhile."""
        if self.source is None:
            return
        behind = self.metrics.left_behind()
        fell = sorted(set(behind) - set(self._behind))
        caught_up = sorted(set(self._behind) - set(behind))
        if fell:
            if time.monotonic() - self._broker_down_at < LEFT_BEHIND_SECONDS:
                context = "no broker answers"
            elif len(behind) < len(self.metrics.assigned()):
                context = "other partitions train"
            else:
                context = "no partition trains"
            log.warning(
                "left behind: partition%s %s of %s, %s records waiting, nothing trained from "
                "%s for %.0fs while %s (streamer_partition_last_trained_timestamp_seconds "
                "shows how far behind)",
                "s" if len(fell) > 1 else "",
                ", ".join(map(str, fell)),
                self.config.topic,
                f"{sum(behind[p][1] for p in fell):,}",
                "them" if len(fell) > 1 else "it",
                min(behind[p][0] for p in fell),
                context,
            )
        for p in caught_up:
            seconds = time.monotonic() - self._behind_since.pop(p, time.monotonic())
            if not self.metrics.is_assigned(p):
                log.info(
                    "partition %d of %s, left behind for %.0fs, is no longer assigned here",
                    p,
                    self.config.topic,
                    seconds,
                )
                continue
            log.info(
                "partition %d of %s trains again after %.0fs left behind",
                p,
                self.config.topic,
                seconds,
            )
        for p in fell:
            self._behind_since[p] = time.monotonic() - behind[p][0]
        self._behind = behind

    def _broker_down(self) -> None:
        """The probe found no broker this second (a hook: the worker's idle clock waits)."""

    def update_ready(self) -> None:
        """Readiness: not while stopping; not without a broker or with the topic gone; else
        what the loop says (``_readiness``)."""
        source = self.source  # None once shut down
        if self._stopping.is_set() or source is None:
            return
        probe = self.built.probe
        if probe is not None and not probe.up:
            self.health.set_ready(False, f"no broker reachable at {self.config.bootstrap}")
            return
        if source.topic_missing:
            self.health.set_ready(
                False, f"topic {self.config.topic} does not exist (deleted?); waiting for it"
            )
            return
        committer = self._committer
        if committer is not None and committer.failing_since is not None:
            seconds = time.monotonic() - committer.failing_since
            self.health.set_ready(
                False,
                f"checkpoints to {self.config.checkpoint_dir} failing for {seconds:.0f}s "
                "(commits wait for them)",
            )
            return
        self.health.set_ready(*self._readiness(source.assigned_partitions()))

    def _readiness(self, assigned: int) -> tuple[bool, str]:
        """Ready or not, and why, with the broker up, the topic there and ``assigned``
        partitions (a hook)."""
        if assigned == 0:
            return False, "no partitions assigned"
        return True, f"model built, {assigned} partitions assigned"

    def watch_queues(self) -> None:
        """Queue depths for /metrics (every second, from the readiness thread)."""
        cfg, source = self.config, self.source
        if source is None:
            return
        metrics = self.metrics
        capacity = cfg.shards * cfg.queue_max_blocks * cfg.max_poll_records
        metrics.set_queue("shard", source.queued_records(), capacity)
        # Emitted into tf.data and not yet trained: autotuned stages, no fixed capacity.
        metrics.set_queue("prefetch", source.tracker.in_flight(), None)
        if source.dead_letter is not None:  # written in the background, bounded by bytes
            metrics.set_queue("dead_letter", source.dead_letter.pending, None)

    # ---- shutdown -------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Close what was opened, in order: the input (its consumers' last commits are sent
        first), the status line, the audit log, the probe and the metrics server; then the
        loop's own (the callbacks' end: the lease is given up last)."""
        self.health.set_ready(False, "shutting down")
        self._stopping.set()
        self._close_input()
        if self.status is not None:
            self.status.end()  # idempotent: a terminal's live line ends with a newline
        if self.parts is not None:
            self.parts.close()  # the audit log, the probe, the metrics server
        self._close_more()

    def _close_input(self) -> None:
        source = self.source
        self._input_closed = True
        if source is not None:
            source.stop()
            source.close()

    def _close_more(self) -> None:
        """The loop's own parts (a hook)."""
