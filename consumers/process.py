"""ProcessShard: a Shard running in a child process, handing blocks over shared memory.

The child polls (and, with the owner's ``prepare``, decodes) its blocks and writes their
columns into a ring of shared-memory slots (consumers/ring.py); the data pipe carries a small
descriptor per block, and the parent's arrays are views of the slot, freed when tf.data is
done with them. The control pipe carries small typed events up (the dataclasses below: what
the child's shard tells its hooks) and commands down (commit, release, close).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import multiprocessing.spawn
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from consumers.block import RecordBlock
from consumers.clients.base import GroupCommit
from consumers.cpu import process_cpu_seconds
from consumers.errors import ShardFailedError, StreamerError
from consumers.group import Barrier
from consumers.hooks import Claim, ShardHooks
from consumers.queue import BlockQueue
from consumers.ring import RingReader, RingSpec, RingWriter
from consumers.settings import ConsumerSettings
from consumers.shard import Shard
from consumers.types import KafkaErrorType

__all__ = ["ProcessShard"]

log = logging.getLogger(__name__)

# ---- events: child -> parent ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assigned:
    """Asks (``ask`` > 0) where the partitions start: the parent answers (``Answer``)."""

    partitions: list[int]
    serial: int
    group: dict[int, GroupCommit] | None = None
    ask: int = 0


@dataclass(frozen=True, slots=True)
class Revoked:
    """Revoked (asks what to commit, once the parent settled them) or lost (no question)."""

    partitions: list[int]
    serial: int
    lost: bool
    ask: int = 0


@dataclass(frozen=True, slots=True)
class Polled:
    records: int
    nbytes: int
    highwater: dict[int, int]
    position: dict[int, int]


@dataclass(frozen=True, slots=True)
class StableOffsets:
    offsets: dict[int, int]


@dataclass(frozen=True, slots=True)
class Committed:
    offsets: dict[int, int]
    ok: bool
    seconds: float
    error: str | None


@dataclass(frozen=True, slots=True)
class ErrorSeen:
    kind: KafkaErrorType
    text: str


@dataclass(frozen=True, slots=True)
class Paused:
    count: int


@dataclass(frozen=True, slots=True)
class GroupCommitted:
    offsets: dict[int, int]


@dataclass(frozen=True, slots=True)
class TopicMissing:
    missing: bool


@dataclass(frozen=True, slots=True)
class LogRecord:
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Joining:
    joining: bool


@dataclass(frozen=True, slots=True)
class BarrierReport:
    generation: int | None


@dataclass(frozen=True, slots=True)
class Failed:
    error: BaseException


@dataclass(frozen=True, slots=True)
class Closed:
    cpu_seconds: float = 0.0  # the child's CPU time at its end (its own clock)


# ---- commands: parent -> child ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Commit:
    offsets: dict[int, int]


@dataclass(frozen=True, slots=True)
class Release:
    pass


@dataclass(frozen=True, slots=True)
class Answer:
    """The parent's answer to the child's question ``ask``: {partition: offset}."""

    ask: int
    offsets: dict[int, int]


@dataclass(frozen=True, slots=True)
class Close:
    pass


# ---- the child --------------------------------------------------------------------------------


#: How long a child waits for its parent to say where assigned partitions start, and what to
#: commit of revoked ones (the parent first waits for the records it handed to training,
#: ``streamer.input.handover``, 5 s at most); then it goes on with what it knows itself.
ASSIGN_ANSWER_SECONDS = 10.0
REVOKE_ANSWER_SECONDS = 15.0


class _ChildHooks(ShardHooks):
    """Runs in the child: forwards events to the parent; the rebalance questions (where to
    start, what to commit) are asked of the parent, which holds the offset tracker and the
    start rule, and answered locally only if it does not answer in time."""

    def __init__(self, send: Any, restore: dict[int, int], session_ms: int = 45_000) -> None:
        self._send = send
        #: How long a revocation waits for the parent: the callback holds the client (its
        #: heartbeats too, with kafka-python), so half the session at most.
        self._revoke_seconds = min(REVOKE_ANSWER_SECONDS, session_ms / 2000)
        self._assign_seconds = min(ASSIGN_ANSWER_SECONDS, session_ms / 2000)
        self._restore = dict(restore)
        self.shard: Shard | None = None
        #: The parent's last commit request per partition: at or below its commit point.
        self.points: dict[int, int] = {}
        self._poll = [0, 0]
        self._last_poll_sent = 0.0
        self._asks = itertools.count(1)
        self._answers: dict[int, dict[int, int] | None] = {}
        self._answered = threading.Condition()
        self._revoke_answer: dict[int, int] | None = None
        #: Set when the parent closes this shard: its last commit requests are final (its
        #: pass committed them before it closed), and nothing more is asked of it.
        self.closing = threading.Event()

    def _serial(self) -> int:
        return self.shard.serial if self.shard is not None else 0

    def _ask(self, make: Callable[[int], object], seconds: float) -> dict[int, int] | None:
        if self.closing.is_set():
            return None  # the parent said its last word: it reads no more questions
        ask = next(self._asks)
        with self._answered:
            self._answers[ask] = None
        self._send(make(ask))
        deadline = time.monotonic() + seconds
        with self._answered:
            while self._answers.get(ask) is None and not self.closing.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._answered.wait(left)
            return self._answers.pop(ask, None)

    def close_asks(self) -> None:
        """The parent closes this shard (or is gone): a question waiting for its answer gives
        up now, not at its timeout (the close would otherwise wait that long)."""
        with self._answered:
            self.closing.set()
            self._answered.notify_all()

    def answer(self, ask: int, offsets: dict[int, int]) -> None:
        with self._answered:
            if ask in self._answers:
                self._answers[ask] = offsets
                self._answered.notify_all()

    def on_assigned(
        self,
        shard_index: int,
        partitions: list[int],
        group: dict[int, GroupCommit] | None = None,
    ) -> dict[int, int]:
        for p in partitions:  # requests made under an earlier assignment say nothing now
            self.points.pop(p, None)
        serial = self._serial()
        starts = self._ask(
            lambda ask: Assigned(partitions, serial, group, ask), self._assign_seconds
        )
        if starts is None:
            log.warning(
                "shard %d: the parent did not say where partitions %s start within %.0fs; "
                "starting from what this shard was given",
                shard_index,
                sorted(partitions),
                self._assign_seconds,
            )
            return {p: self._restore.pop(p) for p in partitions if p in self._restore}
        return starts

    def on_revoking(self, shard_index: int, partitions: list[int]) -> None:
        """Ask the parent to settle the partitions and say what to commit: here, outside the
        shard's lock (the command thread that brings the answer may need that lock for a
        commit request that came first); ``on_revoked`` then returns the answer."""
        serial = self._serial() + 1  # the serial the revocation takes (Shard._on_revoked)
        points = self._ask(
            lambda ask: Revoked(partitions, serial, lost=False, ask=ask), self._revoke_seconds
        )
        if points is None and not self.closing.is_set():
            log.warning(
                "shard %d: the parent did not say what to commit of revoked partitions %s "
                "within %.0fs; committing its last commit request",
                shard_index,
                sorted(partitions),
                self._revoke_seconds,
            )
        self._revoke_answer = points

    def on_revoked(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        points, self._revoke_answer = self._revoke_answer, None
        if points is None:
            # The parent's tracker is the truth; the last points it sent are at or below it.
            return {p: self.points[p] for p in partitions if p in self.points}
        return {p: o for p, o in points.items() if p in partitions}

    def on_lost(self, shard_index: int, partitions: list[int]) -> None:
        self._send(Revoked(partitions, self._serial(), lost=True))

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
            self._send(Polled(self._poll[0], self._poll[1], highwater, position))
            self._poll = [0, 0]
            self._last_poll_sent = now

    def on_stable_offsets(self, shard_index: int, offsets: dict[int, int]) -> None:
        self._send(StableOffsets(offsets))

    def on_commit(
        self, offsets: dict[int, int], ok: bool, seconds: float, error: str | None
    ) -> None:
        self._send(Committed(offsets, ok, seconds, error))

    def on_error(self, kind: KafkaErrorType, exc: BaseException) -> None:
        self._send(ErrorSeen(kind, f"{type(exc).__name__}: {exc}"))

    def on_paused(self, shard_index: int, paused: int) -> None:
        self._send(Paused(paused))

    def on_group_committed(self, shard_index: int, offsets: dict[int, int]) -> None:
        self._send(GroupCommitted(offsets))

    def on_topic_missing(self, shard_index: int, missing: bool) -> None:
        self._send(TopicMissing(missing))


class _ForwardLogs(logging.Handler):
    """In the child: hands every log record to the parent, which logs it with its own handlers.

    The worker's log format, levels and repeat filters then apply to the child's lines too
    (a spawned child starts with no logging configuration at all).
    """

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send
        #: The parent is gone (killed): nobody reads the pipe, so records are dropped quietly
        #: while the child closes its shard, instead of a traceback each on stderr.
        self.parent_gone = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.parent_gone:
            return
        try:
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            fields = dict(record.__dict__)
            fields.update(msg=record.getMessage(), args=None, exc_info=None)
            self._send(LogRecord(fields))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self.parent_gone = True
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
            self._send(BarrierReport(generation))
        return self.released


#: Signals a shard child leaves to its parent: a terminal's Ctrl-C or systemd's control-group
#: stop reaches every process of the group, and only the parent may stop cleanly.
_PARENT_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGTERM})


def _child_main(
    data_conn: Any,
    ctrl_conn: Any,
    ring_spec: RingSpec,
    settings: ConsumerSettings,
    shard_index: int,
    num_shards: int,
    restore: dict[int, int],
    use_barrier: bool,
    levels: dict[str, int],
    prepare: Callable[[RecordBlock], Any] | None = None,
) -> None:
    # Terminal and group signals are the parent's to act on (DESIGN.md section 3, shutdown):
    # ignored since this process's first code (consumers/_child_start.py), and here again.
    for signum in _PARENT_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _PARENT_SIGNALS)
    lock = threading.Lock()

    def send(event: object) -> None:
        with lock:
            ctrl_conn.send(event)

    logging.getLogger().handlers[:] = [_ForwardLogs(send)]
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)

    def tell(event: object) -> None:
        # From rebalance callbacks too (the client's thread, also inside close()): a parent
        # that is gone must not make a callback raise ("User rebalance callback throws").
        with contextlib.suppress(OSError, ValueError):
            send(event)

    hooks = _ChildHooks(tell, restore, settings.session_timeout_ms)
    barrier = _RemoteBarrier(send) if use_barrier else None
    shard = Shard(settings, shard_index, num_shards, hooks=hooks, barrier=barrier)
    hooks.shard = shard
    stop = threading.Event()

    def commands() -> None:
        while not stop.is_set():
            try:
                command = ctrl_conn.recv()
            except (EOFError, OSError):
                hooks.close_asks()
                stop.set()
                return
            match command:
                case Commit(offsets):
                    hooks.points.update(offsets)
                    shard.commit(offsets)
                case Release() if barrier is not None:
                    barrier.released = True
                case Answer(ask, offsets):
                    hooks.answer(ask, offsets)
                case Close():
                    hooks.close_asks()
                    stop.set()
                    return

    try:
        ring = RingWriter(ring_spec)
        shard.start()
    except BaseException as exc:
        send(Failed(_picklable(exc)))
        return
    reader = threading.Thread(target=commands, name="streamer-shard-commands", daemon=True)
    reader.start()
    try:
        joining: bool | None = None
        while not stop.is_set():
            if shard.joining != joining:  # the parent's idle clock stops while the group rebalances
                joining = shard.joining
                send(Joining(joining))
            block = shard.get(0.1)
            if block is not None:
                if prepare is not None and len(block):
                    # Decoded here, where the records are: the parent's map gets columns.
                    block = dataclasses.replace(block, prepared=prepare(block))
                # Into a free slot (waiting for one: this shard's queue then fills, and its
                # poller holds, then pauses), and its descriptor down the pipe.
                message = ring.message(block, lambda: not stop.is_set())
                if message is None:
                    break
                data_conn.send_bytes(message)
    except ShardFailedError as exc:
        send(Failed(_picklable(exc.__cause__ or exc)))
    except (BrokenPipeError, EOFError, OSError):
        pass
    finally:
        stop.set()
        hooks.close_asks()  # the command thread is gone: no answer would come
        shard.close()
        ring.close()
        with contextlib.suppress(OSError):
            send(Closed(time.process_time()))


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it crosses the pipe whole (pickled and rebuilt), else a StreamerError
    naming it."""
    try:
        pickle.loads(pickle.dumps(exc))  # noqa: S301 (our own bytes)
        return exc
    except Exception:
        return StreamerError(f"{type(exc).__name__}: {exc}")


# ---- the parent -------------------------------------------------------------------------------


_MAIN_LOCK = threading.Lock()


#: The child's main module (``__mp_main__``): ignores terminal and group signals first thing.
_CHILD_START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child_start.py")


_launcher: str | None = None
_launcher_tried = False


def _child_launcher() -> str | None:
    """A launcher for the child's interpreter that starts it with SIGINT and SIGTERM ignored
    (``trap '' INT TERM; exec python``): an ignored signal stays ignored across ``exec``, and
    Python then installs no KeyboardInterrupt handler, so a Ctrl-C to the process group
    while a child starts (its interpreter, its imports) reaches nothing in it. Made once per
    process in a private temporary directory (removed at exit) and tried once; None where
    none can be made or run (no /bin/sh, a read-only or noexec /tmp): the child then ignores
    them from its first line on (``_CHILD_START``), a window of its interpreter's start-up.

    The spawn's executable and ``__main__``'s file are process-wide: another thread's own
    ``multiprocessing`` spawn in the same instant (a user's, in a script that uses
    ``streamer.Stream``) would start through them too (a child that ignores the terminal's
    signals); the swap lasts only as long as ``Process.start()``."""
    global _launcher, _launcher_tried
    if _launcher_tried:
        return _launcher
    _launcher_tried = True
    if os.name != "posix" or not os.path.exists("/bin/sh"):
        return None
    try:
        directory = tempfile.mkdtemp(prefix="streamer-shard-")
        path = os.path.join(directory, "python")
        python = multiprocessing.spawn.get_executable()
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(
                "#!/bin/sh\n"
                "# A streamer shard child: terminal and group signals are its parent's.\n"
                "trap '' INT TERM\n"
                f'exec {shlex.quote(os.fsdecode(python))} "$@"\n'
            )
        os.chmod(path, 0o700)
        # A /tmp mounted noexec takes the file but not its exec: try it once.
        subprocess.run([path, "-c", "pass"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("no launcher for shard children (%s): they ignore signals once started", exc)
        return None
    atexit.register(shutil.rmtree, directory, True)
    _launcher = path
    return path


@contextlib.contextmanager
def _child_main_module() -> Iterator[None]:
    """Start a spawned child by the launcher (``_child_launcher``: its interpreter starts
    with SIGINT and SIGTERM ignored) and with ``consumers/_child_start.py`` as its main
    module, not the parent's: ``multiprocessing`` runs the parent's main script again in the
    child (as ``__mp_main__``) before anything else, so a training script of a user of
    ``streamer.Stream`` without the ``if __name__ == "__main__"`` guard would build a Stream
    in every shard's child (and the child fail). The spawn reads the executable,
    ``__main__.__spec__`` and ``__file__`` as ``start()`` prepares the child, and only then;
    shards start on several threads, hence the lock."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    with _MAIN_LOCK:
        launcher = _child_launcher()
        python = multiprocessing.spawn.get_executable()
        missing = object()
        saved = {k: main.__dict__.get(k, missing) for k in ("__spec__", "__file__")}
        main.__dict__["__spec__"] = None
        main.__dict__["__file__"] = _CHILD_START
        if launcher is not None:
            multiprocessing.spawn.set_executable(launcher)
        try:
            yield
        finally:
            if launcher is not None:
                multiprocessing.spawn.set_executable(python)
            for k, v in saved.items():
                if v is missing:
                    main.__dict__.pop(k, None)
                else:
                    main.__dict__[k] = v


class ProcessShard:
    """A ``ShardLike`` whose consumer runs in a child process.

    kafka-python parses records in Python, so a process tops out at one core's parse rate
    however many thread shards it runs. A ProcessShard polls in a spawned child (no TensorFlow
    there), receives blocks over a pipe into a ``BlockQueue`` and sends commit requests back.
    The join barrier stays in the parent, shared by all the pass's shards.
    """

    def __init__(
        self,
        settings: ConsumerSettings,
        shard_index: int,
        num_shards: int,
        *,
        hooks: ShardHooks | None = None,
        barrier: Barrier | None = None,
        restore: dict[int, int] | None = None,
        max_blocks: int | None = None,
        prepare: Callable[[RecordBlock], Any] | None = None,
    ) -> None:
        """``prepare``: run on each block in the child, where its records are (picklable: a
        module-level function or a partial of one); what it returns (``Prepared``) travels
        instead of the values the owner does not need."""
        self.settings = settings
        self._prepare = prepare
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.hooks = hooks or ShardHooks()
        self._barrier = barrier if settings.mode == "group" else None
        self._restore = dict(restore or {})
        self._queue = BlockQueue(max_blocks or settings.queue_max_blocks)
        self._lock = self._queue.lock
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
        self._ring: RingReader | None = None
        self._threads: list[threading.Thread] = []
        #: Records handed over by the child so far (its read-ahead, for cost accounting).
        self.records_received = 0
        self._child_cpu_at_end: float | None = None

    def start(self) -> ProcessShard:
        ctx = multiprocessing.get_context("spawn")
        # Slots for the parent's queue and 16 for what tf.data holds (handles buffered by the
        # interleave, the decode map's calls, rebatch's partial block: with 8, 15-20 % of the
        # blocks were copied out, with 16 none, benchmarks/README.md); the ring copies a block
        # out rather than use its last two slots: bounded, never stuck.
        self._ring = RingReader(self._queue.max_blocks + 16, name=f"shard-{self.shard_index}")
        self._data, child_data = ctx.Pipe(duplex=False)
        self._ctrl, child_ctrl = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(
            target=_child_main,
            args=(
                child_data,
                child_ctrl,
                self._ring.spec,
                self.settings,
                self.shard_index,
                self.num_shards,
                self._restore,
                self._barrier is not None,
                _logger_levels(),
                self._prepare,
            ),
            name=f"streamer-shard-{self.shard_index}",
            daemon=True,
        )
        # A spawned child starts with an empty mask (the mask below keeps the signals from
        # this thread only while it starts the child); the child ignores them first thing
        # (``_CHILD_START``), so a Ctrl-C to the process group never interrupts its imports.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _PARENT_SIGNALS)
        try:
            with _child_main_module():
                self._proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            self._ring.after_start()  # the child has its own copies of the ring's descriptors
        child_data.close()
        child_ctrl.close()
        for target, name in ((self._read_blocks, "blocks"), (self._read_events, "events")):
            t = threading.Thread(
                target=target, name=f"streamer-shard-{self.shard_index}-{name}", daemon=True
            )
            t.start()
            self._threads.append(t)
        return self

    # ---- reader threads ----------------------------------------------------------------------

    def _read_blocks(self) -> None:
        try:
            self._receive_blocks()
        except BaseException as exc:  # never a silent end of the stream: the pass fails
            log.error("shard %d: reading blocks from the child failed: %r", self.shard_index, exc)
            self.failed = exc
            self._queue.wake()

    def _receive_blocks(self) -> None:
        while True:
            with self._lock:
                while self._queue.full and not self._closed:
                    self._lock.wait(0.5)  # the pipe and then the child's own queue fill up
            try:
                data = self._data.recv_bytes()
            except (EOFError, OSError):
                return
            if self._closed:
                continue  # closing: drain so the child is never stuck in send
            assert self._ring is not None
            block: RecordBlock | None
            block, parts = self._ring.block(data)
            with self._lock:
                while block is not None and block.serial > self._serial and not self._closed:
                    self._lock.wait(0.5)
                assert block is not None
                gone = {
                    p
                    for p in parts
                    if p not in self._assigned or self._revoked_at.get(p, -1) > block.serial
                }
                block = block.without_partitions(gone) if gone else block
                if block is not None:
                    self._queue.put(block)
                    self.records_received += len(block)
                    if len(block):
                        self.last_record_monotonic = time.monotonic()

    def _read_events(self) -> None:
        while True:
            try:
                event = self._ctrl.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # an event that does not unpickle: the shard has failed
                self.failed = self.failed or StreamerError(
                    f"shard {self.shard_index}: an event from its child could not be read: "
                    f"{type(exc).__name__}: {exc}"
                )
                self._queue.wake()
                continue  # keep reading: a child blocked on a full pipe would never stop
            if isinstance(event, Closed):
                self._child_cpu_at_end = event.cpu_seconds
                break
            self._handle(event)
        died = self._child_cpu_at_end is None and not self._closed and self.failed is None
        if died and self._ended_by_group_signal():
            # A Ctrl-C (or a SIGTERM to the process group) that reached the child as it started,
            # before it could ignore it: the parent got it too and is stopping. Not a failure.
            log.info(
                "shard %d: its child process was ended by %s as it started (the signal this "
                "worker stops on); its records not trained are read again",
                self.shard_index,
                self._exit_text(),
            )
        elif died:  # killed (the OOM killer, kill -9) or crashed: never a silent idle shard
            self.failed = StreamerError(
                f"shard {self.shard_index}: its child process ended without closing its "
                f"consumer ({self._exit_text()}); its records not trained stay uncommitted "
                "and are read again"
            )
        self._child_closed.set()
        self._queue.wake()

    def _ended_by_group_signal(self) -> bool:
        """The child was killed by SIGINT or SIGTERM: what a terminal or an operator sends the
        whole process group (a child ignores them from its first line on; only one that
        arrives while its interpreter starts can end it)."""
        proc = self._proc
        if proc is None:
            return False
        proc.join(1.0)
        return proc.exitcode in (-signal.SIGINT, -signal.SIGTERM)

    def _exit_text(self) -> str:
        proc = self._proc
        if proc is None:
            return "exit status unknown"
        proc.join(1.0)
        code = proc.exitcode
        if code is None:
            return f"pid {proc.pid}, still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"pid {proc.pid}, killed by {signal.Signals(-code).name}"
        return f"pid {proc.pid}, exit code {code}"

    def _handle(self, event: object) -> None:
        hooks, k = self.hooks, self.shard_index
        match event:
            case Assigned(partitions, serial, group, ask):
                self._child_up = True
                self.last_rebalance_monotonic = time.monotonic()
                with self._lock:  # added: all of it (eager), or what moved (cooperative)
                    self._assigned |= set(partitions)
                starts = hooks.on_assigned(k, partitions, group)
                if ask:
                    self._send(Answer(ask, starts))
                with self._lock:  # blocks of this assignment wait until the owner knows it
                    self._serial = max(self._serial, serial)
                    self._lock.notify_all()
            case Revoked(partitions, serial, lost, ask):
                gone = set(partitions)
                if not lost:  # outside the lock: the pipeline goes on meanwhile
                    hooks.on_revoking(k, partitions)
                points: dict[int, int] = {}
                with self._lock:
                    self._assigned -= gone
                    self._serial = max(self._serial, serial)
                    for p in gone:
                        self._revoked_at[p] = serial
                    self._queue.drop(gone)
                    # Under the lock get(claim=...) takes: a block is claimed before or dropped.
                    if lost:
                        hooks.on_lost(k, partitions)
                    else:
                        points = hooks.on_revoked(k, partitions)
                if ask:
                    self._send(Answer(ask, points))
            case Polled(records, nbytes, highwater, position):
                hooks.on_poll(k, records, nbytes, highwater, position)
            case StableOffsets(offsets):
                hooks.on_stable_offsets(k, offsets)
            case Committed(offsets, ok, seconds, error):
                hooks.on_commit(offsets, ok, seconds, error)
            case ErrorSeen(kind, text):
                hooks.on_error(kind, StreamerError(text))
            case Paused(count):
                hooks.on_paused(k, count)
            case GroupCommitted(offsets):
                hooks.on_group_committed(k, offsets)
            case TopicMissing(missing):
                self.topic_missing = missing
                hooks.on_topic_missing(k, missing)
            case LogRecord(fields):
                record = logging.makeLogRecord(fields)
                logging.getLogger(record.name).handle(record)
            case Joining(joining):
                self._child_joining = joining
                if not joining:
                    # Joined (with partitions or none: a client may call no listener for an
                    # empty assignment, and a shard without partitions must go idle too).
                    self._child_up = True
                    self.last_rebalance_monotonic = time.monotonic()
            case BarrierReport(generation) if self._barrier is not None:
                self._generation = (generation,)
                if self._barrier.report(k, generation):
                    self._release()
            case Failed(error):
                self.failed = error
                self._queue.wake()

    def _release(self) -> None:
        if not self._joined:
            self._joined = True
            self._send(Release())

    def _send(self, command: object) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._ctrl.send(command)

    # ---- ShardLike ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The child's process id (None before ``start``)."""
        return None if self._proc is None else self._proc.pid

    @property
    def ring_stats(self) -> dict[str, int]:
        """Blocks through the ring so far: ``copied`` out of their slot (to keep two free),
        ``inline`` (larger than a slot), ``held`` (slots the parent's arrays still view)."""
        ring = self._ring
        if ring is None:
            return {"copied": 0, "inline": 0, "held": 0}
        return {"copied": ring.copies, "inline": ring.inline, "held": ring.held}

    @property
    def child_ended(self) -> bool:
        """The child has said its last word (closed its consumer, sent its CPU time)."""
        return self._child_closed.is_set()

    @property
    def child_cpu_seconds(self) -> float | None:
        """The child's CPU time so far (user + system, every thread): the kernel's clock while
        it runs, its own last word once it closed; None when neither can be read."""
        if self._child_cpu_at_end is not None:
            return self._child_cpu_at_end
        if self._proc is None or self._proc.pid is None:
            return None
        return process_cpu_seconds(self._proc.pid)

    @property
    def assigned(self) -> frozenset[int]:
        with self._lock:
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
        return self._queue.queued_records

    def get(self, timeout: float, claim: Claim | None = None) -> RecordBlock | None:
        block = self._queue.get(
            timeout,
            claim,
            ended=lambda: self.failed is not None or self._child_closed.is_set() or self._closed,
        )
        if block is None and self.failed is not None:
            raise ShardFailedError(self.shard_index, self.failed)
        return block

    def commit(self, offsets: dict[int, int]) -> None:
        if offsets:
            self._send(Commit(dict(offsets)))

    def close(self, timeout: float = 10.0) -> None:
        """Flush requested commits in the child, stop it, and join every thread. Idempotent."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
        self._queue.clear()
        self._send(Close())
        closed = self._child_closed.wait(timeout)
        if self._proc is not None:
            # A child that closed its consumer exits at once; one still closing it after the
            # timeout is not waited for a second time.
            self._proc.join(timeout if closed else 1.0)
            if self._proc.is_alive():
                # SIGKILL: the child ignores SIGTERM (the parent's to act on), so a terminate()
                # would only wait.
                log.warning(
                    "shard %d: child did not stop in %.0fs; killing it (its last commit may "
                    "not have been sent: without a checkpoint, those records are trained again)",
                    self.shard_index,
                    timeout,
                )
                self._proc.kill()
                self._proc.join(5)
        for conn in (self._data, self._ctrl):
            conn.close()
        for t in self._threads:
            t.join(timeout)
        if self._ring is not None:
            self._ring.close()
