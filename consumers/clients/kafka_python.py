"""kafka-python as a ``ConsumerClient``, and the kafka-python clients admin calls probe with.

Every kafka-python-specific line of the shard lives here: configuration in kafka-python's
names, the rebalance listener, error classification, the join workaround, the stale-group
check, topic-deletion detection and log quieting. Private attributes are read only in
``kafka_python_internals``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import kafka.errors as kerrors
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.structs import MemberState, OffsetAndMetadata

from consumers.block import Original, RecordBlock
from consumers.clients import kafka_python_internals as internals
from consumers.clients.base import (
    CommitCallback,
    GroupCommit,
    GroupState,
    NoCommittedOffset,
    OffsetsOutOfRange,
    RebalanceListener,
    RefusedBatch,
    RetriableClientError,
    ShardContext,
)
from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    FencedError,
    GroupProtocolError,
    GroupRepairError,
    StreamerError,
    TlsHandshakeError,
)
from consumers.logs import quiet
from consumers.redact import protect
from consumers.settings import ConsumerSettings, SecuritySettings

__all__ = [
    "GroupCheck",
    "KafkaPythonClient",
    "RecordReader",
    "connect",
    "consumer_config",
    "open_client",
    "probe_batch",
    "probe_consumer",
    "quiet_logs",
    "read_values",
    "rebalance_if_stale",
]

log = logging.getLogger(__name__)

_FENCED_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(kerrors, name) for name in ("FencedInstanceIdError",) if hasattr(kerrors, name)
)
# kafka-python 3.x has no NoBrokersAvailable (2.x raised it); naming a missing attribute in an
# ``except`` clause raises AttributeError the moment any exception reaches that clause.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(kerrors, name)
    for name in ("NoBrokersAvailable", "KafkaTimeoutError")
    if hasattr(kerrors, name)
)

_ASSIGNORS = {
    "range": RangePartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
}
#: How long one call waits for a group (re)join to finish (``internals.await_join``).
_JOIN_WAIT_MS = 3000
#: A stale-looking assignment must look the same this much later to be repaired: a new
#: group's cooperative rebalance holds a partial assignment for a moment.
_STALE_CONFIRM_S = 5.0
#: How long the stale-assignment check waits before asking the broker again.
_GROUP_CHECK_RETRY_S = 30.0
#: How often the partitions' ends are read from the broker (for lag: the last stable offsets
#: under read_committed, the high watermarks otherwise), how long one read may take, and how
#: long to wait after a failed one.
_STABLE_EVERY_S = 2.0
#: How long an assignment waits for the group's committed offsets (the start rule's input).
_COMMITTED_TIMEOUT_MS = 5000
_STABLE_TIMEOUT_MS = 500
#: How many nodes a refreshed read of the topic's partitions tries (one down is skipped).
_METADATA_TRIES = 3
_STABLE_RETRY_S = 10.0


# ---- logs ---------------------------------------------------------------------------------


def quiet_logs() -> None:
    """Rate-limit kafka-python's repeated WARNING/ERROR lines (idempotent).

    kafka-python refreshes metadata every ``retry_backoff_ms`` (100 ms) while a subscribed
    topic is unknown, and ``kafka.cluster`` logs "Topic ... not found in cluster metadata" at
    ERROR on each refresh; a sync commit for a deleted topic is retried (and logged) every
    100 ms until its timeout. The cooperative-sticky assignor logs "No partition metadata for
    topic ..." at WARNING on every assignment while a subscribed topic is gone (each member's
    rejoin is one), and the fetcher logs "unknown topic or partition error in ListOffsets" on
    each retry of a position lookup for a deleted topic's partition (hundreds a second until
    the partition is revoked).
    """
    for name in (
        "kafka.cluster",
        "kafka.coordinator.consumer",
        "kafka.coordinator.assignors.sticky.sticky_assignor",
        "kafka.consumer.fetcher",
    ):
        quiet(name)


# ---- configuration and connecting ---------------------------------------------------------


def consumer_config(settings: ConsumerSettings, shard_index: int) -> dict[str, Any]:
    """KafkaConsumer keyword arguments for one shard. Auto-commit is always off.

    >>> s = ConsumerSettings(bootstrap_servers="127.0.0.1:9092", topic="t", group_id="g")
    >>> cfg = consumer_config(s, 1)
    >>> cfg["group_instance_id"], cfg["enable_auto_commit"], cfg["isolation_level"]
    ('worker-0-shard-1', False, 'read_committed')
    """
    cfg: dict[str, Any] = {
        "bootstrap_servers": [s.strip() for s in settings.bootstrap_servers.split(",")],
        "client_id": f"{settings.client_id}-{settings.worker_id}-{shard_index}",
        "enable_auto_commit": False,
        # The shard applies auto_offset_reset itself, so that an out-of-range offset (data
        # deleted by retention: upstream loss) is counted and logged loudly, never silent.
        "auto_offset_reset": "none",
        "isolation_level": settings.isolation_level,
        "max_poll_records": settings.max_poll_records,
        "fetch_max_bytes": settings.fetch_max_bytes,
        "max_partition_fetch_bytes": settings.max_partition_fetch_bytes,
        "max_poll_interval_ms": settings.max_poll_interval_ms,
        "session_timeout_ms": settings.session_timeout_ms,
        "heartbeat_interval_ms": settings.heartbeat_interval_ms,
        "request_timeout_ms": settings.request_timeout_ms,
        "metadata_max_age_ms": settings.metadata_max_age_ms,
        "bootstrap_timeout_ms": settings.bootstrap_timeout_ms,
        "check_crcs": True,
    }
    if settings.mode == "group":
        cfg["group_id"] = settings.group_id
        cfg["group_instance_id"] = settings.group_instance_id(shard_index)
        cfg["partition_assignment_strategy"] = [_ASSIGNORS[settings.partition_assignment_strategy]]
    else:
        # Static mode still commits to the group (for monitoring and restarts), never joins it;
        # without a group id (evaluation, a replay) it belongs to no group and never commits.
        cfg["group_id"] = settings.group_id or None
    cfg.update(settings.security.kafka_config())
    return cfg


def _detail(exc: BaseException, security: SecuritySettings) -> str:
    """An error's text for our messages, with any secret of ``security`` masked."""
    text = str(exc)
    if type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    for secret in (security.sasl_plain_password, security.ssl_password):
        if secret is not None and secret.get():
            text = text.replace(secret.get(), "***")
    return text


def connect(
    factory: Any, bootstrap: str, security: SecuritySettings, timeout_ms: int, **configs: Any
) -> Any:
    """Build a kafka-python client; a failed authentication or TLS handshake fails at once.

    Raises ``AuthenticationError``/``TlsHandshakeError`` (never retried) or
    ``BrokerUnavailableError`` (no broker answered within ``timeout_ms``).
    """
    protect(security)
    client_id = f"streamer-probe-{uuid.uuid4().hex[:8]}"
    watch = internals.FailureWatch(client_id, sasl=security.security_protocol.startswith("SASL_"))
    with watch:
        try:
            return factory(
                bootstrap_servers=[s.strip() for s in bootstrap.split(",")],
                client_id=client_id,
                kafka_client=watch.make_client,
                **configs,
                **security.kafka_config(),
            )
        except internals.AUTH_ERRORS as exc:
            watch.stop_client()
            raise AuthenticationError(bootstrap, _detail(exc, security)) from exc
        except _UNAVAILABLE_ERRORS as exc:
            watch.stop_client()
            if watch.kind == "tls" and watch.error is not None:
                raise TlsHandshakeError(bootstrap, _detail(watch.error, security)) from watch.error
            if watch.kind == "auth" and watch.error is not None:
                raise AuthenticationError(
                    bootstrap, _detail(watch.error, security)
                ) from watch.error
            if (
                security.security_protocol.startswith("SASL_")
                and watch.disconnects >= 2
                and watch.others == 0
            ):
                # Every attempt reached the broker, which hung up during the handshake: that
                # is how a refused login looks when kafka-python loses the error response.
                raise AuthenticationError(
                    bootstrap,
                    f"the broker closed all {watch.disconnects} connections during the SASL "
                    f"handshake within {timeout_ms} ms (refused credentials, or a mechanism "
                    "or security protocol this listener does not use)",
                ) from exc
            raise BrokerUnavailableError(
                bootstrap,
                f"no answer within {timeout_ms} ms ({type(exc).__name__})",
                security_protocol=security.security_protocol,
            ) from exc
        except BaseException:
            watch.stop_client()
            raise


def probe_consumer(
    bootstrap: str,
    security: SecuritySettings,
    timeout_ms: int,
    isolation_level: str = "read_uncommitted",
) -> Any:
    """A group-less KafkaConsumer for metadata and offset queries (``consumers.admin``)."""
    return connect(
        KafkaConsumer,
        bootstrap,
        security,
        timeout_ms,
        enable_auto_commit=False,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=max(timeout_ms, 5000),
        isolation_level=isolation_level,
    )


def probe_batch(
    settings: ConsumerSettings, partition: int, offset: int, *, timeout_seconds: float = 15.0
) -> RefusedBatch | None:
    """What kafka-python makes of the record batch at ``offset`` of ``partition``, inflating it
    within ``settings.inflate_bound``: the ``RefusedBatch`` when it inflates past the bound,
    None when it reads (records or markers).

    For a client that cannot tell where a batch it could not inflate ends (librdkafka reports
    only its first offset). The fetch asks for one byte per partition: the broker sends the
    first batch whole and nothing after it (KIP-74). Raises ``RetriableClientError`` when no
    answer came within ``timeout_seconds``, and kafka-python's error when the batch is corrupt.
    """
    protect(settings.security)
    cfg = consumer_config(settings, 0)
    for key in ("group_instance_id", "partition_assignment_strategy"):
        cfg.pop(key, None)
    cfg.update(group_id=None, client_id=f"{cfg['client_id']}-probe", max_partition_fetch_bytes=1)
    try:
        consumer = KafkaConsumer(**cfg)
    except (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError) as exc:
        raise RetriableClientError(f"reading the batch at offset {offset}: {exc}") from exc
    refused: list[RefusedBatch] = []
    try:
        tp = TopicPartition(settings.topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            with internals.bounded_inflation(settings.inflate_bound, refused):
                polled = consumer.poll(timeout_ms=500)
            for batch in refused:
                if batch.partition == partition and batch.last_offset >= offset:
                    return batch
            position = internals.consumed_positions(consumer, settings.topic).get(partition)
            if polled or (position is not None and position > offset):
                return None
    finally:
        consumer.close(autocommit=False)
    raise RetriableClientError(
        f"reading the batch at offset {offset}: no answer in {timeout_seconds}s"
    )


def read_values(
    settings: ConsumerSettings, *, timeout_seconds: float = 600.0
) -> Iterator[list[bytes]]:
    """The values of ``settings.partitions`` from their beginning, one list per poll, in a
    plain kafka-python loop without a group (the benchmark's reference for the client's cost)."""
    protect(settings.security)
    cfg = consumer_config(settings, 0)
    cfg.pop("group_instance_id", None)
    cfg["group_id"] = None
    consumer = KafkaConsumer(**cfg)
    try:
        consumer.assign([TopicPartition(settings.topic, p) for p in settings.partitions or ()])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                yield [r.value for r in records]
    finally:
        consumer.close(autocommit=False)


#: ``RecordReader``: a wanted offset further than this past the reader's position is sought,
#: not read up to.
_READ_GAP = 2_000


class RecordReader:
    """Records of ``settings.topic`` read back by their coordinates, whole: key, value (None
    for a tombstone), headers and timestamp. For the dead-letter writer, so that a letter
    carries the original record although the hot path moves values only.

    A group-less consumer of its own (made at the first read, kept until ``close``), with the
    source's isolation level, security and inflation bound. An offset the topic no longer
    holds (retention, compaction) is missing from the answer; no answer within
    ``timeout_seconds`` raises ``RetriableClientError``.
    """

    def __init__(self, settings: ConsumerSettings, *, timeout_seconds: float = 15.0) -> None:
        self.settings = settings
        self.timeout_seconds = timeout_seconds
        self._consumer: Any = None
        self._closed = False

    def _open(self) -> Any:
        if self._closed:
            raise RetriableClientError("the reader is closed")
        if self._consumer is None:
            protect(self.settings.security)
            cfg = consumer_config(self.settings, 0)
            for key in ("group_instance_id", "partition_assignment_strategy"):
                cfg.pop(key, None)
            cfg.update(
                group_id=None,
                client_id=f"{cfg['client_id']}-reader",
                # A record gone since (retention): the read starts at the log's start and the
                # record is reported missing.
                auto_offset_reset="earliest",
            )
            try:
                self._consumer = KafkaConsumer(**cfg)
            except Exception as exc:
                raise RetriableClientError(f"opening a reader: {type(exc).__name__}") from exc
        return self._consumer

    def read(self, partition: int, offsets: list[int]) -> dict[int, Original]:
        """The records at ``offsets`` of ``partition`` that the topic still holds."""
        wanted = sorted(set(offsets))
        found: dict[int, Original] = {}
        if not wanted:
            return found
        wanted_set = set(wanted)
        consumer = self._open()
        tp = TopicPartition(self.settings.topic, partition)
        refused: list[RefusedBatch] = []
        deadline = time.monotonic() + self.timeout_seconds
        i = 0
        try:
            consumer.assign([tp])
            while i < len(wanted):
                consumer.seek(tp, wanted[i])
                while i < len(wanted):
                    if time.monotonic() > deadline:
                        raise RetriableClientError(
                            f"reading back {self.settings.topic}/{partition}@{wanted[i]}: "
                            f"no answer in {self.timeout_seconds}s"
                        )
                    with internals.bounded_inflation(self.settings.inflate_bound, refused):
                        polled = consumer.poll(timeout_ms=500)
                    for r in polled.get(tp, ()):
                        if r.offset in wanted_set:
                            found[r.offset] = Original(
                                r.key, r.value, list(r.headers or ()), r.timestamp
                            )
                    left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                    position = consumer.position(tp, timeout_ms=left_ms)
                    if position is None:
                        continue  # not known yet: the deadline above ends the wait
                    while i < len(wanted) and wanted[i] < position:
                        i += 1
                    if i < len(wanted) and wanted[i] - position > _READ_GAP:
                        break  # seek to the next wanted offset
        except RetriableClientError:
            raise
        except kerrors.KafkaError as exc:
            raise RetriableClientError(
                f"reading back {self.settings.topic}/{partition}: {type(exc).__name__}"
            ) from exc
        finally:
            with contextlib.suppress(Exception):
                consumer.assign([])
        return {o: found[o] for o in wanted if o in found}

    def close(self) -> None:
        self._closed = True
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close(autocommit=False)
            self._consumer = None


def open_client(settings: ConsumerSettings, shard_index: int) -> KafkaPythonClient:
    """A KafkaConsumer for one shard, its errors wrapped in ours (no secrets in them)."""
    quiet_logs()
    protect(settings.security)
    try:
        consumer = KafkaConsumer(**consumer_config(settings, shard_index))
    except (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError) as exc:
        raise BrokerUnavailableError(
            settings.bootstrap_servers, f"timed out after {settings.bootstrap_timeout_ms} ms"
        ) from exc
    except internals.AUTH_ERRORS as exc:
        raise AuthenticationError(settings.bootstrap_servers, type(exc).__name__) from exc
    return KafkaPythonClient(consumer, settings, shard_index)


# ---- the consumer -------------------------------------------------------------------------


class _Listener(AsyncConsumerRebalanceListener):
    """kafka-python's listener (awaited on its IO thread) calling the shard's.

    Async, so that an assignment can read the group's committed offsets (the shard's start
    rule needs them) without the blocking call kafka-python refuses on its IO thread.
    """

    def __init__(self, client: KafkaPythonClient, listener: RebalanceListener) -> None:
        self._client = client
        self._listener = listener
        #: Set when the shard discards this consumer: the revocation kafka-python reports as
        #: it closes the consumer was already handled (as lost).
        self.detached = False

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if self.detached:
            return
        client = self._client
        client.revoke_commits = []
        try:
            self._listener.revoked([tp.partition for tp in revoked], lost=False)
        finally:
            sent, client.revoke_commits = client.revoke_commits, None
        for future in sent:  # answered before the partitions move on (the shard logs failures)
            await internals.await_commit(client.consumer, future, _COMMITTED_TIMEOUT_MS)

    async def on_partitions_lost(self, lost: Any) -> None:
        if not self.detached:
            self._listener.revoked([tp.partition for tp in lost], lost=True)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if self.detached:
            return
        parts = [tp.partition for tp in assigned]
        group: dict[int, GroupCommit] | None = None
        if parts and self._client.settings.group_id:
            try:
                found = await internals.committed_async(
                    self._client.consumer, list(assigned), _COMMITTED_TIMEOUT_MS
                )
                group = _group_commits(found)
            except Exception as exc:  # the shard then starts from what it knows itself
                log.warning(
                    "shard %d: the group's committed offsets could not be read at assignment: %r",
                    self._client.shard_index,
                    exc,
                )
        seeks = self._listener.assigned(parts, group)
        for p, offset in seeks.items():
            self._client.seek(p, offset)


def _group_commits(found: dict[Any, Any]) -> dict[int, GroupCommit]:
    out: dict[int, GroupCommit] = {}
    for tp, om in found.items():
        if om is None:
            continue
        offset = getattr(om, "offset", om)
        if offset is None or int(offset) < 0:
            continue
        out[tp.partition] = GroupCommit(int(offset), getattr(om, "metadata", "") or "")
    return out


class KafkaPythonClient:
    """A KafkaConsumer of one topic behind the ``ConsumerClient`` interface."""

    name = "kafka-python"

    def __init__(self, consumer: Any, settings: ConsumerSettings, shard_index: int) -> None:
        self.consumer = consumer
        self.settings = settings
        #: Commits sent from within a revocation (the listener awaits them), else None.
        self.revoke_commits: list[Any] | None = None
        self.shard_index = shard_index
        self.topic = settings.topic
        self._listener: _Listener | None = None
        self._stable_after = 0.0  # when stable_offsets may ask the broker again
        self._missing_since: tuple[float, int] | None = None  # (when, refresh) of a gap
        #: The topic's partitions the group's assignment was last found to match, and when
        #: the stale-assignment check may ask the broker again.
        self._group_checked: frozenset[int] | None = None
        self._group_check_after = 0.0
        self._stale_suspect: frozenset[int] | None = None  # seen once, to be confirmed
        #: Record batches that inflate past the bound, skipped (``internals.bounded_inflation``).
        self._refused: list[RefusedBatch] = []

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    # ---- membership ------------------------------------------------------------------------

    def subscribe(self, listener: RebalanceListener) -> None:
        self._listener = _Listener(self, listener)
        self.consumer.subscribe(topics=[self.topic], listener=self._listener)

    def assign(self, partitions: list[int], starts: dict[int, int] | None = None) -> None:
        self.consumer.assign([self._tp(p) for p in partitions])
        for p, offset in (starts or {}).items():
            self.seek(p, offset)

    def group_state(self) -> GroupState:
        if self.settings.mode != "group":
            return GroupState(True, 0)
        meta = self.consumer.group_metadata()
        stable = meta.state is MemberState.STABLE and meta.generation_id >= 0
        return GroupState(stable, meta.generation_id if stable else None)

    def before_poll(self) -> None:
        if self.settings.mode == "group":
            with self._translated():
                internals.await_join(self.consumer, _JOIN_WAIT_MS)

    def repair_rejoin(self) -> None:
        if internals.repair_unfinished_join(self.consumer):
            log.debug(  # on most starts: a workaround of kafka-python's, not news
                "shard %d: group join finished unattended (kafka-python); rejoining",
                self.shard_index,
            )

    def detach(self) -> None:
        if self._listener is not None:
            # Closing the consumer revokes its partitions once more (a commit through a
            # consumer that is gone; for a deleted topic, a rewind to its old offsets).
            self._listener.detached = True
            self._listener = None

    # ---- records -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """kafka-python's errors out of a poll or a join, as the interface's and ours."""
        try:
            yield
        except kerrors.NoOffsetForPartitionError as exc:
            tps = exc.args[0] if exc.args else ()
            raise NoCommittedOffset(tp.partition for tp in tps) from exc
        except kerrors.OffsetOutOfRangeError as exc:
            lost = dict(exc.args[0]) if exc.args and isinstance(exc.args[0], dict) else {}
            raise OffsetsOutOfRange({tp.partition: int(o) for tp, o in lost.items()}) from exc
        except _FENCED_ERRORS as exc:
            raise FencedError(self.settings.group_instance_id(self.shard_index)) from exc
        except kerrors.InconsistentGroupProtocolError as exc:
            raise GroupProtocolError(
                self.settings.group_id, self.settings.partition_assignment_strategy
            ) from exc
        except internals.AUTH_ERRORS as exc:
            raise AuthenticationError(self.settings.bootstrap_servers, type(exc).__name__) from exc
        except kerrors.KafkaError as exc:
            if not getattr(exc, "retriable", False) and not isinstance(
                exc, (kerrors.KafkaConnectionError, kerrors.KafkaTimeoutError)
            ):
                raise
            raise RetriableClientError(f"poll failed ({exc})") from exc

    def poll(self, timeout_ms: int, serial: int) -> RecordBlock | None:
        bound = self.settings.inflate_bound
        with self._translated(), internals.bounded_inflation(bound, self._refused):
            polled = self.consumer.poll(timeout_ms=timeout_ms)
        values: list[bytes] = []
        partitions: list[int] = []
        offsets: list[int] = []
        timestamps: list[int] = []
        for tp, records in polled.items():
            n = len(records)
            if not n:
                continue
            partitions.extend([tp.partition] * n)
            for r in records:
                values.append(r.value if r.value is not None else b"")
                offsets.append(r.offset)
                timestamps.append(r.timestamp)
        if not values:
            return None
        return RecordBlock.from_columns(self.topic, values, partitions, offsets, timestamps, serial)

    def refused_batches(self) -> list[RefusedBatch]:
        refused, self._refused = self._refused, []
        return refused

    # ---- positions -------------------------------------------------------------------------

    def positions(self) -> dict[int, int]:
        return internals.consumed_positions(self.consumer, self.topic)

    def highwaters(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for tp in self.consumer.assignment():
            try:
                hw = self.consumer.highwater(tp)
            except kerrors.IllegalStateError:
                continue
            if hw is not None:
                out[tp.partition] = hw
        return out

    def stable_offsets(self) -> dict[int, int] | None:
        """kafka-python keeps no last stable offset from fetch responses, and a partition
        whose fetch stalled reports no new high watermark: ``end_offsets`` asks the broker
        (one ListOffsets request, at the consumer's isolation level) every few seconds, so
        the lag counts the records waiting even then."""
        now = time.monotonic()
        if now < self._stable_after:
            return None
        tps = list(self.consumer.assignment())
        if not tps:
            return None
        try:
            found = self.consumer.end_offsets(tps, timeout_ms=_STABLE_TIMEOUT_MS)
        except Exception as exc:  # only a figure for the lag metric: try again later
            log.debug("shard %d: reading last stable offsets: %r", self.shard_index, exc)
            self._stable_after = now + _STABLE_RETRY_S
            return None
        self._stable_after = now + _STABLE_EVERY_S
        return {tp.partition: int(off) for tp, off in found.items() if off is not None}

    def committed(self, partitions: list[int], timeout_ms: int) -> dict[int, GroupCommit]:
        found: dict[Any, Any] = {}
        try:
            for p in partitions:
                tp = self._tp(p)
                found[tp] = self.consumer.committed(tp, metadata=True, timeout_ms=timeout_ms)
        except kerrors.KafkaError as exc:
            raise RetriableClientError(f"reading committed offsets failed: {exc}") from exc
        return _group_commits(found)

    # ---- flow control ----------------------------------------------------------------------

    def pause(self, partitions: list[int]) -> None:
        self._each(self.consumer.pause, partitions)

    def resume(self, partitions: list[int]) -> None:
        self._each(self.consumer.resume, partitions)

    def _each(self, action: Any, partitions: list[int]) -> None:
        # A rebalance on the IO thread can take a partition away between the shard's snapshot
        # of the assignment and this call; the client then has no state for it: skip it.
        for p in partitions:
            try:
                action(self._tp(p))
            except (KeyError, kerrors.IllegalStateError):
                log.debug("shard %d: partition %d no longer assigned", self.shard_index, p)

    def paused(self) -> set[int]:
        return {tp.partition for tp in self.consumer.paused()}

    def seek(self, partition: int, offset: int) -> None:
        self.consumer.seek(self._tp(partition), offset)

    def seek_to(self, partitions: list[int], where: Literal["earliest", "latest"]) -> None:
        tps = [self._tp(p) for p in partitions]
        if where == "earliest":
            self.consumer.seek_to_beginning(*tps)
        else:
            self.consumer.seek_to_end(*tps)

    # ---- commits ---------------------------------------------------------------------------

    def commit(
        self,
        offsets: dict[int, int],
        *,
        callback: CommitCallback | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        meta = self.settings.commit_metadata_text
        payload = {self._tp(p): OffsetAndMetadata(o, meta, -1) for p, o in offsets.items()}
        if callback is None:
            self.consumer.commit(payload, timeout_ms=timeout_ms)
            return

        def done(_offsets: Any, response: Any) -> None:
            callback(offsets, response if isinstance(response, BaseException) else None)

        future = self.consumer.commit_async(payload, callback=done)
        if self.revoke_commits is not None:
            self.revoke_commits.append(future)

    # ---- the topic ---------------------------------------------------------------------------

    def topic_partitions(self, *, refresh: bool = False) -> frozenset[int] | None:
        """The topic's partitions (None: no such topic); ``refresh``: from a metadata request.

        kafka-python sends the request to one node and raises its connection error when that
        node is down (a broker killed in a cluster whose others answer: a new pass's consumer
        failed the worker so). The next try goes to another node (the dead one is in its
        reconnect backoff): tried up to ``_METADATA_TRIES`` times, then
        ``RetriableClientError`` (the shard retries with back-off)."""
        if not refresh:
            return internals.cached_partitions(self.consumer, self.topic)
        for attempt in range(_METADATA_TRIES):
            try:
                with internals.all_topics_flag_kept(self.consumer):
                    parts = self.consumer.partitions_for_topic(self.topic)
            except (kerrors.KafkaConnectionError, kerrors.KafkaTimeoutError) as exc:
                if attempt + 1 == _METADATA_TRIES:
                    raise RetriableClientError(
                        f"reading the metadata of {self.topic!r}: {_detail(exc, self.settings.security)}"
                    ) from exc
                log.debug("shard %d: metadata request failed: %r", self.shard_index, exc)
                time.sleep(0.1 * (attempt + 1))
                continue
            return frozenset(parts) if parts else None
        return None  # not reached

    def topic_gone(self) -> bool:
        """True once the metadata has lacked the topic for a second of refreshes.

        kafka-python drops a topic from its metadata cache when the broker answers
        UNKNOWN_TOPIC_OR_PARTITION (a failed refresh keeps the cache as it was), then refreshes
        every ``retry_backoff_ms`` and logs an ERROR each time: a tight loop. A topic missing
        from the cache for a second, across at least one newer successful refresh, is gone.
        """
        if self.topic_partitions() is not None:
            self._missing_since = None
            return False
        now = time.monotonic()
        refreshed = internals.last_metadata_refresh_ms(self.consumer)
        if self._missing_since is None:
            self._missing_since = (now, refreshed)
            return False
        since, first_refresh = self._missing_since
        return now - since >= 1.0 and refreshed > first_refresh

    def upkeep(self, shard: ShardContext) -> None:
        """Repair a group assignment that does not match the topic (shard 0, when stable).

        A static member that rejoins a stable group gets its stored assignment back without a
        rebalance, and then no member watches the topic (kafka-python 3.0.12 sends JoinGroup
        v7: no KIP-814 ``skip_assignment``, so only the member that computed the assignment
        watches the metadata). If the topic was deleted and created again, or gained
        partitions, the group would keep the old assignment (nothing, for a recreated topic)
        until something else rebalances it. Shard 0 of each worker compares the group's
        assignment with the topic's partitions at its first stable join and whenever its
        metadata shows other partitions, and when they differ makes the group rebalance
        (``rebalance_if_stale``). Checks that could not decide are retried every
        ``_GROUP_CHECK_RETRY_S``.
        """
        if self.settings.mode != "group" or self.shard_index != 0:
            return
        if not self.group_state().stable or internals.is_group_leader(self.consumer):
            return  # a leader assigned from fresh metadata and watches the topic itself
        cached = self.topic_partitions()
        if not cached or cached == self._group_checked:
            return
        now = time.monotonic()
        if now < self._group_check_after:
            return
        self._group_check_after = now + _GROUP_CHECK_RETRY_S
        try:
            suspect = self._stale_suspect
            if suspect is not None:
                # Commit what is done first: a repair drops this member's partitions uncommitted.
                shard.flush_commits(5000)
            check = rebalance_if_stale(self.settings, self.shard_index, confirm=suspect)
        except Exception as exc:  # e.g. no DESCRIBE permission on the group
            log.warning(
                "shard %d: could not compare group %r's assignment with topic %r (%s); "
                "trying again in %.0fs",
                self.shard_index,
                self.settings.group_id,
                self.topic,
                exc if isinstance(exc, StreamerError) else type(exc).__name__,
                _GROUP_CHECK_RETRY_S,
            )
            shard.report_error("other", exc)
            return
        if check.outcome == "busy":
            self._stale_suspect = None
            return  # rebalancing already, or the topic is changing: ask again later
        if check.outcome == "suspect":
            # A new group assigns in steps (a cooperative rebalance revokes, then assigns):
            # a partial assignment is normal for a moment. Only one that stays is stale.
            self._stale_suspect = check.held
            self._group_check_after = now + _STALE_CONFIRM_S
            return
        self._stale_suspect = None
        self._group_checked = cached
        if check.outcome == "repaired":
            log.warning(
                "shard %d: group %r holds partitions %s of topic %r, which has %s (an "
                "assignment kept from before the topic changed); made the group rebalance",
                self.shard_index,
                self.settings.group_id,
                sorted(check.held),
                self.topic,
                sorted(check.partitions),
            )
            shard.report_error("stale_assignment", RuntimeError("stale group assignment"))

    def close(self, timeout_ms: int) -> None:
        self.consumer.close(autocommit=False, timeout_ms=timeout_ms)


# ---- the stale-assignment repair -----------------------------------------------------------


@dataclass(frozen=True)
class GroupCheck:
    """What ``rebalance_if_stale`` found: ``outcome`` is ``"ok"`` (the group's assignment
    matches the topic), ``"repaired"`` (it did not, twice; the group was made to rebalance),
    ``"suspect"`` (it did not, for the first time: ask again in a few seconds) or ``"busy"``
    (rebalancing already, or not readable: ask again later)."""

    outcome: Literal["ok", "repaired", "busy", "suspect"]
    held: frozenset[int] = frozenset()
    partitions: frozenset[int] = frozenset()


def rebalance_if_stale(
    settings: ConsumerSettings,
    shard_index: int,
    *,
    confirm: frozenset[int] | None = None,
    timeout_ms: int = 5_000,
) -> GroupCheck:
    """Make the group rebalance when its stored assignment does not match the topic.

    A static member (``group_instance_id``) that rejoins a stable group gets its stored
    assignment back without a rebalance, and kafka-python (JoinGroup v7, no KIP-814
    ``skip_assignment``) then has no member that watches the topic's partitions. An
    assignment made while the topic was deleted (nothing), or before partitions were added,
    then stays until something else rebalances the group.

    Reads the topic's partitions and the group (DescribeGroups) through one admin client;
    when the partitions of ``settings.topic`` the members hold differ from the topic's,
    removes this shard's static member (LeaveGroup by instance id). The group rebalances
    with a leader that assigns from fresh metadata, and the removed consumer rejoins on its
    own (its partitions are lost, not committed: duplicates, never a gap).

    Raises ``GroupRepairError`` when the broker refused the removal, and kafka-python's
    errors when a request failed.
    """
    from kafka.admin import KafkaAdminClient, MemberToRemove

    admin = connect(
        KafkaAdminClient,
        settings.bootstrap_servers,
        settings.security,
        timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
    )
    try:
        topic: dict[str, Any] = next(iter(admin.describe_topics([settings.topic])), {})
        if topic.get("error_code") or not topic.get("partitions"):
            return GroupCheck("busy")  # the topic is gone (again): the shard deals with that
        partitions = frozenset(int(p["partition_index"]) for p in topic["partitions"])
        group = admin.describe_groups([settings.group_id]).get(settings.group_id) or {}
        if group.get("error") or group.get("group_state") != "Stable":
            return GroupCheck("busy", partitions=partitions)
        held: set[int] = set()
        for member in group.get("members") or []:
            assignment = member.get("member_assignment")
            if not assignment:
                continue  # an empty assignment (kafka-python leaves b"" undecoded)
            if not isinstance(assignment, dict):
                return GroupCheck("busy", partitions=partitions)  # not the consumer protocol
            for entry in assignment.get("assigned_partitions") or []:
                if entry.get("topic") == settings.topic:
                    held.update(int(p) for p in entry.get("partitions") or [])
        if held == partitions:
            return GroupCheck("ok", frozenset(held), partitions)
        if confirm is None or frozenset(held) != confirm:
            return GroupCheck("suspect", frozenset(held), partitions)  # seen once: not yet
        instance = settings.group_instance_id(shard_index)
        result = admin.remove_group_members(
            settings.group_id,
            [
                MemberToRemove(
                    member_id=None,
                    group_instance_id=instance,
                    reason="stale assignment: the topic's partitions changed",
                )
            ],
        )
        errors = [err for err in result.values() if err is not kerrors.NoError]
        if errors:
            raise GroupRepairError(settings.group_id, instance, errors[0].__name__)
        return GroupCheck("repaired", frozenset(held), partitions)
    finally:
        admin.close()
