"""Shard: one KafkaConsumer on one poller thread, polling RecordBlocks into a bounded queue."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kafka.errors as kerrors
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.structs import MemberState, OffsetAndMetadata

from consumers.block import RecordBlock
from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    FencedError,
    ShardFailedError,
    StreamerError,
    TopicNotFoundError,
)
from consumers.settings import ConsumerSettings

__all__ = ["JoinBarrier", "Shard", "ShardHooks", "open_consumer"]

log = logging.getLogger(__name__)

ConsumerFactory = Callable[..., Any]

_AUTH_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(kerrors, name)
    for name in (
        "AuthenticationFailedError",
        "SaslAuthenticationFailedError",
        "AuthenticationMethodNotSupported",
        "IllegalSaslStateError",
        "UnsupportedSaslMechanismError",
        "TopicAuthorizationFailedError",
        "GroupAuthorizationFailedError",
    )
    if hasattr(kerrors, name)
)
_FENCED_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(kerrors, name) for name in ("FencedInstanceIdError",) if hasattr(kerrors, name)
)


class _RepeatFilter(logging.Filter):
    """Lets an identical WARNING/ERROR record of a logger through at most once per ``every_s``.

    kafka-python refreshes metadata every ``retry_backoff_ms`` (100 ms) while a subscribed
    topic is unknown, and ``kafka.cluster`` logs "Topic ... not found in cluster metadata" at
    ERROR on each refresh; the shard's own WARNING says what happened and what it does.
    Records differ in their arguments: distinct errors still all get through.
    """

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (str(record.msg), repr(record.args))
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < self.every_s:
                return False
            if len(self._seen) > 1000:
                self._seen.clear()
            self._seen[key] = now
        return True


def _install_repeat_filter(logger_name: str) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _RepeatFilter) for f in logger.filters):
        logger.addFilter(_RepeatFilter())


# Also "Group ... failed to commit partition ...": a sync commit for a deleted topic is retried
# every 100 ms until its timeout.
_install_repeat_filter("kafka.cluster")
_install_repeat_filter("kafka.coordinator.consumer")

# How long one call waits for a group (re)join to finish (see Shard._await_join).
_JOIN_WAIT_MS = 3000
#: How long Shard._check_group_assignment waits before asking the broker again.
_GROUP_CHECK_RETRY_S = 30.0
#: read_committed: how often a shard reads its partitions' last stable offsets (for lag), how
#: long one read may take, and how long it waits after a failed one.
_STABLE_EVERY_S = 2.0
_STABLE_TIMEOUT_MS = 500
_STABLE_RETRY_S = 10.0

_MISSING_TOPIC_LOG_S = 30.0
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


def _consumed_positions(consumer: Any, topic: str) -> dict[int, int]:
    """The consumer's position per assigned partition of ``topic``, without a network call.

    ``KafkaConsumer.position()`` may refresh committed offsets and await resets (a network
    round trip); kafka-python's subscription state holds the positions, moved past control
    batches and aborted transactions by the fetcher. Empty if that state is unreadable.
    """
    subscription = getattr(consumer, "_subscription", None)
    try:
        consumed = subscription.all_consumed_offsets() if subscription is not None else {}
    except Exception:  # an internal we read changed: commit points then stop at the last
        return {}  # record (a trailing transaction marker would show as a lag of 1)
    return {tp.partition: int(om.offset) for tp, om in consumed.items() if tp.topic == topic}


class ShardHooks:
    """Callbacks a shard makes into its owner. Every method is optional (no-op by default).

    Rebalance callbacks run on kafka-python's IO thread: they must not block.
    """

    def on_assigned(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        """Partitions were assigned; return {partition: offset} to seek to (e.g. a checkpoint)."""
        return {}

    def on_revoked(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        """Partitions are being revoked; return {partition: next offset} to commit (async)."""
        return {}

    def on_lost(self, shard_index: int, partitions: list[int]) -> None:
        """Partitions were lost without a chance to commit (fenced or evicted)."""

    def on_poll(
        self,
        shard_index: int,
        records: int,
        nbytes: int,
        highwater: dict[int, int],
        position: dict[int, int],
    ) -> None:
        """A poll returned (records may be 0); high watermarks and positions per partition."""

    def on_stable_offsets(self, shard_index: int, offsets: dict[int, int]) -> None:
        """read_committed: the last stable offset per assigned partition (read every few s)."""

    def on_commit(
        self, offsets: dict[int, int], ok: bool, seconds: float, error: str | None
    ) -> None:
        """A commit finished."""

    def on_error(self, kind: str, exc: BaseException) -> None:
        """A Kafka error was seen (kind: connection, authentication, fenced, commit, other, ...)."""

    def on_paused(self, shard_index: int, paused: int) -> None:
        """The number of paused partitions of this shard changed."""

    def on_group_committed(self, shard_index: int, offsets: dict[int, int]) -> None:
        """The group's committed offsets of newly assigned partitions (where this shard starts)."""

    def on_topic_missing(self, shard_index: int, missing: bool) -> None:
        """The topic stopped (True) or started again (False) to exist for this shard."""


def open_consumer(
    settings: ConsumerSettings, shard_index: int, factory: ConsumerFactory = KafkaConsumer
) -> Any:
    """Create a KafkaConsumer for one shard, wrapping client errors in ours (no secrets in them)."""
    cfg = settings.kafka_config(shard_index)
    try:
        return factory(**cfg)
    except (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError) as exc:
        raise BrokerUnavailableError(
            settings.bootstrap_servers, f"timed out after {settings.bootstrap_timeout_ms} ms"
        ) from exc
    except _AUTH_ERRORS as exc:
        raise AuthenticationError(settings.bootstrap_servers, type(exc).__name__) from exc


class JoinBarrier:
    """Holds the shards of one pass paused until all of them joined the same group generation.

    Shards are created one after the other; without this the first one to join is assigned
    every partition, starts fetching, and each later join revokes and re-fetches (a rebalance
    round each). Released once every shard reported the same stable generation for
    ``settle_s`` (a leader that assigned from stale metadata rejoins within a heartbeat), or
    after ``timeout_s`` (another worker may keep the group rebalancing).
    """

    def __init__(self, parties: int, *, settle_s: float = 1.5, timeout_s: float = 30.0) -> None:
        self.parties = parties
        self.settle_s = settle_s
        self._generations: dict[int, int | None] = {}
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + timeout_s
        self._agreed_since: float | None = None
        self.released = False

    def report(self, shard_index: int, generation: int | None) -> bool:
        """Shard ``shard_index`` is stable in ``generation`` (None: rebalancing); True once released."""
        now = time.monotonic()
        with self._lock:
            if self.released:
                return True
            if self._generations.get(shard_index, -2) != generation:
                self._agreed_since = None
            self._generations[shard_index] = generation
            gens = set(self._generations.values())
            if len(self._generations) == self.parties and len(gens) == 1 and None not in gens:
                if self._agreed_since is None:
                    self._agreed_since = now
                elif now - self._agreed_since >= self.settle_s:
                    self.released = True
            if not self.released and now > self._deadline:
                log.warning(
                    "shards did not settle on one group generation in time; starting anyway"
                )
                self.released = True
            return self.released


class _Listener(ConsumerRebalanceListener):
    def __init__(self, shard: Shard) -> None:
        self._shard = shard
        #: Set when the shard discards this listener's consumer: the revocation that
        #: kafka-python reports as it closes the consumer was already handled (as lost).
        self.detached = False

    def on_partitions_revoked(self, revoked: Any) -> None:
        if not self.detached:
            self._shard._revoked([tp.partition for tp in revoked], lost=False)

    def on_partitions_lost(self, lost: Any) -> None:
        if not self.detached:
            self._shard._revoked([tp.partition for tp in lost], lost=True)

    def on_partitions_assigned(self, assigned: Any) -> None:
        if not self.detached:
            self._shard._assigned([tp.partition for tp in assigned])


class Shard:
    """One consumer shard: a poller thread fills a bounded queue of RecordBlocks.

    >>> shard = Shard(settings, shard_index=0, num_shards=2)   # doctest: +SKIP
    >>> shard.start()
    >>> block = shard.get(timeout=1.0)      # a RecordBlock, or None when nothing came
    >>> shard.commit({0: block.next_offsets()[0]})
    >>> shard.close()

    The poller keeps calling ``poll()`` however slowly blocks are taken, so a slow consumer
    never exceeds ``max_poll_interval_ms``; when ``queue_max_blocks`` blocks wait it pauses
    its partitions instead of buffering more. Commits are applied by the poller thread.
    """

    def __init__(
        self,
        settings: ConsumerSettings,
        shard_index: int,
        num_shards: int,
        *,
        hooks: ShardHooks | None = None,
        consumer_factory: ConsumerFactory = KafkaConsumer,
        barrier: JoinBarrier | None = None,
    ) -> None:
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index {shard_index} not in [0, {num_shards})")
        self.settings = settings
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.hooks = hooks or ShardHooks()
        self._factory = consumer_factory
        self._barrier = barrier if settings.mode == "group" else None
        self._joined = self._barrier is None
        self._topic = settings.topic
        self._cond = threading.Condition()
        self._queue: collections.deque[RecordBlock] = collections.deque()
        self._queued_records = 0
        self._commits: dict[int, int] = {}
        self._assigned_set: set[int] = set()
        self._paused_count = 0
        self._rewind: dict[int, int] = {}
        #: Per partition, the first offset emitted since it was assigned: with no commit point
        #: from the owner at revoke, the lowest offset that may not have been trained.
        self._first_emitted: dict[int, int] = {}
        #: Per partition, the offset known committed (our commits, the group's): no commit
        #: request at or below it is sent again.
        self._committed: dict[int, int] = {}
        #: Counts assignments and revocations. Blocks carry the serial they were polled under,
        #: so records polled before a rebalance are never taken for records polled after it.
        self.serial = 0
        #: Seeks made by assignments during the current poll() (see _drop_across_rebalance).
        self._sought: dict[int, int] = {}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._started = threading.Event()
        self._closed = False
        self._position: dict[int, int] = {}
        #: Per partition, the offset up to which records (or ends) were handed over since
        #: the partition was assigned or sought (see _ends).
        self._covered: dict[int, int] = {}
        self._stable_after = 0.0  # when _read_stable_offsets may ask again
        self._unseeded: set[int] = set()
        self._stable = True  # group mode: this member is STABLE (set by the poller)
        self._unstable_since: float | None = None
        self._stuck_after_s = (
            settings.session_timeout_ms / 1000 + 10.0
        )  # assigned partitions whose group commit is not read yet
        self._commit_failures = 0
        self._commit_warned_at = -1e9
        self._missing_since: tuple[float, int] | None = None  # (when, metadata refresh) of a gap
        #: True while the topic does not exist (deleted mid-stream, or not created again yet).
        self._topic_missing = False
        self._listener: _Listener | None = None
        #: The topic's partitions (this consumer's metadata) the group's assignment was last
        #: found to match, and when _check_group_assignment may ask the broker again.
        self._group_checked: frozenset[int] | None = None
        self._group_check_after = 0.0
        self.last_record_monotonic = time.monotonic()
        self.last_rebalance_monotonic = time.monotonic()
        self.records_polled = 0

    # ---- owner side -------------------------------------------------------------------------

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

    def _open(self) -> Any:
        """Create, subscribe or assign the consumer; None if stopped first.

        Retries while no broker answers, and waits while the topic does not exist (deleted,
        or not created again yet): backoff 1 s doubling to 30 s, one WARNING per topic at
        most every 30 s (``_missing_topic_notice``), the poller reported alive at every check.
        """
        backoff = 1.0
        while not self._stop.is_set():
            try:
                consumer = open_consumer(self.settings, self.shard_index, self._factory)
            except BrokerUnavailableError as exc:
                self.hooks.on_error("connection", exc)
                log.warning("shard %d: %s; retrying in %.0fs", self.shard_index, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            try:
                # Fetch the topic's metadata first: a group leader without it assigns nothing
                # and the group only rebalances again at the next metadata refresh (minutes).
                # A static member that rejoins gets its old assignment back from the
                # coordinator even when the topic is gone: never subscribe to a missing topic.
                if not consumer.partitions_for_topic(self._topic):
                    consumer.close(autocommit=False)
                    self._wait_for_topic(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                if self.settings.mode == "group":
                    self._listener = _Listener(self)
                    consumer.subscribe(topics=[self._topic], listener=self._listener)
                else:
                    parts = self.settings.static_partitions(self.shard_index, self.num_shards)
                    consumer.assign([TopicPartition(self._topic, p) for p in parts])
            except BaseException:
                consumer.close(autocommit=False)
                raise
            with self._cond:
                if self._closed:  # close() gave up waiting for us: do not leak the consumer
                    consumer.close(autocommit=False)
                    return None
                self._consumer = consumer
            self._group_checked = None
            self._group_check_after = 0.0
            if self.topic_missing:
                self.topic_missing = False
                log.warning(
                    "shard %d: topic %r exists again; consuming it", self.shard_index, self._topic
                )
            self._missing_since = None
            if self.settings.mode != "group":
                self._assigned(parts)
            return consumer
        return None

    def _wait_for_topic(self, backoff: float) -> None:
        """The topic does not exist: say so (rate-limited), stay live, wait ``backoff`` s."""
        if not self.topic_missing:
            self.topic_missing = True
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

    def get(
        self, timeout: float, claim: Callable[[RecordBlock], RecordBlock] | None = None
    ) -> RecordBlock | None:
        """The next block, or None after ``timeout`` seconds. Raises ShardFailedError if the poller died.

        ``claim`` (the owner registering the block's records as in flight) runs under the
        lock that revocation takes: a block is either claimed before its partitions are
        revoked, so the owner's commit point at revoke accounts for it, or it is dropped
        with the queue. The block returned is what ``claim`` returned.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._queue:
                if self._error is not None:
                    raise ShardFailedError(self.shard_index, self._error)
                if self._stop.is_set():
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            block = self._queue.popleft()
            self._queued_records -= len(block)
            self._cond.notify_all()
            return claim(block) if claim is not None else block

    def commit(self, offsets: dict[int, int]) -> None:
        """Ask the poller to commit {partition: next offset}; only owned partitions are sent.

        Requests at or below what is known committed are dropped, so an owner may send every
        commit point each time (none is lost to a rebalance in between) at no cost.
        """
        if not offsets:
            return
        with self._cond:
            for p, off in offsets.items():
                if off > self._commits.get(p, -1) and off > self._committed.get(p, -1):
                    self._commits[p] = off

    @property
    def assigned(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._assigned_set)

    @property
    def topic_missing(self) -> bool:
        """True while the topic does not exist (deleted, or not created yet): not ready."""
        return self._topic_missing

    @topic_missing.setter
    def topic_missing(self, missing: bool) -> None:
        if missing != self._topic_missing:
            self._topic_missing = missing
            self.hooks.on_topic_missing(self.shard_index, missing)

    @property
    def joining(self) -> bool:
        """True while the shard waits for the group: its pass's join, or a rebalance under way.

        The pass's idle timeout does not run meanwhile: a shard without a stable assignment
        is waiting for the group, not for records.
        """
        return not self._joined or not self._stable

    @property
    def queued_records(self) -> int:
        return self._queued_records

    @property
    def failed(self) -> BaseException | None:
        return self._error

    def close(self, timeout: float = 10.0) -> None:
        """Stop polling, commit what was requested (synchronously), close the consumer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("shard %d: poller did not stop within %.1fs", self.shard_index, timeout)
        if self._consumer is not None:
            try:
                # A commit for a topic that is gone is retried every 100 ms until the timeout.
                if self._error is None and not self._topic_unknown(self._consumer):
                    self._flush_commits(sync=True, timeout_ms=int(timeout * 1000))
            except Exception as exc:  # the commit is also retried by the next pass / checkpoint
                log.warning("shard %d: final commit failed: %s", self.shard_index, exc)
            finally:
                self._consumer.close(autocommit=False, timeout_ms=int(timeout * 1000))
        with self._cond:
            self._queue.clear()
            self._queued_records = 0

    def __enter__(self) -> Shard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- poller thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                consumer = self._open()
                if consumer is None or not self._poll_loop(consumer):
                    break
        except BaseException as exc:
            if not isinstance(exc, StreamerError):
                log.error("shard %d: poller failed: %r", self.shard_index, exc)
            self._error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def _poll_loop(self, consumer: Any) -> bool:
        """Poll until stopped (False) or until the topic is gone (True: consumer closed)."""
        timeout_ms = self.settings.poll_timeout_ms
        backoff = 0.1
        while not self._stop.is_set():
            if not self._joined:
                self._check_joined()
            self._apply_backpressure()
            self._flush_commits(sync=False)
            with self._cond:
                serial = self.serial
                self._sought.clear()
            try:
                self._await_join(consumer)
                polled = consumer.poll(timeout_ms=timeout_ms)
            except kerrors.NoOffsetForPartitionError as exc:
                self._reset_positions(set(exc.args[0]) if exc.args else set(), {})
                continue
            except kerrors.OffsetOutOfRangeError as exc:
                lost = dict(exc.args[0]) if exc.args and isinstance(exc.args[0], dict) else {}
                self._reset_positions(set(lost), lost)
                continue
            except _FENCED_ERRORS as exc:
                self.hooks.on_error("fenced", exc)
                raise FencedError(self.settings.group_instance_id(self.shard_index)) from exc
            except _AUTH_ERRORS as exc:
                self.hooks.on_error("authentication", exc)
                raise AuthenticationError(
                    self.settings.bootstrap_servers, type(exc).__name__
                ) from exc
            except kerrors.KafkaError as exc:
                if not getattr(exc, "retriable", False) and not isinstance(
                    exc, (kerrors.KafkaConnectionError, kerrors.KafkaTimeoutError)
                ):
                    raise
                self.hooks.on_error("connection", exc)
                log.warning(
                    "shard %d: poll failed (%s), retrying in %.1fs",
                    self.shard_index,
                    exc,
                    backoff,
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            self._emit(polled, serial)
            self._read_stable_offsets(consumer)
            if self._unseeded:
                self._read_group_commits()
            if self._rebalance_stuck(consumer):
                self._reopen_stuck(consumer)
                return True
            if self._stable:
                self._check_group_assignment(consumer)
            if not self._stop.is_set() and self._topic_gone(consumer):
                self._drop_topic(consumer)
                return True
        return False

    def _await_join(self, consumer: Any) -> None:
        """While the member (re)joins its group, wait for the join in one long call.

        kafka-python 3.0.12 runs a join as a task that ``poll()`` awaits for at most its
        timeout. When a rejoin was triggered by a metadata change (the leader assigned from
        stale metadata) rather than by a rebalance notice, and the task finishes while no
        ``poll()`` awaits it, nothing ever takes its result: the member stays out of the
        group, heartbeats off, until its session expires. Short polls (100 ms) leave a gap
        at every poll; awaiting the join here for seconds leaves almost none, and
        ``_rebalance_stuck`` repairs the rare case that still slips through.
        """
        if self.settings.mode != "group":
            return
        coordinator = getattr(consumer, "_coordinator", None)
        if coordinator is None:
            return
        if coordinator.state is not MemberState.STABLE or coordinator.need_rejoin():
            coordinator.poll(timeout_ms=_JOIN_WAIT_MS)

    def _repair_unfinished_join(self, consumer: Any) -> None:
        """Make kafka-python take up a join whose result nothing took (see ``_await_join``).

        The member asks to rejoin; the group goes through one more (quick) rebalance
        instead of waiting for this member's session to expire.
        """
        coordinator: Any = getattr(consumer, "_coordinator", None)
        task = getattr(coordinator, "_join_task", None)
        if coordinator is None or task is None or not getattr(task, "is_done", False):
            return
        if coordinator.need_rejoin():
            return
        log.info(
            "shard %d: group join finished unattended (kafka-python); rejoining", self.shard_index
        )
        coordinator.request_rejoin()

    def _check_group_assignment(self, consumer: Any) -> None:
        """Repair a group assignment that does not match the topic (shard 0, when stable).

        A static member that rejoins a stable group gets its stored assignment back without
        a rebalance, and then no member watches the topic (kafka-python leaves that to the
        member that computed the assignment). If the topic was deleted and created again, or
        gained partitions, the group would keep the old assignment (nothing, for a recreated
        topic) until something else rebalances it. Shard 0 of each worker compares the
        group's assignment with the topic's partitions at its first stable join and whenever
        its metadata shows other partitions, and when they differ makes the group rebalance
        (``consumers.admin.rebalance_if_stale``). A member that computed the assignment
        watches the topic already. Checks that could not decide are retried every
        ``_GROUP_CHECK_RETRY_S``.
        """
        if self.settings.mode != "group" or self.shard_index != 0:
            return
        coordinator = getattr(consumer, "_coordinator", None)
        if coordinator is None or getattr(coordinator, "_is_leader", True):
            return  # this member assigned from fresh metadata and watches the topic itself
        cached = consumer._cluster.partitions_for_topic(self._topic)
        if not cached or frozenset(cached) == self._group_checked:
            return
        now = time.monotonic()
        if now < self._group_check_after:
            return
        self._group_check_after = now + _GROUP_CHECK_RETRY_S
        from consumers.admin import rebalance_if_stale

        try:
            # Commit what is done first: a repair drops this member's partitions uncommitted.
            self._flush_commits(sync=True, timeout_ms=5000)
            check = rebalance_if_stale(self.settings, self.shard_index)
        except Exception as exc:  # e.g. no DESCRIBE permission on the group
            log.warning(
                "shard %d: could not compare group %r's assignment with topic %r (%s); "
                "trying again in %.0fs",
                self.shard_index,
                self.settings.group_id,
                self._topic,
                exc if isinstance(exc, StreamerError) else type(exc).__name__,
                _GROUP_CHECK_RETRY_S,
            )
            self.hooks.on_error("other", exc)
            return
        if check.outcome == "busy":
            return  # rebalancing already, or the topic is changing: ask again later
        self._group_checked = frozenset(cached)
        if check.outcome == "repaired":
            log.warning(
                "shard %d: group %r holds partitions %s of topic %r, which has %s (an "
                "assignment kept from before the topic changed); made the group rebalance",
                self.shard_index,
                self.settings.group_id,
                sorted(check.held),
                self._topic,
                sorted(check.partitions),
            )
            self.hooks.on_error("stale_assignment", RuntimeError("stale group assignment"))

    def _rebalance_stuck(self, consumer: Any) -> bool:
        """True when this member has not been STABLE in the group for ``_stuck_after_s``.

        Seen with kafka-python 3.0.12 against Kafka 4.x: a member revoked for a rebalance
        right after its first assignment sometimes never completes the rejoin (no
        assignment, no error) until its consumer is recreated. A legitimate rebalance waits
        at most for a departed static member's session to expire, so the limit is
        session_timeout_ms plus a margin.
        """
        if self.settings.mode != "group":
            return False
        meta = consumer.group_metadata()
        stable = meta.state is MemberState.STABLE and meta.generation_id >= 0
        self._stable = stable
        now = time.monotonic()
        if stable or self._unstable_since is None:
            self._unstable_since = None if stable else now
            return False
        if now - self._unstable_since >= 1.0:
            self._repair_unfinished_join(consumer)
        return now - self._unstable_since >= self._stuck_after_s

    def _reopen_stuck(self, consumer: Any) -> None:
        """Close a consumer stuck outside the group; the poller opens a fresh one (same ids)."""
        log.warning(
            "shard %d: not a stable member of group %r for %.0fs (kafka-python did not "
            "complete the rejoin); recreating its consumer",
            self.shard_index,
            self.settings.group_id,
            self._stuck_after_s,
        )
        self.hooks.on_error("rebalance_stuck", TimeoutError("rejoin did not complete"))
        self._unstable_since = None
        # Without a stable generation nothing can be committed: drop what is owned.
        self._discard_consumer(consumer, forget_offsets=False)

    def _discard_consumer(self, consumer: Any, *, forget_offsets: bool) -> None:
        """Drop what the consumer owns as lost (no commit), close it; the poller may reopen."""
        if self._listener is not None:
            # Closing the consumer revokes its partitions once more (a commit through a
            # consumer that is gone; for a deleted topic, a rewind to its old offsets).
            self._listener.detached = True
            self._listener = None
        with self._cond:
            partitions = sorted(self._assigned_set)
        if partitions:
            self._revoked(partitions, lost=True)
        with self._cond:
            self._consumer = None
        try:
            consumer.close(autocommit=False, timeout_ms=5000)
        except Exception as exc:  # best effort: the client may be in any state
            log.debug("shard %d: closing the consumer: %r", self.shard_index, exc)
        with self._cond:
            # An assignment that passed the listener just before it was detached.
            late = sorted(self._assigned_set)
        if late:
            self._revoked(late, lost=True)
        with self._cond:
            self._unseeded.clear()
            self._paused_count = 0
            if forget_offsets:
                self._commits.clear()
                self._rewind.clear()
                self._position.clear()
                self._covered.clear()

    def _topic_gone(self, consumer: Any) -> bool:
        """True once the client's metadata has lacked the topic for a second of refreshes.

        kafka-python drops a topic from its metadata cache when the broker answers
        UNKNOWN_TOPIC_OR_PARTITION (a failed refresh keeps the cache as it was), then refreshes
        every ``retry_backoff_ms`` and logs an ERROR each time: a tight loop. A topic missing
        from the cache for a second, across at least one newer successful refresh, is gone.
        """
        if not self._topic_unknown(consumer):
            self._missing_since = None
            return False
        cluster = consumer._cluster
        now = time.monotonic()
        refreshed = getattr(cluster, "_last_successful_refresh_ms", 0)
        if self._missing_since is None:
            self._missing_since = (now, refreshed)
            return False
        since, first_refresh = self._missing_since
        return now - since >= 1.0 and refreshed > first_refresh

    def _topic_unknown(self, consumer: Any) -> bool:
        """True when the client's metadata cache lacks the topic (its last refresh said so)."""
        cluster = getattr(consumer, "_cluster", None)
        return cluster is not None and cluster.partitions_for_topic(self._topic) is None

    def _drop_topic(self, consumer: Any) -> None:
        """The topic was deleted: drop its partitions (nothing to commit), close the consumer."""
        with self._cond:
            partitions = sorted(self._assigned_set)
        log.warning(
            "shard %d: topic %r was deleted: dropping partitions %s without committing "
            "(records not trained yet are gone with it); waiting for the topic to exist again",
            self.shard_index,
            self._topic,
            partitions,
        )
        _missing_topic_notice(self._topic)  # the next "does not exist" line waits 30 s
        self.topic_missing = True
        self.hooks.on_error("topic_missing", TopicNotFoundError(self._topic))
        # Offsets of the deleted topic mean nothing for the new one.
        self._discard_consumer(consumer, forget_offsets=True)

    def _read_group_commits(self) -> None:
        """Report the group's committed offsets of new partitions (outside the rebalance callback).

        The owner's lag figures start from them: a partition that comes back to this worker
        (every pass reassigns) is as far along as the group committed, not at offset 0.
        """
        with self._cond:
            todo = sorted(self._unseeded & self._assigned_set)
            self._unseeded.clear()
        found: dict[int, int] = {}
        for p in todo:
            try:
                off = self._consumer.committed(TopicPartition(self._topic, p), timeout_ms=2000)
            except kerrors.KafkaError as exc:  # only a figure: the next assignment tries again
                log.debug(
                    "shard %d: reading the committed offset of %d: %s", self.shard_index, p, exc
                )
                continue
            if off is not None:
                found[p] = int(off)
        with self._cond:
            for p, off in found.items():
                if p in self._assigned_set:
                    self._committed[p] = max(off, self._committed.get(p, -1))
        if found:
            self.hooks.on_group_committed(self.shard_index, found)

    def _reset_positions(self, tps: set[Any], out_of_range: dict[Any, int]) -> None:
        """Apply auto_offset_reset: quietly without a committed offset, loudly when out of range."""
        policy = self.settings.auto_offset_reset
        for tp, offset in out_of_range.items():
            log.error(
                "shard %d: offset %d of %s partition %d is out of range (deleted by retention "
                "before it was trained?): records were lost upstream; applying "
                "auto_offset_reset=%s",
                self.shard_index,
                offset,
                tp.topic,
                tp.partition,
                policy,
            )
            self.hooks.on_error("offset_out_of_range", kerrors.OffsetOutOfRangeError())
        if not tps:
            return
        if policy == "none":
            what = "are out of range" if out_of_range else "have no committed offset"
            raise StreamerError(
                f"partitions {sorted(tp.partition for tp in tps)} of {self._topic} {what} and "
                "auto_offset_reset=none; set --auto-offset-reset earliest or latest"
            )
        with self._cond:
            for tp in tps:
                self._covered.pop(tp.partition, None)
        if policy == "earliest":
            self._consumer.seek_to_beginning(*tps)
        else:
            self._consumer.seek_to_end(*tps)

    def _emit(self, polled: dict[Any, list[Any]], serial: int) -> None:
        # Read before the serial check: positions read after a rebalance that the check
        # missed would belong to the new assignment.
        positions = _consumed_positions(self._consumer, self._topic)
        if serial != self.serial:
            if any(polled.values()):
                polled = self._drop_across_rebalance(polled)
            positions = {}  # of another assignment: the next poll reports them
        values: list[bytes] = []
        partitions: list[int] = []
        offsets: list[int] = []
        timestamps: list[int] = []
        last: dict[int, int] = {}
        for tp, records in polled.items():
            n = len(records)
            if not n:
                continue
            partitions.extend([tp.partition] * n)
            for r in records:
                values.append(r.value if r.value is not None else b"")
                offsets.append(r.offset)
                timestamps.append(r.timestamp)
            last[tp.partition] = records[-1].offset + 1
            self._first_emitted.setdefault(tp.partition, records[0].offset)
        highwater: dict[int, int] = {}
        for p in self._assigned_snapshot():
            try:
                hw = self._consumer.highwater(TopicPartition(self._topic, p))
            except kerrors.IllegalStateError:
                continue
            if hw is not None:
                highwater[p] = hw
        block = None
        with self._cond:
            ends = self._ends(last, positions)
            for p, off in positions.items():
                if p in self._assigned_set:
                    self._position[p] = off
            for p, off in last.items():
                self._position[p] = max(off, self._position.get(p, off))
            if values or ends:
                block = RecordBlock.from_columns(
                    self._topic, values, partitions, offsets, timestamps, self.serial, ends
                )
                revoked = set(block.partitions()) - self._assigned_set
                if revoked:  # a rebalance raced the poll: never queue records we no longer own
                    self._note_rewind(block, revoked)
                    block = block.without_partitions(revoked)
                if block is not None:
                    self._queue.append(block)
                    self._queued_records += len(block)
                    self._cond.notify_all()
        if block is not None and len(block):
            self.records_polled += len(block)
            self.last_record_monotonic = time.monotonic()
        self.hooks.on_poll(
            self.shard_index,
            len(block) if block is not None else 0,
            block.nbytes if block is not None else 0,
            highwater,
            dict(self._position),
        )

    def _ends(self, last: dict[int, int], positions: dict[int, int]) -> dict[int, int]:
        """Partitions whose consumer position moved past the records handed over (caller holds
        the lock): transaction markers, aborted transactions and compacted gaps hold offsets
        that no record fills. The first position seen after an assignment or a seek only
        marks where the partition starts."""
        ends: dict[int, int] = {}
        for p in set(last) | set(positions):
            if p not in self._assigned_set:
                continue
            pos = positions.get(p)
            known = [x for x in (self._covered.get(p), last.get(p)) if x is not None]
            if not known:
                if pos is not None:
                    self._covered[p] = pos
                continue
            covered = max(known)
            if pos is not None and pos > covered:
                ends[p] = covered = pos
            self._covered[p] = covered
        return ends

    def _read_stable_offsets(self, consumer: Any) -> None:
        """read_committed: report the last stable offsets of the assigned partitions.

        Lag under read_committed counts up to what this isolation level can read: records of
        an open transaction (between the last stable offset and the high watermark) cannot be
        fetched yet, and must not look like a worker that is behind. kafka-python keeps no
        last stable offset from fetch responses; ``end_offsets`` under read_committed asks the
        broker for it (one ListOffsets request), every ``_STABLE_EVERY_S``.
        """
        if self.settings.isolation_level != "read_committed":
            return
        now = time.monotonic()
        if now < self._stable_after:
            return
        parts = self._assigned_snapshot()
        if not parts:
            return
        tps = [TopicPartition(self._topic, p) for p in parts]
        try:
            found = consumer.end_offsets(tps, timeout_ms=_STABLE_TIMEOUT_MS)
        except Exception as exc:  # only a figure for the lag metric: try again later
            log.debug("shard %d: reading last stable offsets: %r", self.shard_index, exc)
            self._stable_after = now + _STABLE_RETRY_S
            return
        self._stable_after = now + _STABLE_EVERY_S
        stable = {tp.partition: int(off) for tp, off in found.items() if off is not None}
        if stable:
            self.hooks.on_stable_offsets(self.shard_index, stable)

    def _drop_across_rebalance(self, polled: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
        """A rebalance ran while ``poll()`` did: drop what it returned and fetch it again.

        Records fetched before a revocation may come back from the same ``poll()`` call as the
        assignment that followed it, after any seek the assignment made. Rather than tell them
        apart, drop all of them: partitions still assigned are sought back to their first
        offset here (the poller owns the consumer), the others are rewound if they return.
        """
        with self._cond:
            owned = set(self._assigned_set)
            for tp, records in polled.items():
                if not records:
                    continue
                low = records[0].offset
                if tp.partition in owned:
                    # Never past a seek the assignment made (a rewind or a checkpoint).
                    self._consumer.seek(tp, min(low, self._sought.get(tp.partition, low)))
                    self._covered.pop(tp.partition, None)
                else:
                    self._rewind[tp.partition] = min(low, self._rewind.get(tp.partition, low))
        log.debug("shard %d: dropped a poll that raced a rebalance", self.shard_index)
        return {}

    def _assigned_snapshot(self) -> list[int]:
        with self._cond:
            return sorted(self._assigned_set)

    def _apply_backpressure(self) -> None:
        # Reconcile with the client's own pause flags every loop: kafka-python keeps a
        # partition's paused flag (and position) across a rebalance that leaves it with us.
        full = len(self._queue) >= self.settings.queue_max_blocks or not self._joined
        paused = self._consumer.paused()
        if full:
            todo = [
                TopicPartition(self._topic, p)
                for p in self._assigned_snapshot()
                if TopicPartition(self._topic, p) not in paused
            ]
            if todo:
                self._pause_or_resume(self._consumer.pause, todo)
            count = len(self._consumer.paused())
        else:
            if paused:
                self._pause_or_resume(self._consumer.resume, list(paused))
            count = 0
        if count != self._paused_count:
            self._paused_count = count
            self.hooks.on_paused(self.shard_index, count)

    def _pause_or_resume(self, action: Callable[..., None], tps: list[Any]) -> None:
        # A rebalance on the IO thread can take a partition away between our snapshot of the
        # assignment and this call; the client then has no state for it: skip it, never die.
        for tp in tps:
            try:
                action(tp)
            except (KeyError, kerrors.IllegalStateError):
                log.debug("shard %d: %s no longer assigned", self.shard_index, tp)

    def _check_joined(self) -> None:
        assert self._barrier is not None
        meta = self._consumer.group_metadata()
        stable = meta.state is MemberState.STABLE and meta.generation_id >= 0
        self._joined = self._barrier.report(
            self.shard_index, meta.generation_id if stable else None
        )

    def _take_commits(self) -> dict[int, int]:
        with self._cond:
            commits = {p: o for p, o in self._commits.items() if p in self._assigned_set}
            self._commits.clear()
        return commits

    def _flush_commits(self, *, sync: bool, timeout_ms: int | None = None) -> None:
        commits = self._take_commits()
        if not commits:
            return
        self._send_commit(commits, sync=sync, timeout_ms=timeout_ms)

    def _send_commit(
        self, commits: dict[int, int], *, sync: bool, timeout_ms: int | None = None
    ) -> None:
        payload = {
            TopicPartition(self._topic, p): OffsetAndMetadata(o, "", -1) for p, o in commits.items()
        }
        t0 = time.monotonic()
        log.debug("shard %d: commit %s (sync=%s)", self.shard_index, commits, sync)
        if sync:
            try:
                self._consumer.commit(payload, timeout_ms=timeout_ms)
            except Exception as exc:
                self.hooks.on_commit(commits, False, time.monotonic() - t0, type(exc).__name__)
                self.hooks.on_error("commit", exc)
                raise
            self._note_committed(commits)
            self.hooks.on_commit(commits, True, time.monotonic() - t0, None)
            return

        def done(_offsets: Any, response: Any) -> None:
            ok = not isinstance(response, BaseException)
            if ok:
                self._note_committed(commits)
            err = None if ok else type(response).__name__
            self.hooks.on_commit(commits, ok, time.monotonic() - t0, err)
            if not ok:
                self.hooks.on_error("commit", response)
                self._warn_commit_failed(commits, err)

        self._consumer.commit_async(payload, callback=done)

    def _note_committed(self, commits: dict[int, int]) -> None:
        with self._cond:
            for p, off in commits.items():
                if p in self._assigned_set:
                    self._committed[p] = max(off, self._committed.get(p, -1))

    def _warn_commit_failed(self, commits: dict[int, int], err: str | None) -> None:
        """Log a failed commit: the first at once, then one line per 10 s with a count.

        While the coordinator is unreachable every commit request fails at once; the failures
        are counted in metrics (kafka_errors{type="commit"}) and the log must stay readable.
        """
        now = time.monotonic()
        self._commit_failures += 1
        if now - self._commit_warned_at < 10.0:
            return
        log.warning(
            "shard %d: commit of %s failed: %s (%d failed commits since the last warning; "
            "the offsets are committed again later, nothing is lost)",
            self.shard_index,
            commits,
            err,
            self._commit_failures,
        )
        self._commit_warned_at = now
        self._commit_failures = 0

    # ---- rebalance callbacks (kafka-python IO thread: never block) --------------------------

    def _note_rewind(self, block: RecordBlock, partitions: set[int]) -> None:
        """Remember the lowest offset dropped per partition (caller holds the lock)."""
        for p in partitions:
            mask = block.partition == p
            if mask.any():
                low = int(block.offset[mask].min())
                self._rewind[p] = min(low, self._rewind.get(p, low))

    def _assigned(self, partitions: list[int]) -> None:
        self.last_rebalance_monotonic = time.monotonic()
        with self._cond:
            self.serial += 1
            self._assigned_set = set(partitions)
            for p in partitions:
                self._first_emitted.pop(p, None)
                self._committed.pop(p, None)
                self._covered.pop(p, None)
            if self.settings.mode == "group":
                self._unseeded = set(partitions)
            # kafka-python keeps the position of a partition that stays with this consumer
            # across a rebalance; records dropped at revoke must be fetched again.
            rewind = {p: o for p, o in self._rewind.items() if p in self._assigned_set}
            self._rewind.clear()
        log.info(
            "shard %d: assigned partitions %s of %s",
            self.shard_index,
            sorted(partitions),
            self._topic,
        )
        if not self._joined and partitions:
            # Fetching starts inside this very poll(): hold it until all shards have joined.
            self._consumer.pause(*[TopicPartition(self._topic, p) for p in partitions])
        seeks = self.hooks.on_assigned(self.shard_index, partitions)
        for p, off in rewind.items():
            if p not in seeks:
                log.info(
                    "shard %d: partition %d back after revoke; rewinding to %d",
                    self.shard_index,
                    p,
                    off,
                )
                self._seek_assigned(p, off)
        for p, off in seeks.items():
            if p in partitions:
                log.info(
                    "shard %d: seeking partition %d to %d (checkpoint)", self.shard_index, p, off
                )
                self._seek_assigned(p, off)

    def _seek_assigned(self, partition: int, offset: int) -> None:
        self._consumer.seek(TopicPartition(self._topic, partition), offset)
        with self._cond:
            self._sought[partition] = min(offset, self._sought.get(partition, offset))
            self._covered.pop(partition, None)

    def _revoked(self, partitions: list[int], *, lost: bool) -> None:
        """Drop revoked partitions' queued records; commit what the owner says is done.

        The owner's hook runs under the lock that ``get(claim=...)`` takes, so every block is
        either claimed (and in the owner's commit point) or dropped here. A partition that
        comes back to this shard is rewound to the lowest offset that may not be trained:
        the owner's commit point, else the first offset emitted since it was assigned.
        """
        if not partitions:
            return
        gone = set(partitions)
        with self._cond:
            self.serial += 1
            self._assigned_set -= gone
            kept: collections.deque[RecordBlock] = collections.deque()
            self._queued_records = 0
            for block in self._queue:
                self._note_rewind(block, gone)
                rest = block.without_partitions(gone)
                if rest is not None:
                    kept.append(rest)
                    self._queued_records += len(rest)
            self._queue = kept
            for p in gone:
                self._commits.pop(p, None)
                self._position.pop(p, None)
                self._covered.pop(p, None)
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
            for p in gone:
                first = self._first_emitted.pop(p, None)
                known = self._committed.pop(p, None)
                low = commits.get(p, known if known is not None and lost else first)
                if low is not None:
                    self._rewind[p] = min(low, self._rewind.get(p, low))
        if commits and not self._closed:
            try:
                self._send_commit(commits, sync=False)
            except Exception as exc:
                log.warning("shard %d: commit on revoke failed: %s", self.shard_index, exc)
