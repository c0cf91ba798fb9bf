"""Worker: the long-running loop — passes of batches, train, ack, commit, checkpoint, shut down."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import tensorflow as tf

from consumers.errors import StreamerError
from streamer.config import WorkerConfig, shard_runtime_choice
from streamer.input.errors import PipelineError
from streamer.input.source import METADATA_COLUMNS, end_iterator
from streamer.lifecycle import Lifecycle
from streamer.ops.tboard import TrainingSummaries
from streamer.parts import LocalPlan, Parts, required
from streamer.rollback import RollbackPoint, RollbackPoints
from streamer.stopping import StopKind, StopReason
from streamer.train.callbacks import Evaluation, Export, TrainMetricReport
from streamer.train.errors import ModelDivergedError
from streamer.train.evaluate import Evaluator
from streamer.train.export import Exporter, publish, serving_inputs
from streamer.train.trainer import StepHandle, StepsResult, Trainer

__all__ = ["Worker"]

log = logging.getLogger(__name__)


#: A step stays in flight while the next batch is read only if its own batch came within this
#: many seconds (the input keeps up with the device): see ``Worker._keep_in_flight``.
OVERLAP_MAX_WAIT_S = 0.05


@dataclasses.dataclass(slots=True)
class _InFlight:
    """A step dispatched and not yet settled: its records' metadata and its timings."""

    handle: StepHandle
    meta: dict[str, Any]
    input_wait: float  # seconds the loop waited for its batch
    dispatch_seconds: float  # seconds the dispatch took (on a CPU: the whole step)


class Worker(Lifecycle[Trainer]):
    """Trains continuously from the stream until stopped; see DESIGN.md section 3.

    The life it shares with the cluster loop (signals, health and metrics, skipped steps,
    exit codes, shutdown) is ``streamer.lifecycle.Lifecycle``; the commit sequence is
    ``streamer.committer.Committer``.

    >>> code = Worker(load_config({"max_steps": 100})).run()   # doctest: +SKIP

    Its parts (model, input, checkpointer, ...) are built once as the run starts
    (``Lifecycle.build`` with a ``LocalPlan``: ``streamer.parts``).
    """

    def __init__(self, config: WorkerConfig, *, status_out: IO[str] | None = None) -> None:
        super().__init__(config, status_out=status_out)
        self.first_wait_seconds: float | None = None
        #: One step in flight while the next batch is read (``_keep_in_flight``): set in
        #: ``_build`` where the step runs on an accelerator.
        self.overlap_steps = False
        self._last_data = time.monotonic()
        #: Until when an idle stop waits for the group's partitions held elsewhere.
        self._idle_grace_until: float | None = None
        self.exporter: Exporter | None = None
        self.exports: Export | None = None
        self.summaries: TrainingSummaries | None = None
        self.evaluator: Evaluator | None = None
        self._diverged: ModelDivergedError | None = None
        #: A call of several steps failed part way: the model holds steps whose records were
        #: never acknowledged, so no checkpoint may be written from it (``_run_steps``).
        self._untracked = False
        self._final_lag: int | None = None  # the lag as the last pass ended (status line)
        self.reports: TrainMetricReport | None = None
        #: The checkpoints a loss of partitions may go back to (``_roll_back``).
        self.rollback_points = RollbackPoints()
        self._rolled_back = False  # the pass ended in a rollback

    def _on_stop(self) -> None:
        source = self.source  # None before the build and once shut down
        if source is not None:
            source.stop()
        if self.evaluator is not None:
            self.evaluator.stop()

    # ---- set-up -----------------------------------------------------------------------------

    def _build(self) -> Parts[Trainer]:
        """The parts (``Lifecycle.build``), then this loop's own: whether a step stays in
        flight, and the extras around steps as configured."""
        parts = self.build(LocalPlan())
        self.overlap_steps = bool(tf.config.list_logical_devices("GPU"))
        self._build_online(parts)
        return parts

    def _build_online(self, parts: Parts[Trainer]) -> None:
        """Export, TensorBoard summaries, the profiler window and evaluation, as configured."""
        cfg = self.config
        self.summaries = self.logdir_callbacks(parts)
        if cfg.eval_topic:
            self.evaluator = Evaluator(
                cfg.consumer_settings(),
                cfg.eval_topic,
                parts.schema,
                parts.steps,
                records=cfg.eval_records,
                batch_size=cfg.batch_size,
                idle_timeout=min(2.0, cfg.pipeline_settings().idle_timeout_seconds),
                decoder=cfg.decoder,
            )
        self.reports = TrainMetricReport(
            cfg.status_interval,
            lambda: parts.steps.metric_values(reset=True),
            metrics=parts.metrics,
            status=lambda: self.status,
            summaries=self.summaries,
        )
        self.callbacks.append(self.reports)
        if self.evaluator is not None:
            self.callbacks.append(
                Evaluation(
                    self.evaluator,
                    every_steps=cfg.eval_every_steps,
                    every_seconds=cfg.eval_every_seconds,
                    metrics=parts.metrics,
                    reports=self.reports,
                    summaries=self.summaries,
                )
            )
        if cfg.export_dir:
            extra = {"replay": cfg.replay.describe()} if cfg.replay is not None else None
            self.exporter = Exporter(cfg.export_dir, keep=cfg.export_keep, info=extra)
            self.exports = Export(cfg.export_every_steps, self._export, start_step=self.step)
            self.callbacks.append(self.exports)

    def _broker_down(self) -> None:
        self._last_data = time.monotonic()  # an outage is not idleness (--stop-after-idle waits)

    # ---- the loop ---------------------------------------------------------------------------

    def _run(self) -> int:
        """Passes until a stop condition or signal; the exit code of a clean stop."""
        parts = self._build()
        cfg = self.config
        log.info(
            "worker %s starting at step %d: %s",
            cfg.worker_id,
            self.step,
            _describe(cfg, parts.decoder),
        )
        status = required(self.status, "status line", "built with the parts")
        if parts.checkpointer is not None:
            self._keep_start()
        while not self._stopping.is_set():
            exhausted = self._run_pass()
            if parts.source.reject_limit is not None:
                raise parts.source.reject_limit  # after a commit that stays below them
            if exhausted and parts.source.finished:
                self.request_stop(StopReason.replay_trained())
            if cfg.stop_after_idle is not None and (
                time.monotonic() - self._last_data >= cfg.stop_after_idle
                or (
                    exhausted
                    and self._pass_ends_only_when_idle()
                    and time.monotonic() - self._broker_down_at >= cfg.stop_after_idle
                )
            ):
                self._stop_when_idle(cfg.stop_after_idle)
        if self.exports is not None:
            self.exports.final(self.step)  # a clean stop: the final model is served too
        status.maybe(self.step, self.loss, final=True, lag=self._final_lag)
        status.end()
        log.info("stopped (%s) at step %d", self._stop_reason, self.step)
        return 0

    def _stop_when_idle(self, idle_seconds: float) -> None:
        """Stop on --stop-after-idle, unless the group still has records on partitions this
        worker does not own: a static member that stopped keeps its partitions until the
        broker expires its session, so wait that long (once) for them to come here; stop
        anyway after that, saying so in the stop line."""
        lag = self._group_lag_elsewhere()
        now = time.monotonic()
        if lag and self._idle_grace_until is None:
            wait = self.config.session_timeout_ms / 1000 + 10.0
            self._idle_grace_until = now + wait
            log.warning(
                "idle for %gs, but the group has %d records not trained on partitions %s "
                "this worker does not own (another member's, or a stopped static member's "
                "until its session expires): waiting up to %.0fs for them",
                idle_seconds,
                sum(lag.values()),
                sorted(lag),
                wait,
            )
            self._last_data = now
            return
        if lag and self._idle_grace_until is not None and now < self._idle_grace_until:
            return
        more = ""
        if lag:
            more = (
                f"; the group still has {sum(lag.values())} records not trained on partitions "
                f"{sorted(lag)}, owned by no member here"
            )
        self.request_stop(StopReason.idle(idle_seconds, more))

    def _group_lag_elsewhere(self) -> dict[int, int]:
        """The group's lag per partition, between passes (this worker owns none then: what
        it trained is committed), so any lag is on another member's partitions."""
        cfg = self.config
        if cfg.bootstrap is None or cfg.replay is not None or not cfg.commits:
            return {}
        from consumers.admin import group_lag

        try:
            lags = group_lag(
                cfg.bootstrap,
                cfg.group,
                cfg.topic,
                security=cfg.security_settings(),
                isolation_level=cfg.isolation_level,
            )
        except Exception as exc:  # only a courtesy: the stop goes ahead
            log.debug("the group's lag could not be read: %r", exc)
            return {}
        return {lag.partition: lag.lag for lag in lags if lag.lag > 0}

    def _pass_ends_only_when_idle(self) -> bool:
        """True when the only way a pass runs out is every shard idle for --stop-after-idle.

        The last batch of a pass (a partial one) comes out only when the pass ends, so the
        time since the last step says nothing about the time since the last record.
        """
        cfg = self.config
        assert cfg.stop_after_idle is not None
        return (
            cfg.pass_records is None
            and cfg.pass_seconds is None
            and cfg.idle_timeout >= cfg.stop_after_idle
        )

    def _run_pass(self) -> bool:
        """One pass; True if the input ran out (rather than a stop request ending it).

        On an accelerator, while the input keeps up, one step is in flight while the next
        batch is read: a step is dispatched, the loop reads the next batch while the device
        computes, then settles the step (its result, ack, metrics, checkpoint) before it
        dispatches the next (``_keep_in_flight``); so the loop does not wait on the device
        just to read a loss, and a checkpoint holds exactly the steps acked. Otherwise each
        step is settled as soon as it is dispatched."""
        parts = self.built
        source = parts.source
        source.resume()
        if self._stopping.is_set():
            # A stop that came as this pass began: resume() just cleared its source.stop().
            # Stopped again, a generator that starts anyway opens no shard (``_generate``).
            source.stop()
        source.begin_pass()
        iterator = iter(parts.dataset)
        exhausted = False
        drain_until: float | None = None
        first_step = self.step
        in_flight: _InFlight | None = None
        try:
            while not self._stopping.is_set() or self._draining(
                drain_until, trained=self.step > first_step or in_flight is not None
            ):
                if self._stopping.is_set() and drain_until is None:
                    drain_until = self._begin_drain()
                if source.rollback is not None:
                    break  # partitions were lost: the pass ends, the model goes back
                if self.config.steps_per_execution > 1:
                    k = self.config.steps_per_execution
                    self.callbacks.on_train_batch_begin(self.step, {"steps": k})
                    if self._run_steps(iterator):
                        exhausted = True
                        break
                    continue
                self.callbacks.on_train_batch_begin(self.step, {"steps": 1})
                t0 = time.perf_counter()
                self.health.waiting("trainer", "waiting for input")
                batch = source.next_batch(iterator)  # a step in flight runs meanwhile
                if batch is None:
                    exhausted = True
                    break
                t1 = time.perf_counter()
                meta = {k: batch.pop(k).numpy() for k in METADATA_COLUMNS}
                if in_flight is not None:
                    done, in_flight = in_flight, None
                    self._settle(done)
                    if self._stopping.is_set() and not self._draining(drain_until, trained=True):
                        break  # --max-steps reached: this batch is not trained (read again)
                handle = parts.steps.dispatch(batch)
                started = _InFlight(handle, meta, t1 - t0, time.perf_counter() - t1)
                if self._keep_in_flight(started):
                    in_flight = started
                else:
                    self._settle(started)
            if in_flight is not None:  # the pass's last step, before its checkpoint and commit
                done, in_flight = in_flight, None
                self._settle(done)
        finally:
            if in_flight is not None:  # an error ended the pass: the step ran, ack it
                try:
                    self._settle(in_flight)
                except Exception as exc:  # the error that ended the pass is the one raised
                    log.warning("the last step of a failed pass: %s", exc)
            source.training_over()
            box = [iterator]
            del iterator
            end_iterator(box, source.stop)
            self._end_pass()
        if drain_until is not None and not exhausted:
            log.warning(
                "the records already read were not all trained within %.0fs of the stop: "
                "those left, and any trained after them, are trained again after a restart",
                self._drain_seconds(),
            )
        rolled_back, self._rolled_back = self._rolled_back, False
        return exhausted and not self._stopping.is_set() and not rolled_back

    def _run_steps(self, iterator: Any) -> bool:
        """Up to --steps-per-execution steps in one call of the compiled function
        (``Trainer.run_steps``), then what each step is followed by (``_settle``'s work, the
        records acknowledged before any checkpoint); True when the pass's input ended. A call
        ends early after a step whose batch took over ``OVERLAP_MAX_WAIT_S`` to come: on a
        slow stream the records trained are acknowledged, committed and seen in freshness as
        promptly as one step a call."""
        cfg = self.config
        limit = cfg.steps_per_execution
        if cfg.max_steps is not None:
            limit = max(1, min(limit, cfg.max_steps - self.step))
        self.health.waiting("trainer", "waiting for input")
        try:
            out = self.built.steps.run_steps(
                iterator, limit, METADATA_COLUMNS, max_wait_seconds=OVERLAP_MAX_WAIT_S
            )
        except tf.errors.OpError as exc:
            # The steps of this call before the failure were applied and their records are
            # unknown here: the pass ends without a checkpoint, so the latest one still holds
            # exactly the steps acknowledged (a restart trains those records again).
            self._untracked = True
            log.warning(
                "a call of --steps-per-execution %d failed part way: no checkpoint at the end "
                "of this pass (the latest holds exactly the steps acknowledged)",
                cfg.steps_per_execution,
            )
            cause = self.built.source.shard_failure()
            if isinstance(cause, StreamerError):
                raise cause from exc
            raise PipelineError(
                "the training steps (their input or the model)", exc.message
            ) from exc
        self._settle_steps(out)
        return out.ended

    def _settle_steps(self, out: StepsResult) -> None:
        """The steps of one call, as ``_settle`` settles one: first every step's records (the
        skipped steps' wait, the applied steps' are acknowledged), then every step's metrics,
        status and extras, then the checkpoint and commit schedule once. When every step was
        applied (the common case) the records are acknowledged and observed in one call each,
        not one per step (profiled: per-step calls were half the main interpreter's GIL)."""
        status = required(self.status, "status line", "built with the parts")
        now = time.time()
        if out.applied.all():
            applied = list(range(out.steps))
            columns = out.columns
            if applied:
                self._acknowledge(columns["partition"], columns["offset"])
                self.metrics.observe_trained(
                    columns["partition"], columns["offset"], columns["timestamp"], now
                )
        else:
            applied = []
            for i in range(out.steps):
                meta = out.step_columns(i)
                if not out.applied[i]:
                    self._skipped(meta["partition"], meta["offset"])
                    continue
                self._acknowledge(meta["partition"], meta["offset"])
                self.metrics.observe_trained(
                    meta["partition"], meta["offset"], meta["timestamp"], now
                )
                applied.append(i)
        if not applied:
            return
        for i in applied:
            n, wait = int(out.rows[i]), float(out.input_wait_seconds[i])
            self.loss = float(out.losses[i])
            self.metrics.observe_step(n, float(out.step_seconds[i]), wait, self.loss)
            if self.first_wait_seconds is None:
                self.first_wait_seconds = wait
            self.step += 1
            status.waited(wait)
            status.maybe(self.step, self.loss)
        samples = int(out.rows[applied].sum())
        self._after_step(samples, float(out.input_wait_seconds[applied].sum()), len(applied))
        self.health.beat("trainer")
        self._last_data = time.monotonic()
        self.committer.after_step(self.step)
        cfg = self.config
        if cfg.max_steps is not None and self.step >= cfg.max_steps:
            self.request_stop(StopReason.max_steps(cfg.max_steps))

    def _keep_in_flight(self, step: _InFlight) -> bool:
        """Leave ``step`` unsettled while the next batch is read: only where the device runs
        the step asynchronously (an accelerator: on a CPU the step has finished when its call
        returns, so there is nothing to overlap), and only while the input keeps up (its batch
        came within ``OVERLAP_MAX_WAIT_S``: when the loop waits for input, settling at once
        keeps the ack, commit and freshness of a slow stream as prompt as before), and never
        for the step that reaches --max-steps (it ends the run without waiting for a batch)."""
        if not self.overlap_steps or step.input_wait > OVERLAP_MAX_WAIT_S:
            return False
        return self.config.max_steps is None or self.step + 1 < self.config.max_steps

    def _settle(self, step: _InFlight) -> None:
        """A dispatched step's result (waiting for the device if it is still busy) and what
        follows it: the ack of its records, metrics, checkpoint and commit schedule, status,
        export and evaluation. A checkpoint here holds exactly the steps acknowledged: the next
        step is dispatched only after this returns."""
        t = time.perf_counter()
        result = step.handle.result()
        step_seconds = step.dispatch_seconds + (time.perf_counter() - t)
        meta, wait = step.meta, step.input_wait
        n = len(meta["offset"])
        if not result.applied:
            self._skipped(meta["partition"], meta["offset"])
            return
        self.loss = result.loss
        self._acknowledge(meta["partition"], meta["offset"])
        self.metrics.observe_step(n, step_seconds, wait, self.loss)
        if self.first_wait_seconds is None:
            self.first_wait_seconds = wait  # includes joining the group: benchmarks skip it
        self.metrics.observe_trained(
            meta["partition"], meta["offset"], meta["timestamp"], time.time()
        )
        self.health.beat("trainer")
        self.step += 1
        self._last_data = time.monotonic()
        self.committer.after_step(self.step)
        status = required(self.status, "status line", "built with the parts")
        status.waited(wait)
        status.maybe(self.step, self.loss)
        self._after_step(n, wait)
        cfg = self.config
        if cfg.max_steps is not None and self.step >= cfg.max_steps:
            self.request_stop(StopReason.max_steps(cfg.max_steps))

    def _skipped(self, partition: np.ndarray, offset: np.ndarray) -> None:
        """A step was not applied (not finite): its records wait (``Lifecycle.skipped_step``);
        a diverged model is never checkpointed at the end."""
        self._last_data = time.monotonic()
        try:
            self.skipped_step(partition, offset)
        except ModelDivergedError as exc:
            self._diverged = exc
            raise

    def _acknowledge(self, partition: np.ndarray, offset: np.ndarray) -> None:
        """The records of applied steps are done (and those of the skipped run before them),
        in the audit log before the tracker, so the log is never behind a commit."""
        parts = self.built
        self.applied_step(parts.tracker.ack)  # a run of skipped steps ended
        if parts.audit is not None:
            parts.audit.add(partition, offset)
        parts.tracker.ack(partition, offset)

    def _draining(self, drain_until: float | None, *, trained: bool) -> bool:
        """Go on after a stop request, within the drain time: not after the reject breaker
        tripped (stop at once), nor at --max-steps without a shuffle window (N steps, exactly;
        a record read and not trained is read again, and one trained past it trained again),
        nor when this pass trained nothing yet (nothing can be past a record not trained; a
        stop as a pass begins would otherwise open its shards only to close them)."""
        if self.built.source.reject_limit is not None or not trained:
            return False
        reason = self._stop_reason
        if (
            reason is not None
            and reason.kind is StopKind.MAX_STEPS
            and not self.config.shuffle_buffer
        ):
            return False
        return drain_until is None or time.monotonic() < drain_until

    def status_lag(self) -> Callable[[], int] | None:
        """A replay's lag is what is left of its range (the records after --to are not its)."""
        start = self.built.start
        if start.stop is None:
            return None
        stop, first, tracker = dict(start.stop), dict(start.offsets), self.built.tracker

        def left() -> int:
            done = tracker.commit_points()
            return sum(max(0, end - done.get(p, first.get(p, 0))) for p, end in stop.items())

        return left

    # ---- export, summaries, profiling, evaluation ---------------------------------------------

    def _after_step(self, samples: int, input_wait_seconds: float, steps: int = 1) -> None:
        """What follows ``steps`` steps that ended at ``self.step`` (several: one call of
        --steps-per-execution, after all of them ran: an export or evaluation due at a step
        among them runs once, with the model as the call left it): the callbacks."""
        self.callbacks.on_train_batch_end(
            self.step,
            {
                "loss": self.loss,
                "samples": samples,
                "input_wait_seconds": input_wait_seconds,
                "steps": steps,
            },
        )

    def _export(self, step: int) -> bool:
        """This model at ``step`` (the loop's own), and its position in every partition."""
        exporter = required(self.exporter, "exporter", "built with --export-dir")
        parts = self.built
        # Every partition of the topic: its position, or None where this model has none.
        known = parts.trained_positions()
        offsets = {p: known.get(p) for p in sorted({*parts.topic_partitions, *known})}
        inputs = serving_inputs(parts.dataset.element_spec, parts.bundle.input_names)
        try:
            path = publish(exporter, parts.bundle.model, step, offsets, self.config.topic, inputs)
        except ModelDivergedError as exc:  # non-finite weights: never exported
            self._diverged = exc
            raise
        return path is not None

    # ---- commits and checkpoints ------------------------------------------------------------

    def _save(self, step: int, positions: dict[int, int]) -> dict[int, int] | None:
        """The checkpoint of a worker of its own: one save; what it saved is committed."""
        parts = self.built
        checkpointer = required(parts.checkpointer, "checkpointer", "built with --checkpoint-dir")
        if parts.lease is not None:
            parts.lease.check()
        try:
            path = checkpointer.save_logged(step, positions)
        except ModelDivergedError as exc:  # non-finite weights: never saved
            self._diverged = exc
            raise
        if path is None:
            return None
        audit = parts.audit.synced if parts.audit is not None else 0
        trained = self._trained_records()
        self.rollback_points.add(RollbackPoint(path, step, dict(positions), audit, trained=trained))
        return positions

    def _trained_records(self) -> int:
        """The records trained in this run so far (``streamer_samples_trained_total``)."""
        return int(self.metrics.snapshot()["samples_trained"])

    def _keep_start(self) -> None:
        """The state this run begins in, as the first checkpoint a loss of partitions may go
        back to: the checkpoint it restored, else one written now (beside the managed ones,
        never restored at a start). From here on a lost partition trained past its commit
        ends the pass and the model goes back (``_roll_back``)."""
        cfg, parts = self.config, self.built
        checkpointer = required(parts.checkpointer, "checkpointer", "built with --checkpoint-dir")
        positions = parts.position.current()
        path = checkpointer.latest if cfg.replay is None else None
        if path is None:
            directory = required(cfg.checkpoint_dir, "checkpoint directory", "--checkpoint-dir")
            prefix = os.path.join(directory, "rollback-start", "ckpt")
            path = checkpointer.write_copy(prefix, self.step, positions)
        audit = parts.audit.synced if parts.audit is not None else 0
        self.rollback_points.add(
            RollbackPoint(
                path, self.step, positions, audit, start=True, trained=self._trained_records()
            )
        )
        parts.source.roll_back_on_lost()

    def _roll_back(self) -> None:
        """Partitions were lost with records trained here and not committed: their next
        owner trains them from the group's commit, so this model goes back to the checkpoint
        of its last commit that succeeded, and those records are trained once. The audit
        log drops their lines; the directory's latest checkpoint is the one gone back to."""
        parts = self.built
        source = parts.source
        request = required(source.rollback, "rollback request", "partitions lost")
        checkpointer = required(parts.checkpointer, "checkpointer", "built with --checkpoint-dir")
        committed = source.committed()
        target = self.rollback_points.target(committed)
        if target is None:
            source.keep_trained()
            log.warning(
                "partitions %s were lost with records trained here and not committed, and "
                "no checkpoint is at or past every commit of this run (a partition was "
                "committed as it moved away since the last one): the model is kept, so their "
                "next owner trains those records again",
                request.lost,
            )
            return
        steps = self.step - target.step
        records = self._trained_records() - target.trained  # trained since that checkpoint
        checkpointer.restore_path(target.path, announce=False)
        self.step = target.step
        self.rollback_points.went_back_to(target)
        self.nonfinite.applied()  # records held by skipped steps are read again, too
        self.committer.rolled_back(target.step, target.positions)
        source.roll_back(target.positions, to_start=target.start)
        lines = parts.audit.truncate(target.audit_size) if parts.audit is not None else 0
        self._rolled_back = True
        parts.metrics.rollbacks.inc()
        log.warning(
            "partitions %s were lost (this member was fenced or its session expired: another "
            "member may train them from the group's commit now) with records trained here and "
            "not committed: went back to checkpoint %s at step %d (%d steps, %d records "
            "undone%s); each of those is trained once, by whoever owns its partition next",
            request.lost,
            target.path,
            target.step,
            steps,
            records,
            f", {lines} audit log lines dropped" if parts.audit is not None else "",
        )
        # The directory's latest checkpoint is the state gone back to: a restart must not
        # restore a newer one, which holds what was undone.
        self.committer.checkpoint(self.step)

    def _end_pass(self) -> None:
        """After a pass (or on stop): checkpoint if configured, commit everything done, close shards.

        A diverged model is never checkpointed, and with checkpoints nothing is committed past
        the last good one (commits follow checkpoints)."""
        parts = self.built
        source, lease = parts.source, parts.lease
        # The shards close below, and their partitions' lag with them.
        self._final_lag = int(parts.metrics.snapshot()["consumer_lag_records"])
        try:
            committer = self.committer
            if lease is not None and lease.lost is not None:
                return  # another worker holds the directory now: no checkpoint, no commit
            if source.rollback is not None:
                return  # what was trained since the last checkpoint is undone (below)
            if self._diverged is not None or self._untracked:
                if not committer.checkpointing:
                    committer.commit(committer.done_points(), self.step)
                return
            if self.reports is not None:
                self.reports.report(self.step)
            if source.reject_limit is None:
                source.settle_rejects()  # the pass's rejects are judged: commit past them
            checkpoints = committer.checkpoints
            moved = checkpoints is not None and self.step != checkpoints.last_step
            if checkpoints is not None and (self._stopping.is_set() or moved):
                checkpointer = required(parts.checkpointer, "checkpointer", "--checkpoint-dir")
                # A run that trained nothing writes nothing (a stop before the first step must
                # not leave an untrained model for the next start to restore); a replay's
                # directory is its output, so it gets the model it restored even so.
                first = not checkpointer.latest and (self.step > 0 or self.config.replay)
                if moved or first:
                    committer.checkpoint(self.step)
            else:
                committer.commit(committer.done_points(), self.step)
        finally:
            source.end_pass()  # its pending commits reach the group first
            lease_lost = lease is not None and lease.lost is not None
            if source.rollback is not None and parts.checkpointer is not None and not lease_lost:
                self._roll_back()
            self.callbacks.on_pass_end(self.step)

    def _close_more(self) -> None:
        self.callbacks.on_train_end()  # after the input's last commits (the lease's release)


def _describe(cfg: WorkerConfig, decoder: str) -> str:
    """The start line's settings: the shard runtime, devices and decoder as resolved, not as
    asked."""
    d = cfg.describe()
    d["decoder"] = decoder
    if cfg.bootstrap is not None:
        runtime, why = shard_runtime_choice(cfg.shard_runtime, cfg.shards, cfg.kafka_client)
        d["shard_runtime"] = runtime if why == "as set" else f"{runtime} ({why})"
    else:
        d["shard_runtime"] = "thread"  # the embedded simulator's shards are in-process
    d["devices"] = devices_in_use()
    keys = "bootstrap topic group shards shard_runtime devices batch_size checkpoint_dir"
    keys += " decoder metrics_port"
    replay = cfg.replay
    if replay is not None:
        d["group"] = replay.group or "(none: no commits)"
        d["replay"] = f"[{replay.from_text}, {replay.to_text})"
        d["restore_from"] = replay.restore_from
        d["partitions"] = ",".join(str(p) for p in cfg.partitions or ())
        d["export_dir"] = cfg.export_dir
        keys = "replay restore_from " + keys + " partitions export_dir"
    return " ".join(f"{k}={d[k]}" for k in keys.split() if k in d)


def devices_in_use() -> str:
    """The devices training runs on, as TensorFlow sees them: ``GPU:0,GPU:1`` or ``CPU``."""
    gpus = [d.name.removeprefix("/device:") for d in tf.config.list_logical_devices("GPU")]
    return ",".join(gpus) or "CPU"
