"""DeadLetterWriter: records that fail to decode, and the records of skipped non-finite steps,
go to a dead-letter topic, done once acknowledged.

A letter is the original record, read back from the source topic by its coordinates (the hot
path carries values only): its key, value (a tombstone stays a tombstone) and headers, as
Kafka Connect's dead-letter queue keeps them, with headers of our own beside them: the source
topic, partition, offset and timestamp, and the reason.

A dead letter always advances: a letter the dead-letter topic can never take (too large,
invalid) is written again without its value, so the source partition's commit point moves on.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from consumers.block import Original
from consumers.producer import is_permanent, new_producer

__all__ = [
    "HEADER_ERROR",
    "HEADER_OFFSET",
    "HEADER_ORIGINAL_SIZE",
    "HEADER_PARTITION",
    "HEADER_REASON",
    "HEADER_TIMESTAMP",
    "HEADER_TOPIC",
    "REASON_NONFINITE_STEP",
    "DeadLetterBacklogFull",
    "DeadLetterWriter",
    "SourceReader",
]

log = logging.getLogger(__name__)

HEADER_TOPIC = "streamer.input.source.topic"
HEADER_PARTITION = "streamer.input.source.partition"
HEADER_OFFSET = "streamer.input.source.offset"
HEADER_TIMESTAMP = "streamer.input.source.timestamp"
HEADER_REASON = "streamer.reason"
#: The reason of the records of a step skipped because its loss or gradients were not finite
#: (the decoder's reasons: ``consumers.types.REASONS``).
REASON_NONFINITE_STEP = "nonfinite_step"
#: Header-only letters: the rejected record's size in bytes (its value is not in the letter).
HEADER_ORIGINAL_SIZE = "streamer.original.size"
#: Header-only letters: the name of the produce error that refused the whole letter, or
#: ``SourceRecordGone`` where the source topic no longer held a record to read back.
HEADER_ERROR = "streamer.produce.error"
#: The error of a letter whose record the source topic no longer holds (retention, compaction).
GONE = "SourceRecordGone"

Done = Callable[[int, int], None]

#: At most this many letters of one partition are read back from the source at once (their
#: records are held until written: a bound on the memory a skipped step's batch takes).
_LOOK_UP_MAX = 256
#: Retries of a failed write wait 1 s, doubling to this.
_MAX_RETRY_S = 30.0
#: A failed write is logged at once, then at most once per this many seconds (with a count).
_LOG_EVERY_S = 10.0
#: The producer's max_request_size when the dead-letter topic's max.message.bytes is unknown.
_DEFAULT_MAX_REQUEST = 16 * 1024 * 1024
#: Added to the topic's max.message.bytes for the producer's own (estimated) size check: a
#: letter near the limit is left to the broker, which measures it exactly.
_REQUEST_HEADROOM = 64 * 1024


class SourceReader(Protocol):
    """Reads records back whole by their coordinates (``consumers``' ``RecordReader``)."""

    def read(self, partition: int, offsets: list[int]) -> dict[int, Original]: ...

    def close(self) -> None: ...


class DeadLetterBacklogFull(RuntimeError):
    """The writer holds ``max_backlog_bytes`` of unwritten records: a new one is not taken."""


@dataclass(order=True)
class _Letter:
    due: float
    seq: int
    #: None: not known here (a skipped step's record), read back from the source.
    value: bytes | None = field(compare=False)
    topic: str = field(compare=False)
    partition: int = field(compare=False)
    offset: int = field(compare=False)
    reason: str = field(compare=False)
    #: The bytes this letter holds in the backlog.
    size: int = field(default=0, compare=False)
    attempts: int = field(default=0, compare=False)
    #: The original record, read back (``SourceReader``); None until then or where not read.
    original: Original | None = field(default=None, compare=False)
    looked_up: bool = field(default=False, compare=False)
    #: Set on a header-only letter: the record's size and the error that refused it whole.
    original_size: int | None = field(default=None, compare=False)
    error: str | None = field(default=None, compare=False)


class DeadLetterWriter:
    """Writes rejected records to ``topic`` with headers naming their origin and the reason.

    ``send()`` never blocks: it queues the record for a writer thread of its own, so a broker
    that is slow or down, or a topic that is missing, never holds up the decode op that found
    the record. ``on_done(partition, offset)`` is called only once the broker acknowledged the
    write: only then does the source record count as done for committing. A write that fails
    (including after the producer's own retries, or a send that cannot get the topic's
    metadata within ``max_block_ms``) with a retriable error leaves the record not done, so the
    commit point stays below it; it is reported through ``on_failure`` and retried, 1 s
    doubling to 30 s, for as long as the writer runs. Good records keep training meanwhile.

    A dead letter always advances. A write refused for good (:func:`is_permanent`: too large
    for the dead-letter topic, invalid) is reported through ``on_failure`` and replaced by a
    header-only letter: an empty value, the origin and reason headers, the record's size
    (``HEADER_ORIGINAL_SIZE``) and the error's name (``HEADER_ERROR``); once that is written the
    record is done. Retrying the whole letter could never succeed and would hold the source
    partition's commit point below it forever, so its good records would be trained again on
    every pass. If even the header-only letter is refused for good, the record is logged at
    ERROR, counted (``lost`` and ``on_failure``) and treated as done all the same (``on_done``
    is called): it is in no dead-letter topic, but the partition never freezes.

    ``max_message_bytes`` is the dead-letter topic's ``max.message.bytes`` (None: unknown):
    the producer's ``max_request_size`` is sized to it (plus headroom, at least 1 MiB), so a
    letter the topic can take is sent, and one well beyond it is refused by the producer
    before it crosses the network (the broker refuses those just beyond it).
    ``max_record_bytes``, the largest record the source topic holds (its
    ``max.message.bytes``), sizes the backlog to hold two such records.

    ``reader`` (a ``SourceReader``) reads each letter's record back from the source topic
    before it is written, so the letter is the original record: key, value (a tombstone's
    None), headers, with ours (``HEADER_*``) after theirs. Without one a letter is the value
    given, with our headers only. A record the source no longer holds is written with the
    value given, or header-only (``HEADER_ERROR`` ``SourceRecordGone``) where none was given;
    a read that fails is retried like a write. A header-only letter keeps the key and drops
    the original headers (they may be what made the letter too large).

    Memory is bounded: records waiting to be written hold at most ``max_backlog_bytes``; a
    record that does not fit is not taken (``on_failure`` gets ``DeadLetterBacklogFull``) and
    stays not done: the commit point stays below it and it is read again after a restart.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        on_done: Done,
        on_failure: Callable[[BaseException], None] | None = None,
        security: dict[str, Any] | None = None,
        producer_factory: Callable[..., Any] | None = None,
        max_backlog_bytes: int = 64 * 1024 * 1024,
        max_block_ms: int = 5_000,
        max_message_bytes: int | None = None,
        max_record_bytes: int | None = None,
        reader: SourceReader | None = None,
    ) -> None:
        factory = producer_factory or new_producer
        self.topic = topic
        self._reader = reader
        largest = max(max_message_bytes or 0, max_record_bytes or 0)
        # A backlog smaller than one record would refuse it on every pass: a frozen partition.
        self.max_backlog_bytes = max(max_backlog_bytes, 2 * largest)
        max_request_size = (
            max(max_message_bytes + _REQUEST_HEADROOM, 1024 * 1024)
            if max_message_bytes
            else _DEFAULT_MAX_REQUEST
        )
        self._on_done = on_done
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._new: collections.deque[_Letter] = collections.deque()
        self._retry: list[_Letter] = []  # a heap by due time
        self._seq = itertools.count()
        self._backlog_bytes = 0
        self._waiting: set[tuple[str, int, int]] = set()  # (topic, partition, offset) taken
        self._closing = False
        self.pending = 0  # taken and not yet acknowledged: queued, retrying or in flight
        self.written = 0
        self.failed = 0  # failed attempts (a record retried three times counts three)
        self.refused = 0  # records not taken: the backlog was full
        self.header_only = 0  # letters refused whole for good, written without their value
        self.lost = 0  # records whose header-only letter was refused too: done, not written
        self._failures_unlogged = 0
        self._logged_at = -1e9
        #: Rate limits of the header-only and lost log lines: kind -> (last logged, unlogged).
        self._log_limits: dict[str, tuple[float, int]] = {}
        self._config: dict[str, Any] = dict(
            bootstrap_servers=bootstrap_servers,
            client_id="streamer-dead-letter",
            retries=5,  # acks=all, not idempotent: consumers.producer.PRODUCER_DEFAULTS
            linger_ms=20,
            max_block_ms=max_block_ms,
            request_timeout_ms=10_000,
            delivery_timeout_ms=15_000,
            max_request_size=max_request_size,
            **(security or {}),
        )
        self._factory = factory
        self._producer: Any = factory(**self._config)
        #: Set by a failed write: the next write uses a new producer (see _fresh_producer).
        self._renew = False
        self._thread = threading.Thread(target=self._run, name="streamer-dead-letter", daemon=True)
        self._thread.start()

    # ---- the decode side (never blocks) ---------------------------------------------------

    def send(
        self, value: bytes | None, source_topic: str, partition: int, offset: int, reason: str
    ) -> None:
        """Queue one record; returns at once. ``value`` None: the record is read back from the
        source (a skipped step's records: only their coordinates are known; needs a reader).

        A record already waiting is not queued again: a new pass reads it again (the commit
        point stayed below it) while its first write is retried; that write's ``on_done``
        makes it done then.
        """
        if value is None and self._reader is None:
            raise ValueError("a letter without its value needs a reader of the source topic")
        key = (source_topic, partition, offset)
        size = len(value or b"")
        with self._cond:
            if key in self._waiting:
                return
            if self._closing or self._backlog_bytes + size > self.max_backlog_bytes:
                self.refused += 1
                refused = True
            else:
                refused = False
                self._waiting.add(key)
                self._backlog_bytes += size
                self.pending += 1
                self._new.append(
                    _Letter(
                        0.0, next(self._seq), value, source_topic, partition, offset, reason, size
                    )
                )
                self._cond.notify_all()
        if refused:
            self._report(
                DeadLetterBacklogFull(
                    f"{self.max_backlog_bytes} bytes of dead letters are waiting to be written"
                ),
                f"{source_topic}/{partition}@{offset}",
            )

    def send_held(
        self, source_topic: str, partition: Any, offset: Any, reason: str = REASON_NONFINITE_STEP
    ) -> None:
        """Queue records known by their coordinates only (arrays of partitions and offsets:
        a skipped step's batch); each is read back from the source before it is written."""
        for p, o in zip(partition.tolist(), offset.tolist(), strict=True):
            self.send(None, source_topic, int(p), int(o), reason)

    # ---- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    letter = None if self._closing else self._next_due()
                    while letter is None:
                        if self._closing:
                            return
                        wait = self._retry[0].due - time.monotonic() if self._retry else None
                        self._cond.wait(wait if wait is None else max(wait, 0.0))
                        letter = None if self._closing else self._next_due()
                if self._reader is not None and not letter.looked_up:
                    group = self._look_up_group(letter)
                    try:
                        self._look_up(group)
                    except Exception as exc:  # the broker is down: the letters wait a retry
                        self._read_failed(group, exc)
                        continue
                self._write(letter)
        finally:
            # The reader is this thread's: closed here, never under a read in progress.
            if self._reader is not None:
                self._reader.close()

    def _look_up_group(self, letter: _Letter) -> list[_Letter]:
        """``letter`` and the letters queued for the same partition that were not read back
        yet, at most ``_LOOK_UP_MAX`` (one read for a skipped step's batch). Those waiting for
        a retry of a failed read come along: they are queued again to be written."""
        with self._cond:

            def same(other: _Letter) -> bool:
                return (
                    not other.looked_up
                    and other.partition == letter.partition
                    and other.topic == letter.topic
                )

            pulled = [other for other in self._retry if same(other)]
            if pulled:
                taken = {id(other) for other in pulled}
                self._retry = [other for other in self._retry if id(other) not in taken]
                heapq.heapify(self._retry)
                self._new.extend(pulled)
            others = (other for other in self._new if same(other))
            return [letter, *itertools.islice(others, _LOOK_UP_MAX - 1)]

    def _look_up(self, group: list[_Letter]) -> None:
        """Read the records of ``group`` (letters of one partition) back from the source."""
        reader = self._reader
        assert reader is not None
        found = reader.read(group[0].partition, [other.offset for other in group])
        with self._cond:
            for other in group:
                other.looked_up = True
                original = found.get(other.offset)
                if original is not None:
                    other.original = original
                    other.value = original.value
                elif other.value is None:
                    other.value, other.error = b"", GONE
                size = len(other.value or b"")
                self._backlog_bytes += size - other.size
                other.size = size

    def _next_due(self) -> _Letter | None:
        """The next letter to write (caller holds the lock): new ones first, then due retries."""
        if self._new:
            return self._new.popleft()
        if self._retry and self._retry[0].due <= time.monotonic():
            return heapq.heappop(self._retry)
        return None

    def _fresh_producer(self) -> bool:
        """After a failed write, replace the producer; False if no new one could be made.

        A new producer starts from fresh metadata (a topic created again under its name:
        ``consumers.producer``).
        """
        if not self._renew:
            return True
        try:
            producer = self._factory(**self._config)
        except Exception as exc:  # the broker is down: the letter waits for the next try
            log.debug("dead-letter producer not recreated: %r", exc)
            return False
        old, self._producer, self._renew = self._producer, producer, False
        try:
            old.close(timeout=0)  # its unfinished writes fail and are retried on the new one
        except Exception as exc:
            log.debug("closing the old dead-letter producer: %r", exc)
        return True

    def _write(self, letter: _Letter) -> None:
        if not self._fresh_producer():
            self._failed(letter, RuntimeError("no dead-letter producer (broker unreachable?)"))
            return
        original = letter.original
        headers = list(original.headers) if original is not None and letter.error is None else []
        headers += [
            (HEADER_TOPIC, letter.topic.encode()),
            (HEADER_PARTITION, str(letter.partition).encode()),
            (HEADER_OFFSET, str(letter.offset).encode()),
            (HEADER_REASON, letter.reason.encode()),
        ]
        if original is not None:
            headers.append((HEADER_TIMESTAMP, str(original.timestamp).encode()))
        if letter.error is not None:
            if letter.original_size is not None:
                headers.append((HEADER_ORIGINAL_SIZE, str(letter.original_size).encode()))
            headers.append((HEADER_ERROR, letter.error.encode()))
        key = original.key if original is not None else None
        value = letter.value
        if value is None and key is None:
            value = b""  # a producer cannot write a record with neither: an empty value
        try:
            # Blocks up to max_block_ms while the topic's metadata is unknown (missing topic,
            # broker down): this thread's time, never a decode op's.
            future = self._producer.send(self.topic, key=key, value=value, headers=headers)
        except Exception as exc:
            self._failed(letter, exc)
            return
        future.add_callback(lambda _meta: self._written(letter))
        future.add_errback(lambda exc: self._failed(letter, exc))

    def _read_failed(self, group: list[_Letter], exc: BaseException) -> None:
        """The records of ``group`` could not be read back (the broker is down): every letter
        of it waits for the same retry (a read each would wait its own timeout first)."""
        with self._cond:
            for other in group:
                with contextlib.suppress(ValueError):  # the first one is off the queue
                    self._new.remove(other)
                other.attempts += 1
                other.due = time.monotonic() + min(_MAX_RETRY_S, 2.0 ** (other.attempts - 1))
                heapq.heappush(self._retry, other)
            self.failed += 1
            self._cond.notify_all()
        self._report(
            exc, f"{group[0].topic}/{group[0].partition}@{group[0].offset} (reading it back)"
        )

    def _written(self, letter: _Letter) -> None:
        with self._cond:
            self.pending -= 1
            self.written += 1
            self._backlog_bytes -= letter.size
            self._waiting.discard((letter.topic, letter.partition, letter.offset))
            self._cond.notify_all()
        self._on_done(letter.partition, letter.offset)

    def _failed(self, letter: _Letter, exc: BaseException) -> None:
        if is_permanent(exc):
            self._refused_for_good(letter, exc)
            return
        with self._cond:
            self._renew = True
            self.failed += 1
            letter.attempts += 1
            letter.due = time.monotonic() + min(_MAX_RETRY_S, 2.0 ** (letter.attempts - 1))
            heapq.heappush(self._retry, letter)
            self._cond.notify_all()
        self._report(exc, f"{letter.topic}/{letter.partition}@{letter.offset}")

    def _refused_for_good(self, letter: _Letter, exc: BaseException) -> None:
        """The broker (or the producer's own check) will never take this letter.

        A whole letter is queued again as a header-only letter; a header-only letter that is
        refused too is given up: counted, logged at ERROR and made done, so that its source
        partition's commit point moves on.
        """
        where = f"{letter.topic}/{letter.partition}@{letter.offset}"
        error = type(exc).__name__
        if letter.error is None:
            size = len(letter.value or b"")
            with self._cond:
                self.header_only += 1
                self._backlog_bytes -= letter.size
                letter.original_size, letter.error, letter.value = size, error, b""
                letter.size = 0
                if letter.original is not None:  # only its key is written: hold no more
                    letter.original = dataclasses.replace(letter.original, value=None, headers=[])
                letter.attempts, letter.due = 0, 0.0
                self._new.append(letter)
                self._cond.notify_all()
            if self._on_failure is not None:
                self._on_failure(exc)
            count = self._may_log("header_only")
            if count:
                log.warning(
                    "dead-letter topic %r refused the letter of %s (%d bytes) for good (%s; %d "
                    "such letters since the last message): writing it without its value, with "
                    "headers %s and %s; raise the topic's max.message.bytes if it was too large",
                    self.topic,
                    where,
                    size,
                    error,
                    count,
                    HEADER_ORIGINAL_SIZE,
                    HEADER_ERROR,
                )
            return
        with self._cond:
            self.lost += 1
            self.pending -= 1
            self._waiting.discard((letter.topic, letter.partition, letter.offset))
            self._cond.notify_all()
        if self._on_failure is not None:
            self._on_failure(exc)
        count = self._may_log("lost")
        if count:
            log.error(
                "dead-letter topic %r refused even the header-only letter of %s for good (%s; "
                "%d such records since the last message): the record is in no dead-letter "
                "topic and counts as done, so that its partition's commits move on; check the "
                "topic's configuration (max.message.bytes)",
                self.topic,
                where,
                error,
                count,
            )
        self._on_done(letter.partition, letter.offset)

    def _may_log(self, kind: str) -> int:
        """Occurrences of ``kind`` to log now (0: not now): the first at once, then one line per
        10 s with the count since the last."""
        now = time.monotonic()
        with self._cond:
            logged_at, unlogged = self._log_limits.get(kind, (-1e9, 0))
            unlogged += 1
            if now - logged_at < _LOG_EVERY_S:
                self._log_limits[kind] = (logged_at, unlogged)
                return 0
            self._log_limits[kind] = (now, 0)
            return unlogged

    def _report(self, exc: BaseException, where: str) -> None:
        """Count a failure; log the first at once, then one line per 10 s with a count."""
        if self._on_failure is not None:
            self._on_failure(exc)
        now = time.monotonic()
        with self._cond:
            self._failures_unlogged += 1
            if now - self._logged_at < _LOG_EVERY_S:
                return
            count, self._failures_unlogged = self._failures_unlogged, 0
            self._logged_at = now
            waiting = self.pending
        log.error(
            "dead-letter write to %r failed (%s, e.g. for %s; %d failures since the last "
            "message); %d records wait, uncommitted, and are retried; training goes on",
            self.topic,
            type(exc).__name__,
            where,
            count,
            waiting,
        )

    # ---- lifecycle ------------------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every taken record was written; False if some still wait at ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Try to write what waits for up to ``timeout`` seconds, then stop.

        Records still unwritten stay not done: the commit point is below them and they are
        read (and dead-lettered) again after a restart.
        """
        done = self.flush(timeout)
        with self._cond:
            self._closing = True
            waiting = self.pending
            self._cond.notify_all()
        self._thread.join(timeout)
        if not done:
            log.warning(
                "%d dead letters for %r were not written before the stop; their records stay "
                "uncommitted and are read again after a restart",
                waiting,
                self.topic,
            )
        self._producer.close(timeout=min(timeout, 5.0) if not done else timeout)
