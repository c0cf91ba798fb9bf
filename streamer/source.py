"""StreamSource: N consumer shards as interleaved from_generator datasets, decoded block by block."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from consumers import JoinBarrier, ShardHooks, ShardLike, open_shard
from consumers.block import RecordBlock
from consumers.errors import ConfigError, StreamerError
from consumers.settings import ConsumerSettings
from streamer.columns import METADATA_COLUMNS, flat_outputs, output_types, to_batch
from streamer.decode import decode_block
from streamer.gctune import release_free_memory
from streamer.offsets import OffsetTracker
from streamer.ragged import Column, concat_rows, num_rows
from streamer.schema import Schema
from streamer.settings import PipelineSettings
from streamer.shuffle import ShuffleWindow

if TYPE_CHECKING:
    from streamer.deadletter import DeadLetterWriter
    from streamer.health import Health
    from streamer.metrics import Metrics

_EMPTY = RecordBlock.from_columns("", [], [], [], [])
_IDLE = -1  # handle of an idle tick: no block, the shard is waiting
_FLUSH = -2  # handle of a shard's last word in a pass: drain the shuffle window

__all__ = [
    "METADATA_COLUMNS",
    "PipelineSettings",
    "ShardLike",
    "StreamSource",
    "build_dataset",
]

log = logging.getLogger(__name__)


ShardFactory = Callable[[int, int, ShardHooks], ShardLike]


class _Hooks(ShardHooks):
    """Routes shard events to the tracker, metrics and health of one source."""

    def __init__(self, source: StreamSource) -> None:
        self._s = source

    def on_assigned(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        s = self._s
        with s._lock:
            s._owner.update(dict.fromkeys(partitions, shard_index))
            if partitions:
                s.topic_missing = False
            # Kept (not popped) until the pass ends: a first assignment may be short-lived.
            seeks = {p: s._restore[p] for p in partitions if p in s._restore}
        if s.metrics is not None:
            s.metrics.partitions_assigned(partitions)
            s.metrics.rebalance("assigned")
        return seeks

    def _forget(self, shard_index: int, partitions: list[int], event: str) -> dict[int, int]:
        """Drop the tracker state of partitions ``shard_index`` gives up; return their points.

        Only partitions this shard still owns: the tracker is keyed by partition alone, and a
        late revocation (a consumer closed after its session expired, or a child process's
        event arriving after a sibling's assignment) must not erase the new owner's records.
        """
        s = self._s
        with s._lock:
            mine = [p for p in partitions if s._owner.get(p, shard_index) == shard_index]
            points = s.tracker.revoke(mine)
            for p in mine:
                s._owner.pop(p, None)
                if p in s._restore and p in points:
                    # The next owner starts from what is done, not from the checkpoint again.
                    s._restore[p] = points[p]
        if s.metrics is not None:
            s.metrics.partitions_revoked(mine)
            s.metrics.rebalance(event)  # type: ignore[arg-type]
        return points

    def on_revoked(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        return self._forget(shard_index, partitions, "revoked")

    def on_lost(self, shard_index: int, partitions: list[int]) -> None:
        self._forget(shard_index, partitions, "lost")

    def on_poll(
        self,
        shard_index: int,
        records: int,
        nbytes: int,
        highwater: dict[int, int],
        position: dict[int, int],
    ) -> None:
        s = self._s
        if s.health is not None:
            s.health.beat("poller")
        m = s.metrics
        if m is None:
            return
        m.observe_poll(records, nbytes, time.time())
        for p, hw in highwater.items():
            m.set_high_watermark(p, hw)
        for p, pos in position.items():
            m.set_position(p, pos)

    def on_stable_offsets(self, shard_index: int, offsets: dict[int, int]) -> None:
        m = self._s.metrics
        if m is not None:
            for p, off in offsets.items():
                m.set_last_stable(p, off)

    def on_commit(
        self, offsets: dict[int, int], ok: bool, seconds: float, error: str | None
    ) -> None:
        if self._s.metrics is not None:
            self._s.metrics.observe_commit(offsets, ok, seconds)

    def on_topic_missing(self, shard_index: int, missing: bool) -> None:
        with self._s._lock:
            self._s.topic_missing = missing
            if missing and self._s._restore:
                # A topic that exists again is a new topic: checkpoint offsets of the old
                # one would skip its records.
                log.warning(
                    "topic %r is missing: its checkpoint offsets no longer apply", self._s.topic
                )
                self._s._restore.clear()

    def on_group_committed(self, shard_index: int, offsets: dict[int, int]) -> None:
        if self._s.metrics is not None:
            self._s.metrics.seed_committed(offsets)

    def on_error(self, kind: str, exc: BaseException) -> None:
        if self._s.metrics is not None:
            self._s.metrics.kafka_error(kind)

    def on_paused(self, shard_index: int, paused: int) -> None:
        s = self._s
        with s._lock:
            s._paused[shard_index] = paused
            total = sum(s._paused.values())
        if s.metrics is not None:
            s.metrics.set_paused(total)


class StreamSource:
    """The input side of the worker: shards → blocks → decode → batches of features + metadata.

    >>> source = StreamSource(schema, PipelineSettings(num_shards=4), consumer=settings)  # doctest: +SKIP
    >>> for batch in source.dataset():          # one pass; iterate again for the next
    ...     train(batch); source.tracker.ack(batch["partition"], batch["offset"])
    >>> source.commit()                         # low-watermark commit of what is done
    >>> source.close()

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
        restore_offsets: dict[int, int] | None = None,
        topic: str | None = None,
    ) -> None:
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
        self._open: list[ShardLike] = []
        self._owner: dict[int, int] = {}
        self._paused: dict[int, int] = {}
        self._restore: dict[int, int] = dict(restore_offsets or {})
        if self.settings.start_from != "committed":
            if consumer is None:
                log.warning(
                    "--start-from %s ignored: the simulator has no stored stream",
                    self.settings.start_from,
                )
            else:
                from consumers.positions import start_offsets

                # An explicit start position for this run wins over the checkpoint's offsets.
                self._restore = start_offsets(consumer, self.settings.start_from)
        self._stop_offsets: dict[int, int] | None = None
        self._reached: set[int] = set()
        if self.settings.stop_at is not None and consumer is not None:
            from consumers.positions import start_offsets

            self._stop_offsets = start_offsets(consumer, self.settings.stop_at)
            start = self._restore
            self._reached = {p for p, end in self._stop_offsets.items() if start.get(p, 0) >= end}
        self._stop = threading.Event()
        self._budget: int | None = None
        self._pass_started = 0.0
        self._opened_in_pass = self.settings.num_shards  # the first shard opened starts a pass
        self._stash: dict[int, RecordBlock] = {}
        self._handles = itertools.count()
        self._window = (
            ShuffleWindow(self.settings.shuffle_buffer) if self.settings.shuffle_buffer else None
        )
        self._undecoded = 0  # blocks handed to tf.data and not decoded yet
        self._flush_wanted = False
        self._barrier = self._new_barrier()
        self._hooks = _Hooks(self)
        self._reject_log_tokens = self.settings.log_rejects_per_second
        self._reject_log_t = time.monotonic()
        self.records_emitted = 0
        self.records_rejected = 0
        self.failure: BaseException | None = None
        # The topic does not exist, as the last shard to look said; kept across passes (a new
        # pass's shards have not looked yet) until a shard finds it or is assigned partitions.
        self.topic_missing = False
        self._names = [f.name for f in schema.features]

    def _new_barrier(self) -> JoinBarrier:
        heartbeat_s = (self.consumer.heartbeat_interval_ms if self.consumer else 1000) / 1000
        return JoinBarrier(self.settings.num_shards, settle_s=1.5 * heartbeat_s)

    def _kafka_factory(self, consumer: ConsumerSettings) -> ShardFactory:
        def make(k: int, n: int, hooks: ShardHooks) -> ShardLike:
            with self._lock:
                restore = dict(self._restore)
            return open_shard(consumer, k, n, hooks=hooks, barrier=self._barrier, restore=restore)

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

        def decode(handle: tf.Tensor) -> dict[str, Any]:
            out = tf.numpy_function(
                self._decode_np, [handle], tout, stateful=True, name="decode_block"
            )
            return to_batch(schema, out)

        ds = self.blocks().map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        ds = ds.rebatch(self.settings.batch_size, drop_remainder=self.settings.drop_remainder)
        prefetch = self.settings.prefetch_batches
        return ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)

    # ---- generator (runs on tf.data's threads) ----------------------------------------------

    def begin_pass(self) -> None:
        """Start a pass: reset its record budget, clock and join barrier.

        Called implicitly when the N shards of the previous pass have all been opened (each
        iteration of the dataset opens N shards), explicitly by the worker.
        """
        with self._lock:
            self._begin_pass_locked()

    def _begin_pass_locked(self) -> None:
        self._budget = self.settings.pass_records
        self._pass_started = time.monotonic()
        self._opened_in_pass = 0
        self._barrier = self._new_barrier()
        self._stash.clear()  # blocks a deleted iterator never decoded (their records stay pending)
        self._undecoded = 0
        if self._window is not None:
            self._window.flush(like=[np.empty(0)])  # rows of an abandoned pass stay pending too

    def _take_budget(self, n: int) -> bool:
        """Charge ``n`` records to the pass; False once the pass budget is spent."""
        with self._lock:
            if self._budget is None:
                return True
            self._budget -= n
            return self._budget > 0

    def _budget_left(self) -> bool:
        with self._lock:
            return self._budget is None or self._budget > 0

    def _generate(self, shard_index: Any, num_shards: Any) -> Iterator[np.int64]:
        k, n = int(shard_index), int(num_shards)
        with self._lock:
            if self._opened_in_pass >= n:
                self._begin_pass_locked()
            self._opened_in_pass += 1
        shard = self._factory(k, n, self._hooks)
        with self._lock:
            self._open.append(shard)
        empty = np.int64(_IDLE)
        ended = False
        try:
            shard.start()
            idle_since = time.monotonic()
            timeout = self.settings.get_timeout_seconds
            pass_seconds = self.settings.pass_seconds
            while not self._stop.is_set() and self._budget_left():
                if (
                    pass_seconds is not None
                    and time.monotonic() - self._pass_started >= pass_seconds
                ):
                    break
                block = shard.get(timeout, claim=self._claim)
                if (
                    block is None
                    and self._stop_offsets is not None
                    and not shard.joining
                    and shard.assigned <= self._reached_set()
                ):
                    break  # replay: this shard's partitions are all at their stop offsets
                if block is None:
                    # Joining the group takes seconds: idle time counts from the last assignment.
                    since = max(idle_since, shard.last_rebalance_monotonic)
                    if shard.joining:
                        since = idle_since = time.monotonic()
                    if time.monotonic() - since >= self.settings.idle_timeout_seconds:
                        break
                    # Hand the thread back to tf.data instead of blocking it while idle.
                    yield empty
                    continue
                if not len(block):  # only markers passed, or a replay clipped it away
                    if self._stop_offsets is not None and (
                        self.finished or shard.assigned <= self._reached_set()
                    ):
                        break
                    continue
                idle_since = time.monotonic()
                more = self._take_budget(len(block))
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
            if not self.settings.linger:
                self._close_shard(shard)
        if ended and self._window is not None:
            yield np.int64(_FLUSH)  # this shard is done: let the shuffle window drain

    def _claim(self, block: RecordBlock) -> RecordBlock:
        """Register a block's records as in flight (the shard calls this under its lock).

        Runs atomically with the shard's revocation of the block's partitions, so the commit
        point the revocation reports accounts for every record this pass has taken. A replay
        clips the block to its stop offsets first (an empty block: nothing left).
        """
        if self._stop_offsets is not None:
            clipped = self._clip(block)
            if clipped is None:
                return _EMPTY
            block = clipped
        self.tracker.register(block.partition, block.offset)
        if block.ends:
            self.tracker.extend(block.ends)
        with self._lock:
            self.records_emitted += len(block)
        return block

    def _reached_set(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._reached)

    @property
    def finished(self) -> bool:
        """A bounded run (replay) has emitted every record of its range."""
        if self._stop_offsets is None:
            return False
        with self._lock:
            return self._reached >= set(self._stop_offsets)

    def _clip(self, block: RecordBlock) -> RecordBlock | None:
        """Drop the records at or past the stop offsets; note partitions that got there."""
        assert self._stop_offsets is not None
        stops = self._stop_offsets
        limit = np.zeros(len(block), dtype=np.int64)
        for p in np.unique(block.partition):
            limit[block.partition == p] = stops.get(int(p), 0)
        keep = block.offset < limit
        with self._lock:
            for p, nxt in block.next_offsets().items():
                if nxt >= stops.get(p, 0):
                    self._reached.add(p)
        ends = {p: min(e, stops.get(p, 0)) for p, e in block.ends.items()}
        if keep.all() and ends == block.ends:
            return block
        if not keep.any() and not ends:
            return None
        idx = np.flatnonzero(keep)
        return RecordBlock.from_columns(
            block.topic,
            [block.values[i] for i in idx],
            block.partition[idx],
            block.offset[idx],
            block.timestamp_ms[idx],
            block.serial,
            ends,
        )

    def _close_shard(self, shard: ShardLike) -> None:
        with self._lock:
            if shard in self._open:
                self._open.remove(shard)
        shard.close()

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
        decoded = decode_block(self.schema, values)
        kept = decoded.kept
        if decoded.rejected:
            self._rejected(values, partition, offset, decoded.rejected)
        if self.metrics is not None:
            self.metrics.observe_decode(len(kept), decoded.reason_counts())
        out = [decoded.features[name] for name in self._names]
        if len(kept) == len(values):
            return [*out, partition, offset, ts]
        return [*out, partition[kept], offset[kept], ts[kept]]

    def _rejected(
        self,
        values: list[bytes],
        partition: np.ndarray,
        offset: np.ndarray,
        rejected: list[tuple[int, str]],
    ) -> None:
        with self._lock:
            self.records_rejected += len(rejected)
        for row, reason in rejected:
            p, o = int(partition[row]), int(offset[row])
            if self._may_log():
                # Never the payload: only where it came from and why.
                log.warning("rejected record %s/%d@%d: %s", self.topic, p, o, reason)
            if self.dead_letter is not None:
                value = values[row]
                self.dead_letter.send(value if value is not None else b"", self.topic, p, o, reason)
        if self.dead_letter is None:
            rows = np.fromiter((r for r, _ in rejected), dtype=np.int64, count=len(rejected))
            self.tracker.ack(partition[rows], offset[rows])

    def _may_log(self) -> bool:
        now = time.monotonic()
        rate = self.settings.log_rejects_per_second
        with self._lock:
            self._reject_log_tokens = min(
                rate, self._reject_log_tokens + (now - self._reject_log_t) * rate
            )
            self._reject_log_t = now
            if self._reject_log_tokens >= 1:
                self._reject_log_tokens -= 1
                return True
        return False

    # ---- commits and lifecycle -------------------------------------------------------------

    def commit(self, points: dict[int, int] | None = None) -> dict[int, int]:
        """Send commit requests for what is done (default: every commit point of the tracker).

        Each partition's point goes to the shard that owns it now; a partition between owners
        (a rebalance under way) is sent again next time, and shards drop what is committed.
        """
        if points is None:
            points = self.tracker.commit_points()
        if not points:
            return {}
        with self._lock:
            shards = list(self._open)
        for shard in shards:
            owned = shard.assigned
            mine = {p: o for p, o in points.items() if p in owned}
            if mine:
                shard.commit(mine)
        return points

    def stop(self) -> None:
        """Make every generator of the current pass finish (the pass ends cleanly)."""
        self._stop.set()

    def resume(self) -> None:
        self._stop.clear()

    @property
    def open_shards(self) -> int:
        with self._lock:
            return len(self._open)

    def end_pass(self) -> None:
        """Close the shards still open (lingering ones): pending commits are flushed first.

        Restored (checkpoint) offsets apply to the first pass only: its final commit carries
        the position on, and later passes start from the group's commits.
        """
        with self._lock:
            shards = list(self._open)
            self._open.clear()
            self._restore.clear()
        for shard in shards:
            try:
                shard.close()
            except Exception as exc:
                log.warning("closing a shard failed: %s", exc)
        release_free_memory()  # the pass's consumers and buffers are gone: give the heap back

    def next_batch(
        self, iterator: Iterator[Any], what: str = "the input pipeline"
    ) -> dict[str, tf.Tensor] | None:
        """The next batch of a pass, or None at its end.

        A failed pipeline raises the error that ended its shard (a StreamerError with the
        cause), else a StreamerError naming ``what`` and TensorFlow's message.
        """
        try:
            batch: dict[str, tf.Tensor] = next(iterator)
        except StopIteration:
            return None
        except tf.errors.OpError as exc:
            cause = self.shard_failure()
            if isinstance(cause, StreamerError):
                raise cause from exc
            raise StreamerError(f"{what} failed: {exc.message}") from exc
        return batch

    def shard_failure(self) -> BaseException | None:
        """The error that ended a shard of this source, if any (the cause of a failed pass)."""
        if self.failure is not None:
            return self.failure
        with self._lock:
            shards = list(self._open)
        for shard in shards:
            if shard.failed is not None:
                return shard.failed
        return None

    def close(self) -> None:
        self.stop()
        self.end_pass()
        if self.dead_letter is not None:
            # A short wait: the stop must fit in --shutdown-timeout; what is not written
            # stays uncommitted and is read again after a restart.
            self.dead_letter.close(timeout=5.0)


def build_dataset(
    schema: Schema,
    settings: PipelineSettings | None = None,
    *,
    consumer: ConsumerSettings | None = None,
    **kwargs: Any,
) -> tuple[tf.data.Dataset, StreamSource]:
    """One call from settings and schema to the batched dataset (and its source, for commits).

    >>> ds, source = build_dataset(schema, PipelineSettings(num_shards=4), consumer=settings)  # doctest: +SKIP
    """
    source = StreamSource(schema, settings, consumer=consumer, **kwargs)
    return source.dataset(), source
