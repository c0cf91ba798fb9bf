"""DistributedWorker: one model trained by N worker processes in lock-step
(MultiWorkerMirroredStrategy), each reading its own partitions.

Every round, each worker (1) cuts a batch of exactly --batch-size rows from its own input,
padding with weight-0 rows what did not come within --pad-after-seconds; (2) all-reduces a
small control vector (real rows, stop, idle, checkpoint due, full batch, last loss); (3) when
a row is real anywhere, takes one training step whose loss is normalised by the all-reduced
real count (else no weight changes: an idle step); (4) acks its real rows' offsets, which
travel inside the batch. Every decision after that (stop, checkpoint) is a function of
all-reduced values and the step count, so all workers take it at the same round. A
checkpoint all-reduces every partition's offset (each worker fills its own), the chief writes
it (the others write throwaway copies that are removed), and each worker then commits its own
partitions. At start-up the chief restores the latest checkpoint and broadcasts model,
optimizer, step and offsets: no other worker reads the checkpoint directory. A collective that
fails (a peer died) ends the process at once with an error naming the lost worker.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from typing import IO, Any

import numpy as np
import tensorflow as tf

from consumers.errors import StreamerError
from streamer.cluster.padding import END, Batch, PaddedBatcher
from streamer.cluster.plan import ClusterPlan, PeerLostError, check_config, peer_lost, throwaway_dir
from streamer.cluster.strategy import ClusterStep, weights_digest
from streamer.cluster.topology import (
    Control,
    Topology,
    decide,
    offsets_from_vector,
    offsets_vector,
    should_wait,
)
from streamer.config import WorkerConfig
from streamer.decode.columns import flat_outputs, from_flat, to_batch
from streamer.input.errors import PipelineError
from streamer.input.source import end_iterator
from streamer.lifecycle import Lifecycle
from streamer.parts import Parts, required
from streamer.stopping import StopKind, StopReason
from streamer.train.callbacks import Export, TrainMetricReport
from streamer.train.export import Exporter, publish, serving_inputs

__all__ = ["DistributedWorker", "PeerLostError", "check_config"]

log = logging.getLogger(__name__)

#: Decoded blocks buffered between the input pipeline's reader thread and the batcher.
_QUEUE_BLOCKS = 8
#: After a lost peer: the seconds given to closing the consumers, and to all of the clean-up
#: before the process exits anyway.
_ABORT_CLOSE_S = 1.0
_ABORT_CLEANUP_S = 5.0


class DistributedWorker(Lifecycle[ClusterStep]):
    """One worker of a multi-worker cluster; ``run()`` returns the exit code.

    ``exit_now`` is True after ``run()`` when the process should end at once (a lost peer or
    another failure: TensorFlow's collective runtime may keep it from exiting). The life it
    shares with a worker of its own is ``streamer.lifecycle.Lifecycle``; the commit sequence
    ``streamer.committer.Committer`` (with a cluster's save, ``_save``).

    >>> code = DistributedWorker(config, topology).run()   # doctest: +SKIP
    """

    stop_plan = "every worker checkpoints at the next round, then exits"

    def __init__(
        self, config: WorkerConfig, topology: Topology, *, status_out: IO[str] | None = None
    ) -> None:
        check_config(config, topology)
        super().__init__(config, status_out=status_out)
        self.topology = topology
        self.exit_now = False
        self._reader: threading.Thread | None = None
        self._reader_stop = threading.Event()
        self.blocks: queue.Queue[Any] = queue.Queue(maxsize=_QUEUE_BLOCKS)
        self._formed = False
        #: The train-metric window: the chief votes when it is over (``Control.REPORT``).
        self.reports = TrainMetricReport(
            config.status_interval,
            lambda: self.built.steps.metric_values(),
            metrics=None,
            status=lambda: self.status,
            automatic=False,
        )
        self.callbacks.append(self.reports)
        #: --export-dir: every worker exports at the same rounds (the offsets all-reduced),
        #: the chief into the directory (``_export``).
        self.exports: Export | None = None
        self.exporter: Exporter | None = None  # the chief's, into --export-dir
        self._batch_spec: dict[str, Any] | None = None  # the first batch's (``_features``)

    # ---- set-up -----------------------------------------------------------------------------

    def _build(self) -> Parts[ClusterStep]:
        """The parts (``Lifecycle.build`` with a ``ClusterPlan``): MWMS forms first, before
        any other TensorFlow op; metrics and probes before it (forming waits for every
        worker, and a probe should find this one alive meanwhile)."""
        topo = self.topology
        log.info(
            "multi-worker training: %s (%s), chief at %s; joining the cluster",
            topo.describe(),
            topo.source,
            topo.hosts[0],
        )
        parts = self.build(ClusterPlan(topo, formed=self._take_signals_back))
        self.reports.metrics = parts.metrics
        cfg = self.config
        if topo.chief:  # as Keras' TensorBoard callback under MWMS: the chief writes
            self.reports.summaries = self.logdir_callbacks(parts)
        if cfg.export_dir:
            if topo.chief:  # its directory made now: a bad one fails at start, not mid-run
                self.exporter = Exporter(cfg.export_dir, keep=cfg.export_keep)
            self.exports = Export(cfg.export_every_steps, self._export, start_step=self.step)
            self.callbacks.append(self.exports)
        return parts

    def _take_signals_back(self) -> None:
        if self._signal_watch is not None:
            self._signal_watch.rearm()  # TensorFlow's coordination service took SIGTERM

    def _readiness(self, assigned: int) -> tuple[bool, str]:
        if not self._formed:
            return False, "waiting for the first round of the cluster"
        ready, why = super()._readiness(assigned)
        if not ready:
            return ready, why
        return True, f"{self.topology.describe()} stepping, {assigned} partitions assigned"

    # ---- the input: a thread turns tf.data's decoded blocks into numpy columns ---------------

    def _read(self) -> None:
        parts = self.built
        source = parts.source
        iterator = iter(parts.dataset)
        try:
            while not self._reader_stop.is_set():
                try:
                    out = next(iterator)
                except StopIteration:
                    self._put(END)
                    return
                except tf.errors.OpError as exc:
                    cause = source.shard_failure()
                    if isinstance(cause, StreamerError):
                        raise cause from exc
                    raise PipelineError("the input pipeline", exc.message) from exc
                self._put(from_flat(parts.schema, [t.numpy() for t in out]))
        except BaseException as exc:
            self._put(exc)
        finally:
            box = [iterator]
            del iterator
            end_iterator(box, source.stop)

    def _put(self, item: Any) -> None:
        while not self._reader_stop.is_set():
            try:
                self.blocks.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _features(self, batch: Batch) -> dict[str, Any]:
        features = to_batch(
            self.built.schema, [tf.constant(a) for a in flat_outputs(batch.columns)]
        )
        if self._batch_spec is None:  # an export's signature: the specs of a batch's inputs
            self._batch_spec = {k: tf.type_spec_from_value(v) for k, v in features.items()}
        return features

    # ---- the loop ---------------------------------------------------------------------------

    def _run(self) -> int:
        parts = self._build()
        cfg = self.config
        log.info(
            "worker %s starting at step %d: cluster=%d/%d chief=%s partitions=%s %s",
            cfg.worker_id,
            self.step,
            self.topology.index,
            self.topology.count,
            "yes" if self.topology.chief else "no",
            ",".join(map(str, parts.partitions)),
            _describe(cfg, parts.decoder),
        )
        if cfg.steps_per_execution > 1:
            log.warning(
                "--steps-per-execution %d is for the local loop: the multi-worker loop pads "
                "and all-reduces each step's batch, one step per call",
                cfg.steps_per_execution,
            )
        reason = self._loop()
        if parts.source.reject_limit is not None:
            raise parts.source.reject_limit
        self._close_input()  # the consumers' last commits land before the final frame
        if self.status is not None:
            self.status.maybe(self.step, self.loss, final=True)
            self.status.end()
        log.info("stopped (%s) at step %d", reason, self.step)
        return cfg.peer_stop_exit_code if reason.kind is StopKind.PEER else 0

    def _failed(self, exc: StreamerError) -> int:
        self.exit_now = True  # peers must not wait in a collective for this worker
        if isinstance(exc, PeerLostError):
            # Closing the consumers is worth a moment, never a hang.
            deadline = threading.Timer(_ABORT_CLEANUP_S, os._exit, args=(1,))
            deadline.daemon = True
            deadline.start()
            self._abandon()
            return 1
        return exc.exit_code

    def _close_more(self) -> None:
        self.callbacks.on_train_end()

    def _crashed(self, exc: Exception) -> int:
        # A bug or an unexpected library error: the peers must not wait in a collective for
        # this worker, so it ends like a lost peer would (exit_now).
        log.error("%s: worker failed", self.topology.describe(), exc_info=exc)
        self.exit_now = True
        return 1

    def _loop(self) -> StopReason:
        try:
            return self._rounds()
        except tf.errors.OpError as exc:
            raise peer_lost(self.topology, exc) from exc

    def _rounds(self) -> StopReason:
        cfg, topo, parts = self.config, self.topology, self.built
        source, steps = parts.source, parts.steps
        status = required(self.status, "status line", "built with the parts")
        # The chief's checkpoint schedule votes; the round's all-reduced decision happens.
        committer = self.committer
        batcher = PaddedBatcher(parts.schema, cfg.batch_size, pad_after=cfg.pad_after_seconds)
        source.resume()
        source.begin_pass()
        self._reader = threading.Thread(target=self._read, name="streamer-input", daemon=True)
        self._reader.start()
        wait = True
        loss_sum, loss_rows = 0.0, 0
        last_data = time.monotonic()
        drain_until: float | None = None  # set when every worker drains before a stop
        while True:
            batch = batcher.next(self.blocks, wait=wait)
            t1 = time.perf_counter()  # the round's step time: the all-reduces and the step
            now = time.monotonic()
            if batch.real:
                last_data = now
            done = (
                (batcher.ended and not batcher.pending)
                or (cfg.stop_after_idle is not None and now - last_data >= cfg.stop_after_idle)
                or (drain_until is not None and now >= drain_until)
            )
            timer = topo.chief and committer.checkpoint_due(self.step)
            if source.reject_limit is not None and not self._stopping.is_set():
                self.request_stop(StopReason.reject_breaker())
            stop_here = self._stopping.is_set()  # what this worker says, and why, once
            ctrl = steps.sync(
                Control.local(
                    real=batch.real,
                    stop=stop_here,
                    done=done,
                    checkpoint=timer,
                    full=batch.real == batch.size,
                    loss_sum=loss_sum,
                    report=topo.chief and self.reports.due(),
                )
            )
            if loss_rows:
                self.loss = float(ctrl[Control.LOSS]) / loss_rows
            rows = round(float(ctrl[Control.REAL]))
            loss_sum, loss_rows = 0.0, 0
            applied = True
            if rows:
                # Applied or skipped alike on every worker: the verdict is all-reduced.
                loss_sum, applied = steps.train(self._features(batch), batch.weight, rows)
                if applied:
                    loss_rows = rows
                    self.step += 1
                else:
                    loss_sum = 0.0
            t2 = time.perf_counter()
            self._after_step(batch, rows, applied, t2 - t1)
            decision = decide(
                ctrl,
                workers=topo.count,
                step=self.step,
                last_checkpoint_step=committer.checkpointed_step,
                checkpoint_every_steps=cfg.checkpoint_every_steps if parts.checkpointer else None,
                max_steps=cfg.max_steps,
                stopping_here=self._stop_reason if stop_here else None,
                stop_after_idle=cfg.stop_after_idle,
                draining=drain_until is not None,
            )
            if decision.drain:
                drain_until = self._begin_drain()
            if decision.stop is not None and source.reject_limit is None:
                source.settle_rejects()  # a clean stop: the rejects so far are judged
            if decision.report:  # reading Keras' metrics all-reduces them: every worker now
                self.reports.report(self.step)
            committer.after_step(
                self.step, agreed=decision.checkpoint, final=decision.stop is not None
            )
            status.waited(batch.waited)
            status.maybe(self.step, self.loss)
            wait = should_wait(ctrl, mine=batch.real, full=batch.real == batch.size)
            if decision.stop is not None:
                # Every worker at this round (the export all-reduces): the final model too.
                if self.exports is not None:
                    self.exports.final(self.step)
                return decision.stop

    def _after_step(self, batch: Batch, rows: int, applied: bool, seconds: float) -> None:
        """Ack this worker's real rows (their offsets came with the batch), count the round.

        A skipped step (not finite) holds its rows until a step is applied; every worker counts
        the same run of skipped rounds, so all stop together when it is too long."""
        parts = self.built
        metrics = parts.metrics
        part, off, ts = batch.metadata()
        if rows and not applied:
            self.skipped_step(part, off, everywhere=True)
        elif rows:
            self.applied_step(parts.tracker.ack)
        if batch.real and applied:
            if parts.audit is not None:
                parts.audit.add(part, off)
            parts.tracker.ack(part, off)
            metrics.observe_trained(part, off, ts, time.time())
        if rows and applied:
            loss = None if np.isnan(self.loss) else self.loss
            metrics.observe_step(batch.real, seconds, batch.waited, loss)
            self.callbacks.on_train_batch_end(
                self.step,
                {
                    "loss": self.loss,
                    "samples": batch.real,
                    "input_wait_seconds": batch.waited,
                    "steps": 1,
                },
            )
        metrics.observe_round(batch.padded, idle=not rows)
        self.health.beat("trainer")
        self._formed = True

    # ---- checkpoints and commits --------------------------------------------------------------

    def _save(self, step: int, positions: dict[int, int]) -> dict[int, int] | None:
        """Every worker at the same round: offsets all-reduced (each fills its own), the
        chief's checkpoint written (throwaway copies elsewhere, as MWMS needs every worker
        to save); returns this worker's partitions' offsets to commit, or None when a save
        failed anywhere."""
        parts = self.built
        checkpointer = required(parts.checkpointer, "checkpointer", "built with --checkpoint-dir")
        own, count = frozenset(parts.partitions), max(parts.topic_partitions) + 1
        mine = {p: o for p, o in positions.items() if p in own}
        offsets = offsets_from_vector(parts.steps.sync(offsets_vector(mine, count)))
        self.health.beat("trainer")
        path = ""
        try:
            if self.topology.chief:
                path = checkpointer.save(step, offsets)
            else:
                path = checkpointer.write_copy(
                    os.path.join(throwaway_dir(self.config, self.topology), f"ckpt-{step}"),
                    step,
                    offsets,
                )
            ok = True
        except (OSError, tf.errors.OpError) as exc:
            # A save is local (no collective): a full or read-only volume is this worker's
            # failure, not a lost peer. A peer that is really gone shows at the sync below.
            log.error("checkpoint at step %d failed: %s", step, exc)
            ok = False
        finally:
            if not self.topology.chief:
                shutil.rmtree(throwaway_dir(self.config, self.topology), ignore_errors=True)
        saved = round(float(parts.steps.sync(np.array([float(ok)], np.float32))[0]))
        self.health.beat("trainer")
        if saved < self.topology.count:
            log.error(
                "checkpoint at step %d failed on %d of %d workers: nothing committed",
                step,
                self.topology.count - saved,
                self.topology.count,
            )
            return None
        log.info(
            "checkpoint %s at step %d weights %s", path, step, weights_digest(parts.bundle.model)
        )
        return {p: o for p, o in offsets.items() if p in own}

    def _export(self, step: int) -> bool:
        """Every worker at the same round: every partition's position all-reduced (each fills
        its own), the model exported by the chief into --export-dir and by the others into
        a throwaway directory (as checkpoints: saving under MWMS is every worker's work).
        True: tried, whether or not it succeeded here (a failure is logged), so every
        worker's ``Export`` takes the same decisions, and so the same all-reduces, after it."""
        parts, topo = self.built, self.topology
        own, count = frozenset(parts.partitions), max(parts.topic_partitions) + 1
        known = parts.trained_positions()
        mine = {p: o for p, o in known.items() if p in own}
        every = offsets_from_vector(parts.steps.sync(offsets_vector(mine, count)))
        offsets = {p: every.get(p) for p in parts.topic_partitions}
        self.health.beat("trainer")
        throwaway = None if topo.chief else tempfile.mkdtemp(prefix="streamer-export-")
        try:
            exporter = (
                Exporter(throwaway)
                if throwaway is not None
                else required(self.exporter, "exporter", "built with --export-dir")
            )
            model = parts.bundle.model
            spec = self._batch_spec  # None before any batch: Keras' own, from the model
            inputs = None if spec is None else serving_inputs(spec, parts.bundle.input_names)
            publish(exporter, model, step, offsets, self.config.topic, inputs, announce=topo.chief)
            return True
        finally:
            if throwaway is not None:
                shutil.rmtree(throwaway, ignore_errors=True)

    # ---- shutdown -----------------------------------------------------------------------------

    def _abandon(self) -> None:
        """A lost peer: the input pipeline may never stop cleanly now (TensorFlow aborted its
        collectives); keep what is written, close the consumers for a moment at most."""
        self._stopping.set()
        source = self.source
        self._input_closed = True
        if source is not None:
            source.training_over()
        self._reader_stop.set()
        self._reader = None  # not joined
        if self.parts is not None and self.parts.audit is not None:
            self.parts.audit.close()  # what was trained is on disk
        if source is not None:
            source.stop()
            closing = threading.Thread(target=source.close, name="streamer-abort", daemon=True)
            closing.start()
            closing.join(_ABORT_CLOSE_S)

    def _close_input(self) -> None:
        """Stop the input reader and close the consumers (their commits are sent first)."""
        source = self.source
        self._input_closed = True
        if source is not None:
            source.training_over()
        self._reader_stop.set()
        if source is not None:
            source.stop()
        if self._reader is not None:
            self._reader.join(10.0)
            self._reader = None
        if source is not None:
            source.close()


def _describe(cfg: WorkerConfig, decoder: str) -> str:
    d = {**cfg.describe(), "decoder": decoder}
    keys = "bootstrap topic group shards batch_size pad_after_seconds checkpoint_dir decoder"
    keys += " metrics_port"
    return " ".join(f"{k}={d[k]}" for k in keys.split())
