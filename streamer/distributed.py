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

import dataclasses
import gc
import logging
import os
import queue
import shutil
import signal
import sys
import threading
import time
from typing import IO, Any

import numpy as np
import tensorflow as tf

from consumers.errors import ConfigError, ModelDivergedError, PipelineError, StreamerError
from streamer.breaker import capped
from streamer.checkpoint import Checkpointer
from streamer.columns import flat_outputs, to_batch
from streamer.commits import AuditLog, CommitSchedule
from streamer.config import WorkerConfig
from streamer.health import Health, MetricsServer
from streamer.metrics import Metrics
from streamer.model import load_model
from streamer.multiworker import (
    Control,
    Topology,
    decide,
    lost_worker,
    offsets_from_vector,
    offsets_vector,
    should_wait,
    worker_partitions,
)
from streamer.mwms import ClusterStep, is_peer_loss, make_strategy, weights_digest
from streamer.nonfinite import NonFiniteSteps, describe_offsets
from streamer.offsets import OffsetTracker
from streamer.padding import END, Batch, PaddedBatcher
from streamer.position import StreamPosition
from streamer.ragged import Column, RaggedColumn
from streamer.signals import SignalWatch, StopOnSignal
from streamer.source import StreamSource
from streamer.status import StatusLine

__all__ = ["DistributedWorker", "PeerLostError", "check_config"]

log = logging.getLogger("streamer.worker")

#: Decoded blocks buffered between the input pipeline's reader thread and the batcher.
_QUEUE_BLOCKS = 8
#: A pass never ends on idle shards in multi-worker training: a worker whose input pauses
#: pads its batches instead (its consumers stay open).
_NO_IDLE_END_S = 10.0**9
#: After a lost peer: the seconds given to closing the consumers, and to all of the clean-up
#: before the process exits anyway.
_ABORT_CLOSE_S = 1.0
#: The model's compiled metrics are read (an all-reduce) and reported every this many steps.
_TRAIN_METRICS_EVERY_STEPS = 100
_ABORT_CLEANUP_S = 5.0


class PeerLostError(StreamerError):
    """A collective failed: another worker died or the cluster aborted."""

    def __init__(self, topology: Topology, lost: str, detail: str) -> None:
        self.lost = lost
        first = _gist(detail)
        super().__init__(
            f"{topology.describe()} lost {lost}: {first}. Exiting: restart every worker "
            "together (they resume from the last checkpoint)"
        )


def _gist(message: str) -> str:
    """The line of a TensorFlow error that says what happened (its first line is often just
    "Graph execution error:")."""
    lines = [x.strip() for x in message.splitlines() if x.strip()]
    for key in ("aborted by:", "unhealthy", "Connection", "connect", "Unavailable", "UNAVAILABLE"):
        for line in lines:
            if key in line:
                return line
    useful = [x for x in lines if not x.endswith(":") and not x.startswith(("[[", "Detected at"))]
    return (useful or lines or ["(no message)"])[0]


def check_config(cfg: WorkerConfig, topology: Topology) -> None:
    """Options that have no meaning (yet) for one model on N workers, refused at start-up."""
    if cfg.bootstrap is None:
        raise ConfigError(
            "bootstrap", None, f"{topology.describe()}: multi-worker training reads Kafka"
        )
    for name, why in (
        ("eval_topic", "evaluate on one worker of its own from the chief's checkpoints"),
        ("export_dir", "export from the chief's checkpoints"),
        ("logdir", "not supported with several workers yet"),
        ("profile_steps", "not supported with several workers yet"),
        ("pass_records", "a multi-worker pass lasts the whole run (quiet input is padded)"),
        ("pass_seconds", "a multi-worker pass lasts the whole run (quiet input is padded)"),
        ("replay", "replay a range with one worker"),
    ):
        if getattr(cfg, name) is not None:
            raise ConfigError(name, getattr(cfg, name), f"{topology.describe()}: {why}")
    if cfg.mixed_precision:
        raise ConfigError(
            "mixed_precision",
            True,
            f"{topology.describe()}: not with several workers yet (Keras' loss scaling checks "
            "each worker's gradients before they are all-reduced, so workers could disagree "
            "on skipping a step and wait for each other forever)",
        )


class DistributedWorker:
    """One worker of a multi-worker cluster; ``run()`` returns the exit code.

    ``exit_now`` is True after ``run()`` when the process should end at once (a lost peer or
    another failure: TensorFlow's collective runtime may keep it from exiting).

    >>> code = DistributedWorker(config, topology).run()   # doctest: +SKIP
    """

    def __init__(
        self, config: WorkerConfig, topology: Topology, *, status_out: IO[str] | None = None
    ) -> None:
        check_config(config, topology)
        self.config = config
        self.topology = topology
        self.status_out = status_out or sys.stderr
        self.step = 0
        self.loss = float("nan")
        self.exit_now = False
        self.health = Health(config.stall_timeout)
        self.metrics: Metrics | None = None
        self.server: MetricsServer | None = None
        self.checkpointer: Checkpointer | None = None
        self.audit: AuditLog | None = None
        self.source: StreamSource | None = None
        self._stop_wanted = threading.Event()
        self._stop_reason: str | None = None
        self._finished = threading.Event()
        self._signal_stop = StopOnSignal(
            plan="every worker checkpoints at the next round, then exits",
            stop=self.request_stop,
            finished=self._finished,
            timeout=config.shutdown_timeout,
            log=log,
        )
        self._reader: threading.Thread | None = None
        self._reader_stop = threading.Event()
        self.blocks: queue.Queue[Any] = queue.Queue(maxsize=_QUEUE_BLOCKS)
        self._formed = False
        self._signal_watch: SignalWatch | None = None
        self.nonfinite = NonFiniteSteps(config.max_nonfinite_steps)

    # ---- signals ----------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        self._signal_stop(signum)

    def request_stop(self, reason: str) -> None:
        """Ask the cluster to stop: this worker says so in its next round's control vector."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop_wanted.set()

    # ---- set-up -----------------------------------------------------------------------------

    def _build(self) -> None:
        cfg, topo = self.config, self.topology
        # MWMS configures TensorFlow's collective runtime: before any other TensorFlow op.
        log.info(
            "multi-worker training: %s (%s), chief at %s; joining the cluster",
            topo.describe(),
            topo.source,
            topo.hosts[0],
        )
        import kafka

        from consumers.admin import wait_for_topic
        from streamer import __version__

        # Metrics and probes first (no TensorFlow op): forming the cluster waits for every
        # worker, and a probe should find this one alive meanwhile.
        metrics = self.metrics = Metrics(
            cfg.topic,
            version=__version__,
            tensorflow_version=tf.__version__,
            kafka_python_version=kafka.__version__,
        )
        metrics.cluster_workers.set(topo.count)
        if cfg.metrics_port:
            self.server = MetricsServer(
                metrics.registry, self.health, host=cfg.metrics_host, port=cfg.metrics_port
            ).start()
            log.info("metrics on http://%s:%d/metrics", cfg.metrics_host, self.server.port)
        from streamer.tfstart import quiet_start

        with quiet_start():  # TensorFlow's runtime starts here: its start-up noise filtered
            strategy = make_strategy(topo)
        if self._signal_watch is not None:
            self._signal_watch.rearm()  # TensorFlow's coordination service took SIGTERM
        if cfg.seed is not None:
            tf.keras.utils.set_random_seed(cfg.seed)
        self.schema = cfg.load_schema()
        with strategy.scope():
            self.bundle = load_model(cfg.model, self.schema, cfg.learning_rate)
        self.steps = ClusterStep(strategy, self.bundle, topo, jit_compile=cfg.jit_compile)

        ids: dict[str, str] = {}
        everything = wait_for_topic(
            cfg.consumer_settings(),
            health=self.health,
            stop=self._stop_wanted,
            topic_ids=ids,
            broker_wait_s=cfg.broker_wait_seconds,
        )
        if cfg.partitions:
            everything = sorted(set(everything) & set(cfg.partitions))
        self.num_partitions = max(everything) + 1
        self.partitions = worker_partitions(everything, topo.index, topo.count)
        if not self.partitions:
            raise ConfigError(
                "cluster",
                topo.count,
                f"{topo.count} workers but {len(everything)} partitions to read: every worker "
                "needs at least one (run at most as many workers as partitions)",
            )
        self._mine = frozenset(self.partitions)

        restored = self._restore(ids.get(cfg.topic))
        self.position = StreamPosition(restored)
        self.tracker = OffsetTracker()
        local = dataclasses.replace(
            cfg, partitions=tuple(self.partitions), shards=min(cfg.shards, len(self.partitions))
        )
        settings = dataclasses.replace(
            local.pipeline_settings(), idle_timeout_seconds=_NO_IDLE_END_S
        )
        self.source = StreamSource(
            self.schema,
            settings,
            consumer=local.consumer_settings(),
            tracker=self.tracker,
            metrics=metrics,
            health=self.health,
            dead_letter=self._dead_letter(local, len(everything)),
            restore_offsets=restored,
        )
        self.dataset = self.source.flat_blocks()
        self.batcher = PaddedBatcher(self.schema, cfg.batch_size, pad_after=cfg.pad_after_seconds)
        self.audit = AuditLog(cfg.audit_log, cfg.topic) if cfg.audit_log else None
        threading.Thread(target=self._watch, name="streamer-readiness", daemon=True).start()

    def _restore(self, topic_id: str | None) -> dict[int, int]:
        """The chief restores the latest checkpoint and every worker takes its state (model,
        optimizer, step, offsets) by broadcast; returns this worker's partitions' offsets."""
        cfg, topo = self.config, self.topology
        step, offsets = 0, dict[int, int]()
        if cfg.checkpoint_dir:
            self.checkpointer = Checkpointer(
                cfg.checkpoint_dir, self.bundle, topic=cfg.topic, keep=cfg.checkpoint_keep
            )
            if topo.chief:
                found = self.checkpointer.restore()
                if found is not None:
                    step, offsets = found
                    if not self.checkpointer.adopt_topic_id(topic_id):
                        offsets = {}
            else:
                self.checkpointer.topic_id = topic_id
                shutil.rmtree(self._throwaway_dir(), ignore_errors=True)  # a crash's leftovers
        extra = np.concatenate(([float(step)], offsets_vector(offsets, self.num_partitions)))
        try:
            shared = self.steps.broadcast(extra)
        except tf.errors.OpError as exc:
            raise self._peer_lost(exc) from exc
        self.step = int(shared[0])
        mine = {p: o for p, o in offsets_from_vector(shared[1:]).items() if p in self._mine}
        log.info(
            "cluster restore: step %d, offsets %s weights %s",
            self.step,
            mine,
            weights_digest(self.bundle.model),
        )
        return mine

    def _dead_letter(self, cfg: WorkerConfig, partitions: int) -> Any:
        if not cfg.dead_letter_topic:
            return None
        from consumers.admin import ensure_topic
        from streamer.deadletter import DeadLetterWriter

        consumer = cfg.consumer_settings()
        sized = ensure_topic(
            consumer,
            cfg.dead_letter_topic,
            partitions=partitions,
            replication_factor=cfg.dead_letter_replication_factor,
        )
        metrics = self.metrics
        assert metrics is not None

        def done(p: int, o: int) -> None:
            self.tracker.ack(np.array([p], np.int32), np.array([o], np.int64))
            metrics.observe_dead_lettered(1)

        return DeadLetterWriter(
            cfg.bootstrap or "",
            cfg.dead_letter_topic,
            on_done=done,
            on_failure=lambda _exc: metrics.kafka_error("dead_letter"),
            security=consumer.security.kafka_config(),
            max_message_bytes=sized.max_message_bytes,
            max_record_bytes=sized.source_max_message_bytes,
        )

    def _throwaway_dir(self) -> str:
        assert self.config.checkpoint_dir is not None
        return os.path.join(self.config.checkpoint_dir, f"workertemp_{self.topology.index}")

    def _watch(self) -> None:
        """Every second: readiness (cluster formed, partitions assigned) and queue depths."""
        cfg = self.config
        capacity = cfg.shards * cfg.queue_max_blocks * cfg.max_poll_records
        while not self._finished.wait(1.0):
            source, metrics = self.source, self.metrics
            if source is None or metrics is None:
                continue
            metrics.set_queue("shard", source.queued_records(), capacity)
            metrics.set_queue("prefetch", self.tracker.in_flight(), 0)
            if self._stop_wanted.is_set():
                continue
            assigned = source.assigned_partitions()
            if not self._formed:
                self.health.set_ready(False, "waiting for the first round of the cluster")
            elif assigned == 0:
                self.health.set_ready(False, "no partitions assigned")
            else:
                self.health.set_ready(
                    True, f"{self.topology.describe()} stepping, {assigned} partitions assigned"
                )

    # ---- the input: a thread turns tf.data's decoded blocks into numpy columns ---------------

    def _read(self) -> None:
        assert self.source is not None
        source = self.source
        iterator = iter(self.dataset)
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
                self._put(self._columns(out))
        except BaseException as exc:
            self._put(exc)
        finally:
            del iterator
            gc.collect()

    def _put(self, item: Any) -> None:
        while not self._reader_stop.is_set():
            try:
                self.blocks.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _columns(self, out: tuple[tf.Tensor, ...]) -> list[Column]:
        arrays = [t.numpy() for t in out]
        cols: list[Column] = []
        at = 0
        for f in self.schema.features:
            if f.is_variable:
                cols.append(RaggedColumn(arrays[at], arrays[at + 1]))
                at += 2
            else:
                cols.append(arrays[at])
                at += 1
        return [*cols, *arrays[at:]]

    def _features(self, batch: Batch) -> dict[str, Any]:
        return to_batch(self.schema, [tf.constant(a) for a in flat_outputs(batch.columns)])

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.config
        watch: SignalWatch | None = None
        if threading.current_thread() is threading.main_thread():
            watch = SignalWatch(self._on_signal, (signal.SIGTERM, signal.SIGINT))
        self._signal_watch = watch
        try:
            self._build()
            log.info(
                "worker %s starting at step %d: cluster=%d/%d chief=%s partitions=%s %s",
                cfg.worker_id,
                self.step,
                self.topology.index,
                self.topology.count,
                "yes" if self.topology.chief else "no",
                ",".join(map(str, self.partitions)),
                _describe(cfg),
            )
            reason = self._loop()
            if self.source is not None and self.source.reject_limit is not None:
                raise self.source.reject_limit
            self._close_input()  # the consumers' last commits land before the final frame
            self._status.maybe(self.step, self.loss, final=True)
            self._status.end()
            log.info("stopped (%s) at step %d", reason, self.step)
            return cfg.peer_stop_exit_code if reason.startswith("another worker") else 0
        except PeerLostError as exc:
            log.error("%s", exc)
            self.exit_now = True
            # Closing the consumers is worth a moment, never a hang.
            deadline = threading.Timer(_ABORT_CLEANUP_S, os._exit, args=(1,))
            deadline.daemon = True
            deadline.start()
            self._abandon()
            return 1
        except StreamerError as exc:  # ConfigError: 2; README: exit codes
            log.error("%s", exc)
            self.exit_now = True
            return exc.exit_code
        except Exception:
            # A bug or an unexpected library error: the peers must not wait in a collective
            # for this worker, so it ends like a lost peer would (exit_now).
            log.exception("%s: worker failed", self.topology.describe())
            self.exit_now = True
            return 1
        finally:
            self._shutdown()
            self._finished.set()
            if watch is not None:
                watch.close()

    def _peer_lost(self, exc: tf.errors.OpError) -> StreamerError:
        if not is_peer_loss(exc):
            return StreamerError(f"{self.topology.describe()}: training failed: {exc.message}")
        return PeerLostError(self.topology, lost_worker(exc.message, self.topology), exc.message)

    def _loop(self) -> str:
        try:
            return self._rounds()
        except tf.errors.OpError as exc:
            raise self._peer_lost(exc) from exc

    def _rounds(self) -> str:
        cfg, topo, metrics = self.config, self.topology, self.metrics
        assert metrics is not None and self.source is not None
        status = self._status = StatusLine(self.status_out, cfg.status_interval, metrics)
        commits = CommitSchedule(cfg.commit_every_steps, cfg.commit_every_seconds, step=self.step)
        self._last_checkpoint = (self.step, time.monotonic())
        self.source.resume()
        self.source.begin_pass()
        self._reader = threading.Thread(target=self._read, name="streamer-input", daemon=True)
        self._reader.start()
        wait = True
        loss_sum, loss_rows = 0.0, 0
        last_data = time.monotonic()
        while True:
            batch = self.batcher.next(self.blocks, wait=wait)
            t1 = time.perf_counter()  # the round's step time: the all-reduces and the step
            now = time.monotonic()
            if batch.real:
                last_data = now
            done = (self.batcher.ended and not self.batcher.pending) or (
                cfg.stop_after_idle is not None and now - last_data >= cfg.stop_after_idle
            )
            timer = (
                topo.chief
                and self.checkpointer is not None
                and now - self._last_checkpoint[1] >= cfg.checkpoint_every_seconds
            )
            if self.source.reject_limit is not None and not self._stop_wanted.is_set():
                self.request_stop("the reject breaker tripped")
            stop_here = self._stop_wanted.is_set()  # what this worker says, and why, once
            ctrl = self.steps.sync(
                Control.local(
                    real=batch.real,
                    stop=stop_here,
                    done=done,
                    checkpoint=timer,
                    full=batch.real == batch.size,
                    loss_sum=loss_sum,
                )
            )
            if loss_rows:
                self.loss = float(ctrl[Control.LOSS]) / loss_rows
            rows = round(float(ctrl[Control.REAL]))
            loss_sum, loss_rows = 0.0, 0
            applied = True
            if rows:
                # Applied or skipped alike on every worker: the verdict is all-reduced.
                loss_sum, applied = self.steps.train(self._features(batch), batch.weight, rows)
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
                last_checkpoint_step=self._last_checkpoint[0],
                checkpoint_every_steps=cfg.checkpoint_every_steps if self.checkpointer else None,
                max_steps=cfg.max_steps,
                stopping_here=self._stop_reason if stop_here else None,
                stop_after_idle=cfg.stop_after_idle,
            )
            if decision.stop is not None and self.source.reject_limit is None:
                self.source.settle_rejects()  # a clean stop: the rejects so far are judged
            if decision.checkpoint and self.checkpointer is not None:
                self._checkpoint()
            elif self.checkpointer is None and (decision.stop or commits.due(self.step)):
                self._commit(self.tracker.commit_points())
                commits.done(self.step)
            status.waited(batch.waited)
            status.maybe(self.step, self.loss)
            wait = should_wait(ctrl, mine=batch.real, full=batch.real == batch.size)
            if decision.stop is not None:
                return decision.stop

    def _after_step(self, batch: Batch, rows: int, applied: bool, seconds: float) -> None:
        """Ack this worker's real rows (their offsets came with the batch), count the round.

        A skipped step (not finite) holds its rows until a step is applied; every worker counts
        the same run of skipped rounds, so all stop together when it is too long."""
        metrics = self.metrics
        assert metrics is not None
        part, off, ts = batch.metadata()
        if rows and not applied:
            metrics.observe_nonfinite_step()
            stop = self.nonfinite.skipped(part, off)
            log.warning(
                "step %d: loss or a gradient not finite on some worker: update skipped on "
                "every worker (this worker's %d records, partition:offsets %s); %d in a row, "
                "the cluster stops at %d",
                self.step + 1,
                len(off),
                describe_offsets(part, off) or "-",
                self.nonfinite.in_a_row,
                self.config.max_nonfinite_steps,
            )
            if stop:
                raise ModelDivergedError(
                    f"{self.nonfinite.in_a_row} steps in a row had a non-finite loss or "
                    f"gradients (the last at step {self.step + 1})",
                    self.checkpointer.latest if self.checkpointer is not None else None,
                )
        elif rows:
            for held_part, held_off in self.nonfinite.applied():
                self.tracker.ack(held_part, held_off)
        if batch.real and applied:
            if self.audit is not None:
                self.audit.add(part, off)
            self.tracker.ack(part, off)
            metrics.observe_trained(part, off, ts, time.time())
        if rows and applied:
            loss = None if np.isnan(self.loss) else self.loss
            metrics.observe_step(batch.real, seconds, batch.waited, loss)
            if self.step % _TRAIN_METRICS_EVERY_STEPS == 0:
                # Reading Keras' metrics all-reduces them: every worker at the same step.
                metrics.observe_train_metrics(self.steps.metric_values())
        metrics.observe_round(batch.padded, idle=not rows)
        self.health.beat("trainer")
        self._formed = True

    # ---- checkpoints and commits --------------------------------------------------------------

    def _checkpoint(self) -> None:
        """Every worker at the same round: offsets all-reduced, the chief's checkpoint written
        (throwaway copies elsewhere), then each worker commits its own partitions."""
        assert self.checkpointer is not None and self.metrics is not None
        assert self.source is not None
        current = capped(
            self.position.current(self.tracker.commit_points()), self.source.commit_caps()
        )
        mine = {p: o for p, o in current.items() if p in self._mine}
        offsets = offsets_from_vector(self.steps.sync(offsets_vector(mine, self.num_partitions)))
        if self.audit is not None:
            self.audit.flush()
        self.health.beat("trainer")
        path = ""
        try:
            if self.topology.chief:
                path = self.checkpointer.save(self.step, offsets)
            else:
                path = self.checkpointer.write_copy(
                    os.path.join(self._throwaway_dir(), f"ckpt-{self.step}"), self.step, offsets
                )
            ok = True
        except (OSError, tf.errors.OpError) as exc:
            # A save is local (no collective): a full or read-only volume is this worker's
            # failure, not a lost peer. A peer that is really gone shows at the sync below.
            log.error("checkpoint at step %d failed: %s", self.step, exc)
            ok = False
        finally:
            if not self.topology.chief:
                shutil.rmtree(self._throwaway_dir(), ignore_errors=True)
        saved = round(float(self.steps.sync(np.array([float(ok)], np.float32))[0]))
        self.health.beat("trainer")
        if saved < self.topology.count:
            self.metrics.checkpoint(False, time.time())
            log.error(
                "checkpoint at step %d failed on %d of %d workers: nothing committed",
                self.step,
                self.topology.count - saved,
                self.topology.count,
            )
            return
        self.metrics.checkpoint(True, time.time())
        log.info(
            "checkpoint %s at step %d weights %s",
            path,
            self.step,
            weights_digest(self.bundle.model),
        )
        self._last_checkpoint = (self.step, time.monotonic())
        # Kafka commits follow the checkpoint: the checkpoint is the source of truth.
        self._commit({p: o for p, o in offsets.items() if p in self._mine})

    def _commit(self, points: dict[int, int]) -> None:
        assert self.source is not None
        points = capped(points, self.source.commit_caps())  # rejects not judged yet
        if self.audit is not None:
            self.audit.flush()
        self.source.commit(points)
        self.position.commit(points)

    # ---- shutdown -----------------------------------------------------------------------------

    def _abandon(self) -> None:
        """A lost peer: the input pipeline may never stop cleanly now (TensorFlow aborted its
        collectives); keep what is written, close the consumers for a moment at most."""
        self._stop_wanted.set()
        self._reader_stop.set()
        self._reader = None  # not joined
        if self.audit is not None:
            self.audit.close()
            self.audit = None
        source, self.source = self.source, None
        if source is not None:
            source.stop()
            closing = threading.Thread(target=source.close, name="streamer-abort", daemon=True)
            closing.start()
            closing.join(_ABORT_CLOSE_S)

    def _close_input(self) -> None:
        """Stop the input reader and close the consumers (their commits are sent first)."""
        self._stop_wanted.set()
        self._reader_stop.set()
        source, self.source = self.source, None
        if source is not None:
            source.stop()
        if self._reader is not None:
            self._reader.join(10.0)
            self._reader = None
        if source is not None:
            source.close()

    def _shutdown(self) -> None:
        self.health.set_ready(False, "shutting down")
        self._close_input()
        status = getattr(self, "_status", None)
        if status is not None:
            status.end()
        if self.audit is not None:
            self.audit.close()
        if self.server is not None:
            self.server.close()


def _describe(cfg: WorkerConfig) -> str:
    d = cfg.describe()
    keys = "bootstrap topic group shards batch_size pad_after_seconds checkpoint_dir metrics_port"
    return " ".join(f"{k}={d[k]}" for k in keys.split())
