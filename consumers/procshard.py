"""ProcessShard: a Shard running in a child process, handing blocks over a pipe (past one core)."""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import pickle
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from consumers.block import RecordBlock
from consumers.errors import ShardFailedError, StreamerError
from consumers.settings import ConsumerSettings
from consumers.shard import JoinBarrier, Shard, ShardHooks

__all__ = ["ProcessShard"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<Q")


def _pack_block(block: RecordBlock) -> bytes:
    lengths = np.fromiter((len(v) for v in block.values), dtype=np.int64, count=len(block.values))
    header = pickle.dumps(
        (
            block.topic,
            block.partition,
            block.offset,
            block.timestamp_ms,
            lengths,
            block.serial,
            block.ends,
        ),
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    return b"".join((_HEADER.pack(len(header)), header, *block.values))


def _unpack_block(data: bytes) -> RecordBlock:
    (hlen,) = _HEADER.unpack_from(data)
    start = _HEADER.size + hlen
    topic, partition, offset, ts, lengths, serial, ends = pickle.loads(data[_HEADER.size : start])  # noqa: S301 - our own child
    stops = (np.cumsum(lengths) + start).tolist()
    starts = [start, *stops[:-1]] if stops else []
    values = [data[a:b] for a, b in zip(starts, stops, strict=True)]
    return RecordBlock(topic, values, partition, offset, ts, int(lengths.sum()), serial, ends)


class _ChildHooks(ShardHooks):
    """Runs in the child: forwards events to the parent, answers the IO thread's questions locally."""

    def __init__(self, send: Any, restore: dict[int, int]) -> None:
        self._send = send
        self._restore = dict(restore)
        self.shard: Shard | None = None
        #: The parent's last commit request per partition: at or below its commit point.
        self.points: dict[int, int] = {}
        self._poll = [0, 0]
        self._last_poll_sent = 0.0

    def _serial(self) -> int:
        return self.shard.serial if self.shard is not None else 0

    def on_assigned(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        for p in partitions:  # requests made under an earlier assignment say nothing now
            self.points.pop(p, None)
        self._send(("assigned", partitions, self._serial()))
        return {p: self._restore.pop(p) for p in partitions if p in self._restore}

    def on_revoked(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        self._send(("revoked", partitions, self._serial()))
        # The parent's tracker is the truth; the last points it sent are at or below it (safe).
        return {p: self.points[p] for p in partitions if p in self.points}

    def on_lost(self, shard_index: int, partitions: list[int]) -> None:
        self._send(("lost", partitions, self._serial()))

    def on_poll(
        self,
        shard_index: int,
        records: int,
        nbytes: int,
        highwater: dict[int, int],
        position: dict[int, int],
    ) -> None:
        self._poll[0] += records
        self._poll[1] += nbytes
        now = time.monotonic()
        if now - self._last_poll_sent >= 0.25:
            self._send(("poll", self._poll[0], self._poll[1], highwater, position))
            self._poll = [0, 0]
            self._last_poll_sent = now

    def on_stable_offsets(self, shard_index: int, offsets: dict[int, int]) -> None:
        self._send(("stable", offsets))

    def on_commit(
        self, offsets: dict[int, int], ok: bool, seconds: float, error: str | None
    ) -> None:
        self._send(("commit", offsets, ok, seconds, error))

    def on_error(self, kind: str, exc: BaseException) -> None:
        self._send(("error", kind, f"{type(exc).__name__}: {exc}"))

    def on_paused(self, shard_index: int, paused: int) -> None:
        self._send(("paused", paused))

    def on_group_committed(self, shard_index: int, offsets: dict[int, int]) -> None:
        self._send(("group_committed", offsets))

    def on_topic_missing(self, shard_index: int, missing: bool) -> None:
        self._send(("topic_missing", missing))


class _ForwardLogs(logging.Handler):
    """In the child: hands every log record to the parent, which logs it with its own handlers.

    The worker's log format, levels and repeat filters then apply to the child's lines too
    (a spawned child starts with no logging configuration at all).
    """

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            fields = dict(record.__dict__)
            fields.update(msg=record.getMessage(), args=None, exc_info=None)
            self._send(("log", fields))
        except Exception:  # a record we cannot send must never break the child
            self.handleError(record)


def _logger_levels() -> dict[str, int]:
    """The parent's logging levels: the root's and every logger's that has one of its own."""
    levels = {"": logging.getLogger().level}
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    return levels


class _RemoteBarrier:
    """The child's view of the parent's JoinBarrier: reports go up, the release comes down."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self.released = False
        self._last: object = object()

    def report(self, shard_index: int, generation: int | None) -> bool:
        if generation != self._last:
            self._last = generation
            self._send(("barrier", generation))
        return self.released


def _child_main(
    data_conn: Any,
    ctrl_conn: Any,
    settings: ConsumerSettings,
    shard_index: int,
    num_shards: int,
    restore: dict[int, int],
    use_barrier: bool,
    levels: dict[str, int],
) -> None:
    lock = threading.Lock()

    def send(msg: Any) -> None:
        with lock:
            ctrl_conn.send(msg)

    logging.getLogger().handlers[:] = [_ForwardLogs(send)]
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)

    hooks = _ChildHooks(send, restore)
    barrier = _RemoteBarrier(send) if use_barrier else None
    shard = Shard(settings, shard_index, num_shards, hooks=hooks, barrier=barrier)  # type: ignore[arg-type]
    hooks.shard = shard
    stop = threading.Event()

    def commands() -> None:
        while not stop.is_set():
            try:
                msg = ctrl_conn.recv()
            except (EOFError, OSError):
                stop.set()
                return
            kind = msg[0]
            if kind == "commit":
                hooks.points.update(msg[1])
                shard.commit(msg[1])
            elif kind == "release" and barrier is not None:
                barrier.released = True
            elif kind == "close":
                stop.set()
                return

    try:
        shard.start()
    except BaseException as exc:
        send(("failed", _picklable(exc)))
        return
    reader = threading.Thread(target=commands, name="streamer-shard-commands", daemon=True)
    reader.start()
    try:
        joining: bool | None = None
        while not stop.is_set():
            if shard.joining != joining:  # the parent's idle clock stops while the group rebalances
                joining = shard.joining
                send(("joining", joining))
            block = shard.get(0.1)
            if block is not None:
                data_conn.send_bytes(_pack_block(block))
    except ShardFailedError as exc:
        send(("failed", _picklable(exc.__cause__ or exc)))
    except (BrokenPipeError, EOFError, OSError):
        pass
    finally:
        stop.set()
        shard.close()
        with contextlib.suppress(OSError):
            send(("closed",))


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        return StreamerError(f"{type(exc).__name__}: {exc}")


class ProcessShard:
    """The shape of ``consumers.Shard``, with the consumer in a child process.

    kafka-python parses records in Python, so a process tops out at one core's parse rate
    however many thread shards it runs. A ProcessShard polls in a spawned child (no TensorFlow
    there), sends blocks over a pipe and receives commit requests back. The join barrier
    stays in the parent, shared by all the pass's shards.
    """

    def __init__(
        self,
        settings: ConsumerSettings,
        shard_index: int,
        num_shards: int,
        *,
        hooks: ShardHooks | None = None,
        barrier: JoinBarrier | None = None,
        restore: dict[int, int] | None = None,
        max_blocks: int | None = None,
    ) -> None:
        self.settings = settings
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.hooks = hooks or ShardHooks()
        self._barrier = barrier if settings.mode == "group" else None
        self._restore = dict(restore or {})
        self._max_blocks = max_blocks or settings.queue_max_blocks
        self._cond = threading.Condition()
        self._queue: collections.deque[RecordBlock] = collections.deque()
        self._assigned: set[int] = set()
        # The child's assignment serial as far as its events have arrived, and per partition
        # the serial of its last revocation: blocks travel on another pipe than events, so a
        # block polled before a rebalance can arrive after it (dropped), one polled after it
        # before the event (held until the event arrives).
        self._serial = 0
        self._revoked_at: dict[int, int] = {}
        self._joined = self._barrier is None
        self._child_up = False  # until the child has its first assignment, it is still starting
        self._child_joining = True  # the child's Shard.joining (its group is rebalancing)
        self._generation: tuple[int | None] | None = None  # the child's last barrier report
        self._closed = False
        self._child_closed = threading.Event()
        self.failed: BaseException | None = None
        self.topic_missing = False  # the child's shard says so (readiness)
        self.last_record_monotonic = time.monotonic()
        self.last_rebalance_monotonic = time.monotonic()
        self._proc: Any = None
        self._threads: list[threading.Thread] = []

    def start(self) -> ProcessShard:
        ctx = multiprocessing.get_context("spawn")
        self._data, child_data = ctx.Pipe(duplex=False)
        self._ctrl, child_ctrl = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(
            target=_child_main,
            args=(
                child_data,
                child_ctrl,
                self.settings,
                self.shard_index,
                self.num_shards,
                self._restore,
                self._barrier is not None,
                _logger_levels(),
            ),
            name=f"streamer-shard-{self.shard_index}",
            daemon=True,
        )
        self._proc.start()
        child_data.close()
        child_ctrl.close()
        for target, name in ((self._read_blocks, "blocks"), (self._read_events, "events")):
            t = threading.Thread(
                target=target, name=f"streamer-shard-{self.shard_index}-{name}", daemon=True
            )
            t.start()
            self._threads.append(t)
        return self

    # ---- reader threads ---------------------------------------------------------------------

    def _read_blocks(self) -> None:
        try:
            self._receive_blocks()
        except BaseException as exc:  # never a silent end of the stream: the pass fails
            log.error("shard %d: reading blocks from the child failed: %r", self.shard_index, exc)
            self.failed = exc
            with self._cond:
                self._cond.notify_all()

    def _receive_blocks(self) -> None:
        while True:
            with self._cond:
                while len(self._queue) >= self._max_blocks and not self._closed:
                    self._cond.wait(0.5)  # the pipe and then the child's own queue fill up
            try:
                data = self._data.recv_bytes()
            except (EOFError, OSError):
                return
            if self._closed:
                continue  # closing: drain so the child is never stuck in send
            block = _unpack_block(data)
            with self._cond:
                while block.serial > self._serial and not self._closed:
                    self._cond.wait(0.5)
                gone = {
                    p
                    for p in block.partitions()
                    if p not in self._assigned or self._revoked_at.get(p, -1) > block.serial
                }
                if gone:
                    block = block.without_partitions(gone)  # type: ignore[assignment]
                if block is not None:
                    self._queue.append(block)
                    if len(block):
                        self.last_record_monotonic = time.monotonic()
                    self._cond.notify_all()

    def _read_events(self) -> None:
        while True:
            try:
                msg = self._ctrl.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "assigned":
                self._child_up = True
                self.last_rebalance_monotonic = time.monotonic()
                with self._cond:
                    self._assigned = set(msg[1])
                self.hooks.on_assigned(self.shard_index, msg[1])
                with self._cond:  # blocks of this assignment wait until the owner knows it
                    self._serial = max(self._serial, msg[2])
                    self._cond.notify_all()
            elif kind in ("revoked", "lost"):
                gone = set(msg[1])
                with self._cond:
                    self._assigned -= gone
                    self._serial = max(self._serial, msg[2])
                    for p in gone:
                        self._revoked_at[p] = msg[2]
                    kept = collections.deque(
                        b
                        for b in (blk.without_partitions(gone) for blk in self._queue)
                        if b is not None
                    )
                    self._queue = kept
                    self._cond.notify_all()
                    # Under the lock get(claim=...) takes: a block is claimed before or dropped.
                    if kind == "revoked":
                        self.hooks.on_revoked(self.shard_index, msg[1])
                    else:
                        self.hooks.on_lost(self.shard_index, msg[1])
            elif kind == "poll":
                self.hooks.on_poll(self.shard_index, msg[1], msg[2], msg[3], msg[4])
            elif kind == "commit":
                self.hooks.on_commit(msg[1], msg[2], msg[3], msg[4])
            elif kind == "stable":
                self.hooks.on_stable_offsets(self.shard_index, msg[1])
            elif kind == "error":
                self.hooks.on_error(msg[1], StreamerError(msg[2]))
            elif kind == "paused":
                self.hooks.on_paused(self.shard_index, msg[1])
            elif kind == "group_committed":
                self.hooks.on_group_committed(self.shard_index, msg[1])
            elif kind == "topic_missing":
                self.topic_missing = bool(msg[1])
                self.hooks.on_topic_missing(self.shard_index, self.topic_missing)
            elif kind == "log":
                record = logging.makeLogRecord(msg[1])
                logging.getLogger(record.name).handle(record)
            elif kind == "joining":
                self._child_joining = bool(msg[1])
                if not self._child_joining:
                    self.last_rebalance_monotonic = time.monotonic()
            elif kind == "barrier" and self._barrier is not None:
                self._generation = (msg[1],)
                if self._barrier.report(self.shard_index, msg[1]):
                    self._release()
            elif kind == "failed":
                self.failed = msg[1]
            elif kind == "closed":
                break
        self._child_closed.set()
        with self._cond:
            self._cond.notify_all()

    def _release(self) -> None:
        if not self._joined:
            self._joined = True
            self._send(("release",))

    def _send(self, msg: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._ctrl.send(msg)

    # ---- the Shard interface ----------------------------------------------------------------

    @property
    def assigned(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._assigned)

    @property
    def joining(self) -> bool:
        # The child reports a generation once, when it changes; the barrier releases when all
        # shards held one generation for its settle time (or at its deadline), which it can
        # only see when asked again: ask on every call.
        if (
            not self._joined
            and self._barrier is not None
            and self._generation is not None
            and self._barrier.report(self.shard_index, self._generation[0])
        ):
            self._release()
        if not self._joined and self._barrier is not None and self._barrier.released:
            self._release()
        if self.failed is not None or self._child_closed.is_set():
            return False
        return not (self._joined and self._child_up) or self._child_joining

    @property
    def queued_records(self) -> int:
        with self._cond:
            return sum(len(b) for b in self._queue)

    def get(
        self, timeout: float, claim: Callable[[RecordBlock], RecordBlock] | None = None
    ) -> RecordBlock | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._queue:
                if self.failed is not None:
                    raise ShardFailedError(self.shard_index, self.failed)
                if self._child_closed.is_set() or self._closed:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            block = self._queue.popleft()
            self._cond.notify_all()
            return claim(block) if claim is not None else block

    def commit(self, offsets: dict[int, int]) -> None:
        if offsets:
            self._send(("commit", dict(offsets)))

    def close(self, timeout: float = 10.0) -> None:
        """Flush requested commits in the child, stop it, and join every thread. Idempotent."""
        if self._closed:
            return
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._send(("close",))
        self._child_closed.wait(timeout)
        if self._proc is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                log.warning(
                    "shard %d: child did not stop in %.0fs; terminating it",
                    self.shard_index,
                    timeout,
                )
                self._proc.terminate()
                self._proc.join(5)
        for conn in (self._data, self._ctrl):
            conn.close()
        for t in self._threads:
            t.join(timeout)
