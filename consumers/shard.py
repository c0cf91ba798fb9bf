"""Shard: one Kafka consumer on one poller thread: poll → bounded queue of blocks → commits.

The consumer is a client adapter (``consumers.clients``): every library-specific line lives
there. The shard is the flow: open (waiting for the broker and the topic), poll blocks into a
``BlockQueue``, pause partitions when it is full, apply commit requests, follow rebalances
(what is dropped, what is committed, where a returning partition starts again), and repair
what a client leaves broken (a rejoin that never completes, a deleted topic).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from consumers.block import RecordBlock
from consumers.clients import open_client
from consumers.clients.base import (
    ConsumerClient,
    GroupCommit,
    NoCommittedOffset,
    OffsetsOutOfRange,
    RetriableClientError,
)
from consumers.commits import CommitBook
from consumers.coverage import Coverage
from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    FencedError,
    OffsetResetError,
    ShardFailedError,
    StreamerError,
    TopicNotFoundError,
)
from consumers.group import Barrier, RejoinWatch
from consumers.hooks import Claim, ShardHooks
from consumers.queue import BlockQueue, lowest_offsets
from consumers.settings import ConsumerSettings
from consumers.types import KafkaErrorType

__all__ = ["Shard"]

log = logging.getLogger(__name__)

ClientFactory = Callable[[ConsumerSettings, int], ConsumerClient]

_MISSING_TOPIC_LOG_S = 30.0
#: How long a full queue holds the poller before it pauses its partitions (see
#: ``Shard._apply_backpressure``): a rebalance callback waits at most this long for the poll
#: that serves it. Never more than a quarter of ``max_poll_interval_ms``.
HOLD_SECONDS = 1.0
_missing_topic_logged: dict[str, float] = {}
_missing_topic_lock = threading.Lock()


def _missing_topic_notice(topic: str) -> bool:
    """True at most once per 30 s per topic: all shards of a process share one WARNING."""
    now = time.monotonic()
    with _missing_topic_lock:
        last = _missing_topic_logged.get(topic)
        if last is not None and now - last < _MISSING_TOPIC_LOG_S:
            return False
        _missing_topic_logged[topic] = now
        return True


class _Rebalance:
    """The shard as its client's ``RebalanceListener``."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard

    def assigned(
        self, partitions: list[int], group: dict[int, GroupCommit] | None = None
    ) -> dict[int, int]:
        return self._shard._on_assigned(partitions, group)

    def revoked(self, partitions: list[int], *, lost: bool) -> None:
        self._shard._on_revoked(partitions, lost=lost)


class Shard:
    """One consumer shard: a poller thread fills a bounded queue of RecordBlocks.

    >>> shard = Shard(settings, shard_index=0, num_shards=2)   # doctest: +SKIP
    >>> shard.start()  # doctest: +SKIP
    >>> block = shard.get(timeout=1.0)      # a RecordBlock, or None when nothing came  # doctest: +SKIP
    >>> shard.commit({0: block.next_offsets()[0]})  # doctest: +SKIP
    >>> shard.close()  # doctest: +SKIP

    The poller never stops serving the client for long, however slowly blocks are taken, so a
    slow consumer never exceeds ``max_poll_interval_ms``; when ``queue_max_blocks`` blocks
    wait it first holds (does not poll, for at most ``HOLD_SECONDS``: the client keeps what
    it prefetched) and then pauses its partitions instead of buffering more. Commits are
    applied by the poller thread.
    """

    def __init__(
        self,
        settings: ConsumerSettings,
        shard_index: int,
        num_shards: int,
        *,
        hooks: ShardHooks | None = None,
        barrier: Barrier | None = None,
        client_factory: ClientFactory = open_client,
    ) -> None:
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index {shard_index} not in [0, {num_shards})")
        self.settings = settings
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.hooks = hooks or ShardHooks()
        self._open_client = client_factory
        self._barrier = barrier if settings.mode == "group" else None
        self._joined = self._barrier is None
        #: A static shard (replay, --partitions) has its partitions once its consumer has
        #: connected and assigned them: until then it is not idle, it is still joining.
        self._assigning = settings.mode != "group"
        self._topic = settings.topic
        self._queue = BlockQueue(settings.queue_max_blocks)
        #: The queue's lock guards the assignment state below too: a revocation drops queued
        #: blocks and asks the owner for its commit point in one step (see consumers.queue).
        self._lock = self._queue.lock
        self._assigned_set: set[int] = set()
        self._book = CommitBook(
            shard_index, self.hooks, self._lock, owned=lambda: self._assigned_set
        )
        self._paused_count = 0
        self._full_since: float | None = None  # when the queue filled (holding), else None
        self._hold_seconds = min(HOLD_SECONDS, settings.max_poll_interval_ms / 4000)
        self._rewind: dict[int, int] = {}
        #: Per partition, the first offset emitted since it was assigned: with no commit point
        #: from the owner at revoke, the lowest offset that may not have been trained.
        self._first_emitted: dict[int, int] = {}
        #: Counts assignments and revocations. Blocks carry the serial they were polled under,
        #: so records polled before a rebalance are never taken for records polled after it.
        self.serial = 0
        #: Seeks made by assignments during the current poll() (see _drop_across_rebalance).
        self._sought: dict[int, int] = {}
        #: How far records (or ends) were handed over since assignment or a seek.
        self._coverage = Coverage()
        self._started: dict[int, int] = {}  # sought at assignment, nothing handed over yet
        self._position: dict[int, int] = {}
        self._unseeded: set[int] = set()  # assigned, the group's commit not read yet
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._client: ConsumerClient | None = None
        self._closed = False
        self._watch = RejoinWatch(stuck_after_seconds=settings.session_timeout_ms / 1000 + 10.0)
        #: True while the topic does not exist (deleted mid-stream, or not created again yet).
        self._topic_missing = False
        self.last_record_monotonic = time.monotonic()
        self.last_rebalance_monotonic = time.monotonic()
        self.records_polled = 0

    # ---- the owner's side --------------------------------------------------------------------

    def start(self) -> Shard:
        """Start the poller thread; it creates the consumer and then polls.

        A broker that cannot be reached is retried with backoff (1 s doubling to 30 s) for as
        long as the shard is open: a pass that starts during an outage waits for the broker
        instead of failing. Errors that retrying cannot fix (authentication, bad settings)
        fail the shard: ``get()`` raises ShardFailedError with them as the cause.
        """
        self._thread = threading.Thread(
            target=self._run, name=f"streamer-shard-{self.shard_index}", daemon=True
        )
        self._thread.start()
        return self

    def get(self, timeout: float, claim: Claim | None = None) -> RecordBlock | None:
        """The next block, or None after ``timeout`` seconds. Raises ShardFailedError if the poller died.

        ``claim`` (the owner registering the block's records as in flight) runs under the
        lock that revocation takes: a block is either claimed before its partitions are
        revoked, so the owner's commit point at revoke accounts for it, or it is dropped
        with the queue. The block returned is what ``claim`` returned.
        """
        block = self._queue.get(
            timeout, claim, ended=lambda: self._error is not None or self._stop.is_set()
        )
        if block is None and self._error is not None:
            raise ShardFailedError(self.shard_index, self._error)
        return block

    def commit(self, offsets: dict[int, int]) -> None:
        """Ask the poller to commit {partition: next offset}; only owned partitions are sent.

        Requests at or below what is known committed are dropped, so an owner may send every
        commit point each time (none is lost to a rebalance in between) at no cost.
        """
        if offsets and self.settings.commits:  # a group-less consumer never commits
            self._book.request(offsets)

    @property
    def assigned(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._assigned_set)

    @property
    def topic_missing(self) -> bool:
        """True while the topic does not exist (deleted, or not created yet): not ready."""
        return self._topic_missing

    def _set_topic_missing(self, missing: bool) -> None:
        if missing != self._topic_missing:
            self._topic_missing = missing
            self.hooks.on_topic_missing(self.shard_index, missing)

    @property
    def joining(self) -> bool:
        """True while the shard waits for the group: its pass's join, or a rebalance under way.

        The pass's idle timeout does not run meanwhile: a shard without a stable assignment
        is waiting for the group, not for records.
        """
        return not self._joined or self._assigning or self._watch.unstable

    @property
    def queued_records(self) -> int:
        return self._queue.queued_records

    @property
    def failed(self) -> BaseException | None:
        return self._error

    def close(self, timeout: float = 10.0) -> None:
        """Stop polling, commit what was requested (synchronously), close the consumer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._queue.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("shard %d: poller did not stop within %.1fs", self.shard_index, timeout)
        client = self._client
        if client is not None:
            try:
                # A commit for a topic that is gone is retried every 100 ms until the timeout.
                if self._error is None and client.topic_partitions() is not None:
                    self.flush_commits(int(timeout * 1000))
            except Exception as exc:  # the commit is also retried by the next pass / checkpoint
                log.warning("shard %d: final commit failed: %s", self.shard_index, exc)
            finally:
                client.close(int(timeout * 1000))
        self._queue.clear()

    # ---- ShardContext (what the client's upkeep may ask) -----------------------------------

    def flush_commits(self, timeout_ms: int) -> None:
        """Send the waiting commit requests synchronously (raises on failure)."""
        self._flush_commits(sync=True, timeout_ms=timeout_ms)

    def report_error(self, kind: KafkaErrorType, exc: BaseException) -> None:
        self.hooks.on_error(kind, exc)

    # ---- the poller thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                client = self._open()
                if client is None or not self._poll_loop(client):
                    break
        except BaseException as exc:
            if not isinstance(exc, StreamerError):
                log.error("shard %d: poller failed: %r", self.shard_index, exc)
            self._error = exc
        finally:
            self._queue.wake()

    def _open(self) -> ConsumerClient | None:
        """Create, subscribe or assign the consumer; None if stopped first.

        Retries while no broker answers, and waits while the topic does not exist (deleted,
        or not created again yet): backoff 1 s doubling to 30 s, one WARNING per topic at
        most every 30 s (``_missing_topic_notice``), the poller reported alive at every check.
        """
        backoff = 1.0
        while not self._stop.is_set():
            client: ConsumerClient | None = None
            try:
                client = self._open_client(self.settings, self.shard_index)
                # Fetch the topic's metadata first: a group leader without it assigns nothing
                # and the group only rebalances again at the next metadata refresh (minutes).
                # A static member that rejoins gets its old assignment back from the
                # coordinator even when the topic is gone: never subscribe to a missing topic.
                exists = client.topic_partitions(refresh=True)
            except (BrokerUnavailableError, RetriableClientError) as exc:
                # No broker answers, or the one asked for the topic's metadata did not (a
                # node down in a cluster): a new try, the others answer.
                if client is not None:
                    client.close(5000)
                self.hooks.on_error("connection", exc)
                log.warning("shard %d: %s; retrying in %.0fs", self.shard_index, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            parts: list[int] = []
            try:
                if not exists:
                    client.close(5000)
                    self._wait_for_topic(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                if self.settings.mode == "group":
                    client.subscribe(_Rebalance(self))
                else:
                    parts = self.settings.static_partitions(self.shard_index, self.num_shards)
                    self._client = client  # for _on_assigned; published for good below
                    client.assign(parts, self._on_assigned(parts))
                    self._assigning = False
            except BaseException:
                client.close(5000)
                raise
            with self._lock:
                if self._closed:  # close() gave up waiting for us: do not leak the consumer
                    client.close(5000)
                    return None
                self._client = client
            if self.topic_missing:
                self._set_topic_missing(False)
                log.warning(
                    "shard %d: topic %r exists again; consuming it", self.shard_index, self._topic
                )
            return client
        return None

    def _wait_for_topic(self, backoff: float) -> None:
        """The topic does not exist: say so (rate-limited), stay live, wait ``backoff`` s."""
        if not self.topic_missing:
            self._set_topic_missing(True)
            self.hooks.on_error("topic_missing", TopicNotFoundError(self._topic))
        level = logging.WARNING if _missing_topic_notice(self._topic) else logging.DEBUG
        log.log(
            level,
            "shard %d: topic %r does not exist (deleted?); not consuming, checking again in %.0fs",
            self.shard_index,
            self._topic,
            backoff,
        )
        self.hooks.on_poll(self.shard_index, 0, 0, {}, {})  # the poller is alive, not stuck
        self._stop.wait(backoff)

    def _poll_loop(self, client: ConsumerClient) -> bool:
        """Poll until stopped (False) or until the consumer must be replaced (True: closed)."""
        timeout_ms = self.settings.poll_timeout_ms
        backoff = 0.1
        while not self._stop.is_set():
            if not self._joined:
                self._check_joined(client)
            holding = self._apply_backpressure(client)
            self._flush_commits(sync=False)
            if holding:
                continue
            with self._lock:
                serial = self.serial
                self._sought.clear()
            try:
                client.before_poll()
                block = client.poll(timeout_ms, serial)
            except NoCommittedOffset as exc:
                self._reset_positions(client, exc.partitions, {})
                continue
            except OffsetsOutOfRange as exc:
                self._reset_positions(client, list(exc.offsets), exc.offsets)
                continue
            except RetriableClientError as exc:
                self.hooks.on_error("connection", exc)
                log.warning("shard %d: %s, retrying in %.1fs", self.shard_index, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except FencedError as exc:
                self.hooks.on_error("fenced", exc)
                raise
            except AuthenticationError as exc:
                self.hooks.on_error("authentication", exc)
                raise
            backoff = 0.1
            for refused in client.refused_batches():  # the client's position is past each
                log.error("shard %d: %s", self.shard_index, refused)
                self.hooks.on_error("batch_refused", StreamerError(str(refused)))
            self._emit(client, block, serial)
            stable = client.stable_offsets()
            if stable:
                self.hooks.on_stable_offsets(self.shard_index, stable)
            if self._unseeded:
                self._read_group_commits(client)
            if self._rejoin_stuck(client):
                self._discard_client(client, forget_offsets=False)
                return True
            client.upkeep(self)
            if not self._stop.is_set() and client.topic_gone():
                self._drop_topic(client)
                return True
        return False

    # ---- records -----------------------------------------------------------------------------

    def _emit(self, client: ConsumerClient, block: RecordBlock | None, serial: int) -> None:
        # Read before the serial check: positions read after a rebalance that the check
        # missed would belong to the new assignment.
        positions = client.positions()
        if serial != self.serial:
            if block is not None:
                self._drop_across_rebalance(client, block)
                block = None
            positions = {}  # of another assignment: the next poll reports them
        last = block.next_offsets() if block is not None else {}
        firsts = lowest_offsets(block, set(last)) if block is not None else {}
        highwater = client.highwaters()
        with self._lock:
            for p, first in firsts.items():
                self._first_emitted.setdefault(p, first)
                self._started.pop(p, None)
            owned = self._assigned_set
            ends = self._coverage.ends(
                {p: o for p, o in last.items() if p in owned},
                {p: o for p, o in positions.items() if p in owned},
            )
            for p, off in positions.items():
                if p in self._assigned_set:
                    self._position[p] = off
            for p, off in last.items():
                self._position[p] = max(off, self._position.get(p, off))
            if block is not None or ends:
                if block is None:
                    block = RecordBlock.from_columns(self._topic, [], [], [], [], serial)
                if ends:
                    block.ends.update(ends)
                revoked = set(block.partitions()) - self._assigned_set
                if revoked:  # a rebalance raced the poll: never queue records we no longer own
                    for p, off in lowest_offsets(block, revoked).items():
                        self._rewind[p] = min(off, self._rewind.get(p, off))
                    block = block.without_partitions(revoked)
                if block is not None:
                    self._queue.put(block)
            position = dict(self._position)
        if block is not None and len(block):
            self.records_polled += len(block)
            self.last_record_monotonic = time.monotonic()
        self.hooks.on_poll(
            self.shard_index,
            len(block) if block is not None else 0,
            block.nbytes if block is not None else 0,
            highwater,
            position,
        )

    def _drop_across_rebalance(self, client: ConsumerClient, block: RecordBlock) -> None:
        """A rebalance ran while ``poll()`` did: drop what it returned and fetch it again.

        Records fetched before a revocation may come back from the same ``poll()`` call as the
        assignment that followed it, after any seek the assignment made. Rather than tell them
        apart, drop all of them: partitions still assigned are sought back to their first
        offset here (the poller owns the consumer), the others are rewound if they return.
        """
        with self._lock:
            owned = set(self._assigned_set)
            for p, low in lowest_offsets(block, set(block.partitions())).items():
                if p in owned:
                    # Never past a seek the assignment made (a rewind or a checkpoint).
                    client.seek(p, min(low, self._sought.get(p, low)))
                    self._coverage.forget(p)
                else:
                    self._rewind[p] = min(low, self._rewind.get(p, low))
        log.debug("shard %d: dropped a poll that raced a rebalance", self.shard_index)

    def _reset_positions(
        self, client: ConsumerClient, partitions: list[int], out_of_range: dict[int, int]
    ) -> None:
        """Apply auto_offset_reset: quietly without a committed offset, loudly when out of range."""
        policy = self.settings.auto_offset_reset
        for p, offset in out_of_range.items():
            log.error(
                "shard %d: offset %d of %s partition %d is out of range (deleted by retention "
                "before it was trained?): records were lost upstream; applying "
                "auto_offset_reset=%s",
                self.shard_index,
                offset,
                self._topic,
                p,
                policy,
            )
            self.hooks.on_error("offset_out_of_range", OffsetResetError(self._topic, [p], True))
        if not partitions:
            return
        if policy == "none":
            raise OffsetResetError(self._topic, partitions, bool(out_of_range))
        with self._lock:
            for p in partitions:
                self._coverage.forget(p)
        client.seek_to(partitions, policy)

    # ---- flow control ------------------------------------------------------------------------

    def _apply_backpressure(self, client: ConsumerClient) -> bool:
        """Hold, pause or resume by the queue's fill; True: do not poll in this round.

        A full queue first holds the poller (no ``poll()``, for at most ``HOLD_SECONDS`` at a
        time, well inside ``max_poll_interval_ms``): the client keeps what it prefetched
        (librdkafka's queue is bounded by ``queued.max.messages.kbytes``, kafka-python's by the
        fetches in flight), and the next poll hands it over at once. A pause makes both clients
        drop their prefetch and fetch it again after the resume (confluent-kafka about a second
        later): with 8 blocks of room that halved the confluent pipeline. A queue still full
        after the hold (a checkpoint, an evaluation, a slow step) pauses as before, so the
        client keeps serving rebalances and the group while the consumer is slow.
        """
        # Reconcile with the client's own pause flags every loop: kafka-python keeps a
        # partition's paused flag (and position) across a rebalance that leaves it with us.
        # Pause when full after the hold, resume when half empty (``BlockQueue.low``).
        paused = client.paused()
        if self._queue.full and self._joined and not paused:
            now = time.monotonic()
            if self._full_since is None:
                self._full_since = now
            left = self._hold_seconds - (now - self._full_since)
            if left > 0:
                poll_seconds = self.settings.poll_timeout_ms / 1000
                if not self._queue.wait_for_room(min(left, poll_seconds)):
                    return True
        if not self._queue.full:
            self._full_since = None
        hold = self._queue.full or not self._joined or (bool(paused) and not self._queue.low)
        if hold:
            with self._lock:
                todo = sorted(self._assigned_set - paused)
            if todo:
                client.pause(todo)
            count = len(client.paused())
        else:
            if paused:
                client.resume(sorted(paused))
            count = 0
        if count != self._paused_count:
            self._paused_count = count
            self.hooks.on_paused(self.shard_index, count)
        return False

    def _check_joined(self, client: ConsumerClient) -> None:
        assert self._barrier is not None
        self._joined = self._barrier.report(self.shard_index, client.group_state().generation)

    # ---- commits -----------------------------------------------------------------------------

    def _flush_commits(self, *, sync: bool, timeout_ms: int | None = None) -> None:
        commits = self._book.take(force=sync)
        client = self._client
        if commits and client is not None:
            self._book.send(client, commits, sync=sync, timeout_ms=timeout_ms)

    def _read_group_commits(self, client: ConsumerClient) -> None:
        """Report the group's committed offsets of new partitions (outside the rebalance callback).

        The owner's lag figures start from them: a partition that comes back to this worker
        (every pass reassigns) is as far along as the group committed, not at offset 0.
        """
        with self._lock:
            todo = sorted(self._unseeded & self._assigned_set)
            self._unseeded.clear()
        try:
            found = {p: c.offset for p, c in client.committed(todo, 2000).items()} if todo else {}
        except RetriableClientError as exc:  # only a figure: the next assignment reads again
            log.debug("shard %d: %s", self.shard_index, exc)
            return
        self._book.set_committed(found)
        if found:
            self.hooks.on_group_committed(self.shard_index, found)

    # ---- rebalances (possibly on the client's IO thread: block only to hand over) ------------

    def _on_assigned(
        self, partitions: list[int], group: dict[int, GroupCommit] | None = None
    ) -> dict[int, int]:
        """Partitions were assigned; returns where to start them (the client seeks).

        ``group``: the group's committed offsets, read by the client in its callback (None:
        not read); the owner's start rule decides with them (``ShardHooks.on_assigned``).
        """
        self.last_rebalance_monotonic = time.monotonic()
        if not partitions and self.settings.mode == "group" and self._assigned_set:
            return {}  # a cooperative round that gives this member nothing more: no change
        with self._lock:
            self.serial += 1
            # Added to what is kept: all of it with an eager protocol (everything was revoked
            # first), only the partitions that moved with a cooperative one.
            self._assigned_set |= set(partitions)
            self._book.forget(partitions, requests=False)
            for p in partitions:
                self._first_emitted.pop(p, None)
                self._coverage.forget(p)
            if self.settings.mode == "group" and group is None:
                self._unseeded |= set(partitions)  # read after the poll instead
            # A client keeps the position of a partition that comes back to this consumer
            # (kafka-python across an eager rebalance, librdkafka across an incremental
            # unassign and assign): records dropped at revoke must be fetched again. The
            # rewinds of other partitions wait: a cooperative rebalance assigns in steps, and
            # an assignment of nothing is common.
            rewind = {p: self._rewind.pop(p) for p in partitions if p in self._rewind}
        # A static assignment is the configuration itself (evaluation, replay, --partitions).
        log.log(
            logging.INFO if self.settings.mode == "group" else logging.DEBUG,
            "shard %d: assigned partitions %s of %s",
            self.shard_index,
            sorted(partitions),
            self._topic,
        )
        client = self._client
        if not self._joined and partitions and client is not None:
            # Fetching starts inside this very poll(): hold it until all shards have joined.
            client.pause(partitions)
        starts = self.hooks.on_assigned(self.shard_index, partitions, group)
        if group is not None:  # after the owner knows the partitions (its lag starts there)
            committed = {p: c.offset for p, c in group.items()}
            self._book.set_committed(committed)
            if committed:
                self.hooks.on_group_committed(self.shard_index, committed)
        seeks: dict[int, int] = {}
        for p, off in rewind.items():
            if p not in starts:
                log.info(
                    "shard %d: partition %d back after revoke; rewinding to %d",
                    self.shard_index,
                    p,
                    off,
                )
                seeks[p] = off
        for p, off in starts.items():
            if p in partitions:
                log.debug("shard %d: starting partition %d at %d", self.shard_index, p, off)
                seeks[p] = off
        with self._lock:
            for p, off in seeks.items():
                self._sought[p] = min(off, self._sought.get(p, off))
                # Where it starts, until a record of it is handed over: a partition revoked
                # again before that must come back here, not where its client last was.
                self._started[p] = off
        return seeks

    def _on_revoked(self, partitions: list[int], *, lost: bool) -> None:
        """Drop revoked partitions' queued records; commit what the owner says is done.

        The owner's hook runs under the lock that ``get(claim=...)`` takes, so every block is
        either claimed (and in the owner's commit point) or dropped here. A partition that
        comes back to this shard is rewound to the lowest offset that may not be trained:
        the owner's commit point, else the first offset emitted since it was assigned.
        """
        if not partitions:
            return
        if not lost:  # the owner settles what it took of them first (outside our lock)
            self.hooks.on_revoking(self.shard_index, partitions)
        gone = set(partitions)
        with self._lock:
            self.serial += 1
            self._assigned_set -= gone
            for p, off in self._queue.drop(gone).items():
                self._rewind[p] = min(off, self._rewind.get(p, off))
            for p in gone:
                self._position.pop(p, None)
                self._coverage.forget(p)
            if lost:
                log.warning(
                    "shard %d: partitions %s lost (not committing)",
                    self.shard_index,
                    sorted(partitions),
                )
                self.hooks.on_lost(self.shard_index, partitions)
                commits: dict[int, int] = {}
            else:
                log.info("shard %d: partitions %s revoked", self.shard_index, sorted(partitions))
                commits = self.hooks.on_revoked(self.shard_index, partitions)
            known = self._book.forget(gone)
            for p in gone:
                first = self._first_emitted.pop(p, None)
                if first is None:
                    first = self._started.get(p)
                self._started.pop(p, None)
                low = commits.get(p, known.get(p) if p in known and lost else first)
                if low is not None:
                    self._rewind[p] = min(low, self._rewind.get(p, low))
        client = self._client
        if commits and self.settings.commits and not self._closed and client is not None:
            try:
                self._book.send(client, commits, sync=False)
            except Exception as exc:
                log.warning("shard %d: commit on revoke failed: %s", self.shard_index, exc)

    # ---- repairs -----------------------------------------------------------------------------

    def _rejoin_stuck(self, client: ConsumerClient) -> bool:
        """True when this member has not been stable in its group for the watch's limit."""
        if self.settings.mode != "group":
            return False
        verdict = self._watch.observe(client.group_state().stable)
        if verdict == "nudge":
            client.repair_rejoin()
        if verdict != "stuck":
            return False
        log.warning(
            "shard %d: not a stable member of group %r for %.0fs (the client did not "
            "complete the rejoin); recreating its consumer",
            self.shard_index,
            self.settings.group_id,
            self._watch.stuck_after_seconds,
        )
        self.hooks.on_error("rebalance_stuck", TimeoutError("rejoin did not complete"))
        self._watch.reset()
        return True

    def _discard_client(self, client: ConsumerClient, *, forget_offsets: bool) -> None:
        """Drop what the consumer owns as lost (no commit), close it; the poller may reopen."""
        client.detach()
        with self._lock:
            partitions = sorted(self._assigned_set)
        if partitions:
            self._on_revoked(partitions, lost=True)
        with self._lock:
            self._client = None
        try:
            client.close(5000)
        except Exception as exc:  # best effort: the client may be in any state
            log.debug("shard %d: closing the consumer: %r", self.shard_index, exc)
        with self._lock:
            # An assignment that passed the listener just before it was detached.
            late = sorted(self._assigned_set)
        if late:
            self._on_revoked(late, lost=True)
        with self._lock:
            self._unseeded.clear()
            self._paused_count = 0
            if forget_offsets:
                self._book.clear_requests()
                self._rewind.clear()
                self._position.clear()
                self._coverage.clear()

    def _drop_topic(self, client: ConsumerClient) -> None:
        """The topic was deleted: drop its partitions (nothing to commit), close the consumer."""
        with self._lock:
            partitions = sorted(self._assigned_set)
        log.warning(
            "shard %d: topic %r was deleted: dropping partitions %s without committing "
            "(records not trained yet are gone with it); waiting for the topic to exist again",
            self.shard_index,
            self._topic,
            partitions,
        )
        _missing_topic_notice(self._topic)  # the next "does not exist" line waits 30 s
        self._set_topic_missing(True)
        self.hooks.on_error("topic_missing", TopicNotFoundError(self._topic))
        # Offsets of the deleted topic mean nothing for the new one.
        self._discard_client(client, forget_offsets=True)
