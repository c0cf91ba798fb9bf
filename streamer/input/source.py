"""StreamSource: N consumer shards as interleaved from_generator datasets, decoded block by block."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from consumers import JoinBarrier, ShardHooks, ShardLike, open_shard
from consumers.block import RecordBlock
from consumers.errors import ConfigError, StreamerError
from consumers.settings import ConsumerSettings
from streamer.decode.columns import METADATA_COLUMNS, flat_outputs, output_types, to_batch
from streamer.decode.ragged import Column, concat_rows, num_rows
from streamer.decode.records import DecodedBlock, decode_block, explain_reject, prepare_block
from streamer.decode.schema import Schema
from streamer.input.breaker import RejectBreaker
from streamer.input.errors import PipelineError, RejectLimitError
from streamer.input.handover import EPOCH, HandOver
from streamer.input.offsets import OffsetTracker
from streamer.input.passes import PassRules
from streamer.input.pipeline import PipelineSettings
from streamer.input.rejects import Rejects
from streamer.input.routing import Rollback, ShardRouter
from streamer.input.shuffle import ShuffleWindow
from streamer.ops.gctune import release_free_memory

if TYPE_CHECKING:
    from streamer.input.deadletter import DeadLetterWriter
    from streamer.ops.health import Health
    from streamer.ops.metrics import Metrics

_EMPTY = RecordBlock.from_columns("", [], [], [], [])
_IDLE = -1  # handle of an idle tick: no block, the shard is waiting
_FLUSH = -2  # handle of a shard's last word in a pass: drain the shuffle window

__all__ = [
    "METADATA_COLUMNS",
    "PipelineSettings",
    "ShardLike",
    "StreamSource",
    "StreamStart",
    "position_text",
    "resolve_start",
]

log = logging.getLogger(__name__)


ShardFactory = Callable[[int, int, ShardHooks], ShardLike]


class StreamSource:
    """The input side of the worker: shards → blocks → decode → batches of features + metadata.

    >>> source = StreamSource(schema, PipelineSettings(num_shards=4), consumer=settings)  # doctest: +SKIP
    >>> for batch in source.dataset():          # one pass; iterate again for the next  # doctest: +SKIP
    ...     train(batch); source.tracker.ack(batch["partition"], batch["offset"])
    >>> source.commit()                         # low-watermark commit of what is done  # doctest: +SKIP
    >>> source.close()  # doctest: +SKIP

    Each batch is a dict of the schema's features ``[n, *shape]`` plus ``partition`` (int32),
    ``offset`` (int64) and ``timestamp`` (int64, ms) columns. Every pass calls the shard
    factory again (fresh consumers); a shard closes when its generator ends, however it ends,
    unless ``linger`` is set, in which case ``end_pass()`` closes them (the worker commits
    the last trained offsets first).
    """

    def __init__(
        self,
        schema: Schema,
        settings: PipelineSettings | None = None,
        *,
        consumer: ConsumerSettings | None = None,
        shard_factory: ShardFactory | None = None,
        tracker: OffsetTracker | None = None,
        metrics: Metrics | None = None,
        health: Health | None = None,
        dead_letter: DeadLetterWriter | None = None,
        start: StreamStart | None = None,
        topic: str | None = None,
    ) -> None:
        """No I/O here: where the stream starts (``start``) was resolved before
        (``resolve_start``; ``StreamSource.open`` does both)."""
        self.schema = schema
        self.settings = settings or PipelineSettings()
        if shard_factory is None:
            if consumer is None:
                raise ConfigError(
                    "bootstrap_servers", None, "give Kafka settings or a shard factory"
                )
            shard_factory = self._kafka_factory(consumer)
        self.consumer = consumer
        self.topic = topic or (consumer.topic if consumer is not None else "simulator")
        self._factory = shard_factory
        self.tracker = tracker or OffsetTracker()
        self.metrics = metrics
        self.health = health
        self.dead_letter = dead_letter
        self._lock = threading.Lock()
        if start is None:
            if self.settings.start_from != "committed" or self.settings.stop_at is not None:
                raise ValueError(
                    "a start or stop position needs its offsets looked up first: build the "
                    "source with StreamSource.open(...), or pass start=resolve_start(...)"
                )
            start = StreamStart()
        self.start = start
        restore = dict(start.offsets)
        reason = start.reason
        stop_offsets = start.stop
        #: Where this source's partitions start (a checkpoint's offsets, or --start-from's).
        self.start_offsets: dict[int, int] = dict(restore)
        self.router = ShardRouter(
            self.topic,
            self.tracker,
            metrics=metrics,
            health=health,
            restore=restore,
            restore_reason=reason,
        )
        # A lost partition trained here past its commit: this pass ends, and the worker goes
        # back to its checkpoint (``ShardRouter.on_lost``).
        self.router.on_rollback = self.stop
        self.rules = PassRules(
            pass_records=self.settings.pass_records,
            pass_seconds=self.settings.pass_seconds,
            idle_timeout_seconds=self.settings.idle_timeout_seconds,
            stop_offsets=stop_offsets,
            start_offsets=restore,
        )
        self.rejects = Rejects(
            self.topic,
            self.tracker,
            dead_letter,
            log_per_second=self.settings.log_rejects_per_second,
            explain=functools.partial(explain_reject, schema),
        )
        #: Trips when too many of the latest records are rejected (streamer.input.breaker).
        self.breaker = RejectBreaker(self.settings.max_reject_fraction)
        #: Rejects the breaker could not judge yet (``_release_deferred``).
        self._deferred: list[tuple[list[Any], np.ndarray, np.ndarray, list[tuple[int, str]]]] = []
        self._deferred_lock = threading.Lock()
        #: Set when the breaker tripped: what the worker stops with.
        self.reject_limit: RejectLimitError | None = None
        self._stop = threading.Event()
        self._opened_in_pass = self.settings.num_shards  # the first shard opened starts a pass
        self._stash: dict[int, RecordBlock] = {}
        self._handles = itertools.count()
        self._window = (
            ShuffleWindow(self.settings.shuffle_buffer) if self.settings.shuffle_buffer else None
        )
        self._undecoded = 0  # blocks handed to tf.data and not decoded yet
        self._flush_wanted = False
        self._barrier = self._new_barrier()
        self.records_emitted = 0
        self.failure: BaseException | None = None
        self._names = [f.name for f in schema.features]
        self._with_epochs = False  # set by dataset(): rows carry their assignment epoch
        #: While set, an iteration that would begin a new pass (a second iterator beside the
        #: one training) is refused (``streamer.Stream``: one fit at a time per stream).
        self.exclusive_pass = False

    @classmethod
    def open(
        cls,
        schema: Schema,
        settings: PipelineSettings,
        *,
        consumer: ConsumerSettings,
        restored: dict[int, int] | None = None,
        **kwargs: Any,
    ) -> StreamSource:
        """Resolve where the stream starts (a network look-up for ``--start-from`` or a
        replay's range), then build the source.

        >>> source = StreamSource.open(schema, PipelineSettings(start_from="latest"), consumer=cs)  # doctest: +SKIP
        """
        start = resolve_start(settings, consumer, restored)
        return cls(schema, settings, consumer=consumer, start=start, **kwargs)

    def _new_barrier(self) -> JoinBarrier:
        heartbeat_seconds = (self.consumer.heartbeat_interval_ms if self.consumer else 1000) / 1000
        return JoinBarrier(self.settings.num_shards, settle_seconds=1.5 * heartbeat_seconds)

    def _kafka_factory(self, consumer: ConsumerSettings) -> ShardFactory:
        # A process shard decodes its blocks in its own child, on its own core: the map here
        # then only hands the columns to TensorFlow (and the rejects' values travel alone).
        prepare = functools.partial(prepare_block, self.schema, decoder=self.settings.decoder)

        def make(k: int, n: int, hooks: ShardHooks) -> ShardLike:
            restore = self.router.restore_offsets()
            return open_shard(
                consumer,
                k,
                n,
                hooks=hooks,
                barrier=self._barrier,
                restore=restore,
                prepare=prepare,
            )

        return make

    # ---- tf.data ---------------------------------------------------------------------------

    def blocks(self) -> tf.data.Dataset:
        """Block handles from all shards, interleaved: one int64 per RecordBlock.

        The block itself stays in this process (the decode map takes it by handle): turning
        a thousand values into a string tensor and back would cost more than decoding them.
        """
        n = self.settings.num_shards
        signature = tf.TensorSpec([], tf.int64)
        generate = self._generate

        def shard_dataset(k: tf.Tensor) -> tf.data.Dataset:
            return tf.data.Dataset.from_generator(generate, output_signature=signature, args=(k, n))

        ds = tf.data.Dataset.range(n).interleave(
            shard_dataset, cycle_length=n, num_parallel_calls=n, deterministic=False
        )
        # Each generator call runs on a tf.data thread: give the shards threads of their own
        # so N shards never wait on a pool sized by the core count.
        options = tf.data.Options()
        options.threading.private_threadpool_size = n + 4
        return ds.with_options(options)

    def dataset(self) -> tf.data.Dataset:
        """Batches of decoded features plus metadata columns; each iteration is one pass.

        A fixed feature is a tensor ``[batch, *shape]``; a variable-length one a
        ``tf.RaggedTensor`` ``[batch, None, *inner]`` rebuilt here from the flat values and
        row lengths the decode returns (a numpy_function cannot return a ragged tensor), or,
        with ``pad_to``, a dense ``[batch, pad_to, *inner]`` and its ``<name>_length`` (int32);
        a string feature is ``tf.string``.
        """
        schema = self.schema
        tout = output_types(schema)

        self._with_epochs = True  # each row's assignment epoch, for the hand-over filter

        def decode(handle: tf.Tensor) -> dict[str, Any]:
            out = tf.numpy_function(
                self._decode_np, [handle], [*tout, tf.int64], stateful=True, name="decode_block"
            )
            batch = to_batch(schema, out[:-1])
            out[-1].set_shape([None])
            batch[EPOCH] = out[-1]
            return batch

        # In order (the blocks of one partition come from one shard, in offset order): what
        # reaches training of a partition is then a prefix of what was read, and a revocation
        # commits exactly what was trained (streamer.input.handover). A shuffle window mixes
        # rows anyway: there the map keeps no order.
        ordered = not self.settings.shuffle_buffer
        ds = self.blocks().map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered)
        ds = ds.rebatch(self.settings.batch_size, drop_remainder=self.settings.drop_remainder)
        prefetch = self.settings.prefetch_batches
        ds = ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)
        handover = self.router.handover
        if handover is None:
            # A revocation's wait holds the client's rebalance callback (kafka-python: its IO
            # thread, heartbeats included): a third of the session at most.
            session = self.consumer.session_timeout_ms / 1000 if self.consumer else 45.0
            handover = HandOver(ordered=ordered, wait_seconds=min(5.0, session / 3))
            self.router.handover = handover
        return handover.attach(ds)  # the hand-over point: the last stage

    def flat_blocks(self) -> tf.data.Dataset:
        """Decoded blocks, not batched: each element is the decode's flat outputs (every
        feature, a variable-length one as values and row lengths, then partition, offset,
        timestamp), with 0 rows for an idle tick (a shard that waits), so an iterator never
        blocks for long while the shards are up. For a caller that batches rows itself
        (multi-worker training pads its batches: streamer/cluster/padding.py). Each iteration is one
        pass, as for ``dataset()``.
        """
        tout = output_types(self.schema)

        def decode(handle: tf.Tensor) -> tuple[tf.Tensor, ...]:
            out = tf.numpy_function(
                self._decode_np, [handle], tout, stateful=True, name="decode_block"
            )
            return tuple(out)

        ds = self.blocks().map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        return ds.prefetch(tf.data.AUTOTUNE)

    # ---- generator (runs on tf.data's threads) ----------------------------------------------

    def begin_pass(self) -> None:
        """Start a pass: reset its record budget, clock and join barrier.

        Called implicitly when the N shards of the previous pass have all been opened (each
        iteration of the dataset opens N shards), explicitly by the worker.
        """
        with self._lock:
            self._begin_pass_locked()
        if self.router.handover is not None:
            self.router.handover.training = True

    def training_over(self) -> None:
        """The trainer left the pass (its iterator is deleted next): a revocation that comes
        now (a shard leaving the group as the pass closes makes its siblings rebalance) does
        not wait for records that will never be trained, and the pass's close is not held up
        by it."""
        if self.router.handover is not None:
            self.router.handover.training = False

    def _begin_pass_locked(self) -> None:
        self.rules.begin()
        self._opened_in_pass = 0
        self._barrier = self._new_barrier()
        self._stash.clear()  # blocks a deleted iterator never decoded (their records stay pending)
        self._undecoded = 0
        if self._window is not None:
            self._window.flush(like=[np.empty(0)])  # rows of an abandoned pass stay pending too

    def _generate(self, shard_index: Any, num_shards: Any) -> Iterator[np.int64]:
        k, n = int(shard_index), int(num_shards)
        with self._lock:
            second = self._opened_in_pass >= n and self.exclusive_pass
            if not second:
                if self._opened_in_pass >= n:
                    self._begin_pass_locked()
                self._opened_in_pass += 1
            stop = self._stop  # this pass's: a resume() after it gives later passes their own
        if second:
            raise ConfigError(
                "dataset",
                "a second iteration",
                "this stream's dataset is being trained on (a fit or a loop): one iteration "
                "at a time (validation_data needs a dataset of its own: another Stream, or a "
                "tf.data.Dataset of held-out records; after a fit that raised, call "
                "stream.dataset() again for the next one)",
            )
        if stop.is_set():
            return  # a pass stopped before its shards opened: open none (a consumer that
            # joins a group only to leave it costs the group two rebalances)
        rules = self.rules
        shard = self._factory(k, n, self.router)
        self.router.add(shard)
        empty = np.int64(_IDLE)
        ended = False
        try:
            shard.start()
            idle_since = time.monotonic()
            timeout = self.settings.get_timeout_seconds
            while not stop.is_set() and rules.budget_left() and not rules.out_of_time():
                block = shard.get(timeout, claim=self._claim)
                done = rules.bounded and not shard.joining and shard.assigned <= rules.reached()
                if block is None and done:
                    break  # replay: this shard's partitions are all at their stop offsets
                if block is None:
                    # Joining the group takes seconds: idle time counts from the last assignment.
                    since = max(idle_since, shard.last_rebalance_monotonic)
                    if shard.joining:
                        since = idle_since = time.monotonic()
                    if rules.idle(since):
                        break
                    # Hand the thread back to tf.data instead of blocking it while idle.
                    yield empty
                    continue
                if not len(block):  # only markers passed, or a replay clipped it away
                    if rules.bounded and (rules.finished or shard.assigned <= rules.reached()):
                        break
                    continue
                idle_since = time.monotonic()
                more = rules.take(len(block))
                with self._lock:
                    handle = next(self._handles)
                    self._stash[handle] = block
                    self._undecoded += 1
                yield np.int64(handle)
                if not more:
                    break
            ended = True
        except StreamerError as exc:
            self.failure = exc
            raise
        finally:
            # However the pass ends (exhausted, stop, error, iterator deleted) the shard closes
            # here, unless the owner lingers it to commit the last trained offsets first.
            if not self.settings.linger and self.router.remove(shard):
                shard.close()
        if ended and self._window is not None:
            yield np.int64(_FLUSH)  # this shard is done: let the shuffle window drain

    def _claim(self, block: RecordBlock) -> RecordBlock:
        """Register a block's records as in flight (the shard calls this under its lock).

        Runs atomically with the shard's revocation of the block's partitions, so the commit
        point the revocation reports accounts for every record this pass has taken. A replay
        clips the block to its stop offsets first (an empty block: nothing left).
        """
        if self.rules.bounded:
            clipped = self.rules.clip(block)
            if clipped is None:
                return _EMPTY
            block = clipped
        self.tracker.register(block.partition, block.offset)
        if block.ends:
            self.tracker.extend(block.ends)
        if self._with_epochs and len(block):  # the table as of this claim (immutable)
            block = dataclasses.replace(block, epochs=self.router.epochs)
        with self._lock:
            self.records_emitted += len(block)
        return block

    @property
    def finished(self) -> bool:
        """A bounded run (replay) has emitted every record of its range."""
        return self.rules.finished

    @property
    def records_rejected(self) -> int:
        return self.rejects.count

    @property
    def topic_missing(self) -> bool:
        """The topic does not exist, as the last shard to look said (readiness)."""
        return self.router.topic_missing

    # ---- decode (numpy_function, parallel map) ------------------------------------------------

    def _decode_np(self, handle: np.ndarray) -> list[np.ndarray]:
        return flat_outputs(self._decode_columns(handle))

    def _decode_columns(self, handle: np.ndarray) -> list[Column]:
        h = int(handle)
        with self._lock:
            block = self._stash.pop(h, None)
        if block is None:  # an idle tick or a shard's last word
            block = _EMPTY
        out = self._decode_block(block)
        if self._window is None:
            return out
        with self._lock:
            if block is not _EMPTY:
                self._undecoded -= 1
            if h == _FLUSH or (h == _IDLE and len(self._window)):
                self._flush_wanted = True
            drain = self._flush_wanted and self._undecoded == 0
            if drain:
                self._flush_wanted = False
        mixed = self._window.push(out) if num_rows(out[-1]) else out
        if not drain:
            return mixed
        rest = self._window.flush(like=out)
        return [concat_rows(a, b) for a, b in zip(mixed, rest, strict=True)]

    def _decode_block(self, block: RecordBlock) -> list[Column]:
        values, partition, offset, ts = (
            block.values,
            block.partition,
            block.offset,
            block.timestamp_ms,
        )
        prepared = block.prepared
        if isinstance(prepared, DecodedBlock):  # decoded in the shard's child already
            decoded = prepared
        else:
            decoded = decode_block(self.schema, values, self.settings.decoder)
        kept = decoded.kept
        refused = [(int(partition[i]), int(offset[i]), r) for i, r in decoded.rejected]
        tripped = self.breaker.observe(len(values), refused)
        if decoded.rejected and not tripped and self.breaker.undecided():
            # Not judged yet (fewer records than the breaker needs): neither dead-lettered nor
            # done until it can say whether a wrong schema is eating the topic.
            picked = [i for i, _ in decoded.rejected]
            with self._deferred_lock:
                self._deferred.append(
                    (
                        [values[i] for i in picked],
                        partition[picked],
                        offset[picked],
                        [(j, r) for j, (_, r) in enumerate(decoded.rejected)],
                    )
                )
        else:
            hold = self.breaker.tripped
            self._release_deferred(hold)
            if decoded.rejected:
                self.rejects.handle(values, partition, offset, decoded.rejected, hold=hold)
        if tripped:
            self._trip()
        if self.metrics is not None:
            self.metrics.observe_decode(len(kept), decoded.reason_counts())
        out = [decoded.features[name] for name in self._names]
        if len(kept) != len(values):
            partition, offset, ts = partition[kept], offset[kept], ts[kept]
        if self._with_epochs:
            epochs = block.epochs
            rows = epochs.rows(partition) if epochs is not None else np.zeros(len(ts), np.int64)
            return [*out, partition, offset, ts, rows]
        return [*out, partition, offset, ts]

    def _trip(self) -> None:
        """The reject breaker tripped: the pass stops; the worker ends with RejectLimitError."""
        summary = self.breaker.summary()
        if not self.rejects.example:  # none logged yet (rate limit): explain one now
            self.rejects.example = "see the rejected record lines"
        self.reject_limit = RejectLimitError(summary, self.rejects.example, self.breaker.caps())
        log.error("reject breaker tripped: %s; stopping", summary)
        self.stop()

    def resting_points(self) -> dict[int, int]:
        """Positions held and done with no record in flight (``ShardRouter.resting_points``)."""
        return self.router.resting_points()

    def commit_caps(self) -> dict[int, int]:
        """Per partition, the offset commits must stay below (rejects not judged yet)."""
        return self.breaker.caps()

    def settle_rejects(self) -> None:
        """A pass ended with the breaker closed: the rejects so far are judged; commits may
        pass them."""
        self._release_deferred(self.breaker.tripped)
        self.breaker.settle()

    def _release_deferred(self, hold: bool) -> None:
        """The rejects kept while the breaker could not judge them: handled now (``hold``: it
        tripped, so they are only logged)."""
        if not self._deferred:
            return
        with self._deferred_lock:
            deferred, self._deferred = self._deferred, []
        for values, partition, offset, rejected in deferred:
            self.rejects.handle(values, partition, offset, rejected, hold=hold)

    # ---- commits and lifecycle -------------------------------------------------------------

    def commit(self, points: dict[int, int] | None = None) -> dict[int, int]:
        """Send commit requests for what is done (default: every commit point of the tracker).

        Each partition's point goes to the shard that owns it now (``ShardRouter.commit``).
        """
        if points is None:
            points = self.tracker.commit_points()
        if points:
            self.router.commit(points)
        return points

    @property
    def rollback(self) -> Rollback | None:
        """Set when partitions were lost with records trained here and not committed (and
        the worker asked for rollbacks: ``ShardRouter.roll_back_on_lost``): this pass ends,
        nothing more is committed, and the worker goes back to a checkpoint."""
        return self.router.rollback

    @property
    def revoke_commits(self) -> int:
        """Revocations that committed what was trained (outside any checkpoint) so far."""
        return self.router.revoke_commits

    def roll_back(self, positions: dict[int, int], *, to_start: bool) -> None:
        """After the pass ended: the worker went back to a checkpoint with these positions."""
        self.router.roll_back(positions, to_start=to_start)

    def keep_trained(self) -> None:
        """After the pass ended: the worker could not go back; what was trained is kept."""
        self.router.keep_trained()

    def roll_back_on_lost(self) -> None:
        """From now on a lost partition trained past its commit asks for a rollback (the
        worker has a checkpoint to go back to)."""
        self.router.roll_back_on_lost = True

    def committed(self) -> dict[int, int]:
        """This source's successful commits this run (the highest offset per partition)."""
        return self.router.committed()

    def stop(self) -> None:
        """Make every generator of the current pass finish (the pass ends cleanly)."""
        self._stop.set()

    def resume(self) -> None:
        """Generators that start from now on run (until ``stop()``); those of a stopped pass
        stay stopped (an iterator abandoned by its owner, still held by tf.data, never reads
        again: a Keras ``fit`` may leave one behind)."""
        with self._lock:
            if self._stop.is_set():
                self._stop = threading.Event()

    @property
    def open_shards(self) -> int:
        return len(self.router.shards())

    def assigned_partitions(self) -> int:
        """How many partitions this source's shards own now (readiness)."""
        return self.router.assigned_count()

    def queued_records(self) -> int:
        """Records waiting in the shards' queues (the shard queue-depth metric)."""
        return self.router.queued_records()

    def end_pass(self) -> None:
        """Close the shards still open (lingering ones): pending commits are flushed first.

        Restored (checkpoint) offsets apply to the first pass only: its final commit carries
        the position on, and later passes start from the group's commits.
        """
        shards = self.router.take_all()

        def close(shard: ShardLike) -> None:
            try:
                shard.close()
            except Exception as exc:
                log.warning("closing a shard failed: %s", exc)

        # At once, not one after another: a consumer that takes its whole close timeout (a
        # group mid-rebalance after a broker fault) must not multiply the stop's duration.
        closers = [
            threading.Thread(target=close, args=(s,), name=f"streamer-close-{i}", daemon=True)
            for i, s in enumerate(shards[1:], 1)
        ]
        for t in closers:
            t.start()
        if shards:
            close(shards[0])
        for t in closers:
            t.join()
        release_free_memory()  # the pass's consumers and buffers are gone: give the heap back

    def next_batch(
        self, iterator: Iterator[Any], what: str = "the input pipeline"
    ) -> dict[str, tf.Tensor] | None:
        """The next batch of a pass, or None at its end.

        A failed pipeline raises the error that ended its shard (a StreamerError with the
        cause), else a ``PipelineError`` naming ``what`` and TensorFlow's message.
        """
        try:
            batch: dict[str, tf.Tensor] = next(iterator)
        except StopIteration:
            return None
        except tf.errors.OpError as exc:
            cause = self.shard_failure()
            if isinstance(cause, StreamerError):
                raise cause from exc
            raise PipelineError(what, exc.message) from exc
        return batch

    def shard_failure(self) -> BaseException | None:
        """The error that ended a shard of this source, if any (the cause of a failed pass)."""
        return self.failure or self.router.failure()

    def close(self) -> None:
        self.stop()
        self.end_pass()
        self.rejects.close()


#: How long a pass's end waits for its tf.data pipeline to run out and be torn down
#: (milliseconds, as a rule); past it the pass ends without waiting (see ``end_iterator``).
TEARDOWN_SECONDS = 5.0


def end_iterator(
    box: list[Any], stop: Callable[[], None], seconds: float = TEARDOWN_SECONDS
) -> bool:
    """End a pass's tf.data iterator (``box`` holds the only reference): ``stop()`` its
    generators, read it to its end (the batches left are dropped: never trained, never
    acknowledged, so read again), then drop it and collect; on a helper thread, waiting at
    most ``seconds``. True if the pipeline ran out in time (its release may go on behind).

    Deleting an iterator whose generators are still open makes tf.data finalize each of them
    in its destructor, and that teardown has waited past a 25 s shutdown bound with no Python
    frame in flight (a SIGTERM to a long-running worker beside another group member, 2 stops
    in 30). Generators that ran out are finalized as they end, by tf.data's own threads, so
    the deletion has only tf.data's own threads to join: on a starved machine its autotune
    thread has kept it waiting past 5 s (an idle stop beside three busy loops, 3 in 10), and
    that wait holds nothing of ours, so it goes on behind without a warning. The bound is a
    backstop: a stop keeps its deadline and a pass's end never stalls training; a pipeline
    that did not run out within it is warned of (the pass's shards are closed by the pass's
    end all the same).
    """
    import gc

    ran_out = threading.Event()
    done = threading.Event()

    def teardown() -> None:
        iterator = box.pop()
        try:
            stop()
            for _ in iterator:
                pass
        except Exception as exc:  # the error that ended the pass was already raised there
            log.debug("reading a pass's pipeline to its end: %s", exc)
        finally:
            ran_out.set()
            del iterator
            gc.collect()
            done.set()

    threading.Thread(target=teardown, name="streamer-pipeline-teardown", daemon=True).start()
    deadline = time.monotonic() + seconds
    if not ran_out.wait(seconds):
        log.warning(
            "the pass's input pipeline did not end within %.0fs; going on without it (its "
            "shards are closed all the same)",
            seconds,
        )
        return False
    if not done.wait(max(0.0, deadline - time.monotonic())):
        log.debug("the pass's input pipeline ran out; tf.data releases it behind")
    return True


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Where a source's partitions start and why (``reason``, for the seek log lines), and a
    replay's stop offsets; resolved once, before the source is built."""

    offsets: dict[int, int] = field(default_factory=dict)
    reason: str = "checkpoint"
    stop: dict[int, int] | None = None


def resolve_start(
    settings: PipelineSettings,
    consumer: ConsumerSettings | None,
    restored: dict[int, int] | None = None,
) -> StreamStart:
    """The start (and stop) offsets of a run: the checkpoint's (``restored``) unless
    ``--start-from`` or a replay's ``--from`` names a position, which wins; looked up on the
    broker (Kafka's offsets-for-times) once.

    >>> resolve_start(PipelineSettings(), None, {0: 5})
    StreamStart(offsets={0: 5}, reason='checkpoint', stop=None)
    """
    offsets = dict(restored or {})
    reason = "checkpoint"
    if settings.start_from != "committed":
        if consumer is None:
            log.warning(
                "--start-from %s ignored: the simulator has no stored stream", settings.start_from
            )
        else:
            from consumers.positions import start_offsets

            offsets = start_offsets(consumer, settings.start_from)
            where = position_text(settings.start_from)
            replay = settings.stop_at is not None
            reason = f"replay --from {where}" if replay else f"--start-from {where}"
    stop = None
    if settings.stop_at is not None and consumer is not None:
        from consumers.positions import start_offsets

        stop = start_offsets(consumer, settings.stop_at)
    return StreamStart(offsets, reason, stop)


def position_text(position: str | int) -> str:
    """A start or stop position as the log shows it: the word, or the time in UTC.

    >>> position_text("earliest"), position_text(1767225600000)
    ('earliest', '2026-01-01T00:00:00.000Z')
    """
    if isinstance(position, str):
        return position
    when = datetime.fromtimestamp(position / 1000, tz=UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{position % 1000:03d}Z"
