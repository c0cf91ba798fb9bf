"""Every read of kafka-python's private attributes, in one place, each with the reason for it.

kafka-python 3.0.12 leaves a few things a long-running consumer needs out of its public API:
the consumed positions without a network round trip, the state of a group join, whether this
member computed the group's assignment, the metadata cache's age, a topic's id, the
connection state of a failed login, and a bound on how far a record batch may inflate (its
codecs inflate whole batches without one: ``bounded_inflation``, the only code here that
replaces kafka-python methods). Each function here degrades to a safe answer when the
attribute it reads is missing (another kafka-python version): the shard then loses only the
workaround, never correctness of its commits.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import ssl
import struct
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import kafka.codec as kcodec
import kafka.errors as kerrors
from kafka.structs import MemberState

from consumers.clients.base import RefusedBatch, UnreadableBatchError

__all__ = [
    "AUTH_ERRORS",
    "FailureWatch",
    "all_topics_flag_kept",
    "await_commit",
    "await_join",
    "bounded_inflation",
    "cached_partitions",
    "classify_failure",
    "committed_async",
    "consumed_positions",
    "is_group_leader",
    "last_metadata_refresh_ms",
    "repair_unfinished_join",
    "topic_id",
]

log = logging.getLogger(__name__)

#: kafka-python's errors that retrying cannot fix: a refused login or missing permission.
AUTH_ERRORS: tuple[type[BaseException], ...] = tuple(
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

_TLS_FAILURE = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|ALERT_BAD_CERTIFICATE|ALERT_CERTIFICATE_[A-Z_]+|ALERT_UNKNOWN_CA"
    r"|ALERT_HANDSHAKE_FAILURE|ALERT_ACCESS_DENIED|ALERT_DECRYPT_ERROR"
)


def classify_failure(value: object) -> str | None:
    """'auth' or 'tls' when ``value`` is an exception that retrying cannot fix, else None."""
    if isinstance(value, AUTH_ERRORS):
        return "auth"
    if isinstance(value, ssl.SSLCertVerificationError) or (
        isinstance(value, BaseException) and _TLS_FAILURE.search(str(value))
    ):
        return "tls"
    return None


# ---- positions and metadata ---------------------------------------------------------------


def consumed_positions(consumer: Any, topic: str) -> dict[int, int]:
    """The consumer's position per assigned partition of ``topic``, without a network call.

    ``KafkaConsumer.position()`` may refresh committed offsets and await resets (a round trip);
    the subscription state holds the positions, moved past control batches and aborted
    transactions by the fetcher. Empty if that state is unreadable: commit points then stop at
    the last record (a trailing transaction marker would show as a lag of 1).
    """
    subscription = getattr(consumer, "_subscription", None)
    try:
        consumed = subscription.all_consumed_offsets() if subscription is not None else {}
    except Exception:
        return {}
    return {tp.partition: int(om.offset) for tp, om in consumed.items() if tp.topic == topic}


def cached_partitions(consumer: Any, topic: str) -> frozenset[int] | None:
    """The topic's partitions in the metadata cache (None: the last refresh lacked the topic).

    ``partitions_for_topic`` on the consumer may block on a refresh; the cache answers at once.
    """
    cluster = getattr(consumer, "_cluster", None)
    if cluster is None:
        return frozenset()  # unknown internals: never claim the topic is gone
    parts = cluster.partitions_for_topic(topic)
    return None if parts is None else frozenset(parts)


@contextlib.contextmanager
def all_topics_flag_kept(consumer: Any) -> Iterator[None]:
    """kafka-python's ``partitions_for_topic`` sets the cluster's ``need_all_topic_metadata``
    for its request and puts it back only when the request succeeds: one that failed (a dead
    node) would leave every later refresh asking for every topic. Put back either way."""
    cluster = getattr(consumer, "_cluster", None)
    stash = getattr(cluster, "need_all_topic_metadata", None)
    try:
        yield
    finally:
        if cluster is not None and stash is not None:
            cluster.need_all_topic_metadata = stash


def last_metadata_refresh_ms(consumer: Any) -> int:
    """When the metadata cache last refreshed successfully (0 if unknown)."""
    return int(getattr(getattr(consumer, "_cluster", None), "_last_successful_refresh_ms", 0) or 0)


def topic_id(client: Any, topic: str) -> str | None:
    """The topic's id (Kafka's UUID) from a client's metadata cache, where the broker sent it."""
    cluster = getattr(client, "_cluster", None)
    if cluster is None or not hasattr(cluster, "topic_id"):
        return None
    found = cluster.topic_id(topic)
    return None if found is None else str(found)


# ---- the group join ------------------------------------------------------------------------


def await_join(consumer: Any, timeout_ms: int) -> None:
    """While the member (re)joins its group, wait for the join in one long call.

    kafka-python 3.0.12 runs a join as a task that ``poll()`` awaits for at most its timeout.
    When a rejoin was triggered by a metadata change (the leader assigned from stale metadata)
    rather than by a rebalance notice, and the task finishes while no ``poll()`` awaits it,
    nothing ever takes its result: the member stays out of the group, heartbeats off, until
    its session expires. Short polls (100 ms) leave a gap at every poll; awaiting the join here
    for seconds leaves almost none, and ``repair_unfinished_join`` mends the rare case that
    still slips through.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None:
        return
    if coordinator.state is not MemberState.STABLE or coordinator.need_rejoin():
        coordinator.poll(timeout_ms=timeout_ms)


def repair_unfinished_join(consumer: Any) -> bool:
    """Make kafka-python take up a join whose result nothing took (see ``await_join``).

    The member asks to rejoin; the group goes through one more (quick) rebalance instead of
    waiting for this member's session to expire. True when it asked.
    """
    coordinator: Any = getattr(consumer, "_coordinator", None)
    task = getattr(coordinator, "_join_task", None)
    if coordinator is None or task is None or not getattr(task, "is_done", False):
        return False
    if coordinator.need_rejoin():
        return False
    coordinator.request_rejoin()
    return True


def is_group_leader(consumer: Any) -> bool:
    """This member computed the group's assignment (and so watches the topic's metadata).

    True when unknown: the caller then skips a check it needs only for followers.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    return coordinator is None or bool(getattr(coordinator, "_is_leader", True))


# ---- a failed login ------------------------------------------------------------------------


class FailureWatch(logging.Handler):
    """Watches one client's IO thread for a failed SASL authentication or TLS handshake.

    kafka-python 3.0.12 retries a failed SASL authentication or TLS handshake until
    ``bootstrap_timeout_ms`` and then raises a bare ``KafkaTimeoutError``: its bootstrap loop
    catches the error, and its per-node cache of authentication failures is never filled on
    that path. The error does reach the client's log records (on its IO thread
    ``kafka-io-<client_id>``); this handler takes it from there, remembers it, and closes the
    client's connection manager so the bootstrap ends at once: one refused attempt instead of
    a retry storm until the timeout. Needs kafka-python's WARNING records enabled (the CLI
    does); without them the failure surfaces after ``bootstrap_timeout_ms`` as
    ``BrokerUnavailableError``.

    kafka-python 3.0.12 also drops bytes that arrive together with the connection's end (its
    transport's ``_sock_recv`` returns the error and the loop discards the data), and a broker
    sends its SASL error response right before it closes: most refused logins therefore show
    up only as "socket disconnected". So with SASL the handler also counts connections that
    the broker closed after answering ApiVersions but before the connection's set-up (the SASL
    exchange) finished: a live broker hanging up in the middle of a login. Two of those in a
    row end the probe as a refused login (``sasl_hangups``). It also counts the bootstrap
    attempts that ended in "socket disconnected" (``disconnects``) and those that failed any
    other way (``others``, e.g. connection refused), for the caller's last word after the
    timeout.
    """

    def __init__(self, client_id: str, sasl: bool = False) -> None:
        super().__init__(logging.DEBUG)
        self.thread_name = f"kafka-io-{client_id}"
        self.sasl = sasl
        self.sasl_hangups = 0
        self.kind: str | None = None
        self.error: BaseException | None = None
        self.client: Any = None
        self.disconnects = 0
        self.others = 0

    def make_client(self, **configs: Any) -> Any:
        """``kafka_client`` factory: the default client, kept so it can be stopped."""
        from kafka.net.compat import KafkaNetClient

        self.client = KafkaNetClient(**configs)
        return self.client

    def emit(self, record: logging.LogRecord) -> None:
        if self.kind is not None or record.threadName != self.thread_name:
            return
        args = record.args if isinstance(record.args, tuple) else ()
        if self.sasl and "Connection lost" in str(record.msg) and args:
            if _lost_during_login(args[0]):
                self.sasl_hangups += 1
                if self.sasl_hangups >= 2:
                    self._fail(
                        "auth",
                        kerrors.KafkaConnectionError(
                            f"the broker closed {self.sasl_hangups} connections in a row "
                            "during the SASL login (refused credentials, or a mechanism "
                            "this listener does not enable)"
                        ),
                    )
                    return
            else:
                self.sasl_hangups = 0
        for arg in args:
            kind = classify_failure(arg)
            if kind is None:
                if isinstance(arg, BaseException) and str(record.msg).startswith(
                    "Bootstrap connection to"
                ):
                    if "socket disconnected" in str(arg):
                        self.disconnects += 1
                    else:
                        self.others += 1
                continue
            assert isinstance(arg, BaseException)
            self._fail(kind, arg)
            return

    def _fail(self, kind: str, error: BaseException) -> None:
        self.kind, self.error = kind, error
        manager = getattr(self.client, "_manager", None)
        if manager is not None:
            try:
                manager.close()  # ends the bootstrap loop: no more attempts
            except Exception:  # pragma: no cover - then the bootstrap times out instead
                log.debug("could not end the bootstrap early", exc_info=True)

    def __enter__(self) -> FailureWatch:
        logging.getLogger("kafka").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("kafka").removeHandler(self)

    def stop_client(self) -> None:
        """Stop the IO thread of a client whose constructor failed (it would leak otherwise)."""
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # pragma: no cover - best effort
                log.debug("closing a failed probe client", exc_info=True)


def _lost_during_login(conn: object) -> bool:
    """True for a kafka-python connection that the broker closed mid-set-up, after ApiVersions.

    ``broker_version_data`` is set once ApiVersions answered on this connection (a bootstrap
    connection starts without it); a failed ``init_future`` means the set-up that follows
    (the SASL exchange) never finished.
    """
    try:
        init = getattr(conn, "init_future", None)
        return (
            getattr(conn, "broker_version_data", None) is not None
            and init is not None
            and bool(init.failed())
        )
    except Exception:  # pragma: no cover - a kafka-python without these attributes
        return False


# ---- bounded decompression -------------------------------------------------------------------
#
# kafka-python 3.0.12 inflates a compressed record batch whole, in one call of its codec
# (``DefaultRecordBatch._maybe_uncompress``, ``LegacyRecordBatch._decompress``), and its fetch
# limits count compressed bytes: one batch of 1 MB of zstd can inflate to gigabytes. Nothing
# public bounds that, so ``bounded_inflation`` replaces those two methods (once per process):
# inflation goes in chunks and stops one byte past the bound. A v2 batch past the bound
# becomes an empty batch, which kafka-python's fetcher steps over as it does a compacted-away
# one (its position moves to the batch's next offset), and is recorded as a ``RefusedBatch``.
# A legacy (v0/v1) message set cannot be stepped over (the fetcher moves past records only):
# past the bound it raises ``UnreadableBatchError``, as does a batch whose data does not
# inflate at all (corrupt, or a zstd window past the codec's 128 MiB limit). Threads outside
# ``bounded_inflation`` (the dead-letter and admin clients, tools) get kafka-python's own
# behaviour.

#: Inflated output is produced in pieces of this size: a refused batch costs the bound plus
#: one piece at most.
_PIECE = 1 << 20
_GZIP, _SNAPPY, _LZ4, _ZSTD = 1, 2, 3, 4
_CODEC_NAMES = {_GZIP: "gzip", _SNAPPY: "snappy", _LZ4: "lz4", _ZSTD: "zstd"}


class _Reading(threading.local):
    """What the thread reading record batches now is bounded by, and where refusals go."""

    bound: int | None = None
    refused: list[RefusedBatch] | None = None
    topic = ""
    partition = -1


_reading = _Reading()
_install_lock = threading.Lock()
_installed = False


@contextlib.contextmanager
def bounded_inflation(bound: int, refused: list[RefusedBatch]) -> Iterator[None]:
    """Within it, record batches this thread reads inflate to at most ``bound`` bytes each.

    A batch past the bound is not inflated: kafka-python's position moves past it and it is
    appended to ``refused``. Wrap every ``KafkaConsumer.poll`` of a shard in it.
    """
    _install()
    saved = (_reading.bound, _reading.refused)
    _reading.bound, _reading.refused = bound, refused
    try:
        yield
    finally:
        _reading.bound, _reading.refused = saved


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        from kafka.consumer.fetcher import Fetcher
        from kafka.record.default_records import DefaultRecordBatch
        from kafka.record.legacy_records import LegacyRecordBatch

        partition_records = getattr(Fetcher, "PartitionRecords", None)
        unpack = getattr(partition_records, "_unpack_records", None)
        if partition_records is not None and unpack is not None:

            def _unpack_records(
                self: Any, tp: Any, records: Any, key_des: Any, value_des: Any
            ) -> Any:
                return unpack(self, tp, _Batches(records, tp), key_des, value_des)

            partition_records._unpack_records = _unpack_records
        else:  # pragma: no cover - another kafka-python: refusals name no partition
            log.warning("kafka-python without Fetcher.PartitionRecords._unpack_records")
        uncompress = DefaultRecordBatch._maybe_uncompress
        decompress = LegacyRecordBatch._decompress

        def _maybe_uncompress(self: Any) -> None:
            bound, codec = _reading.bound, self.compression_type
            if bound is None or self._decompressed or codec not in _INFLATERS:
                uncompress(self)
                return
            self._assert_has_codec(codec)
            data = memoryview(self._buffer)[self._pos :]
            try:
                inflated = _inflate(codec, data, bound)
            except Exception as exc:  # corrupt data: name the batch (kafka-python does not)
                raise UnreadableBatchError(
                    _reading.topic,
                    _reading.partition,
                    int(self.base_offset),
                    f"{len(data)} bytes of {_CODEC_NAMES[codec]} that do not inflate ({exc!r})",
                ) from exc
            if inflated is None:
                _refuse(self, len(data), codec, bound)
                inflated = bytearray()
                self._num_records = 0
            data.release()
            self._buffer, self._pos, self._decompressed = inflated, 0, True

        def _decompress(self: Any, key_offset: int) -> Any:
            bound, codec = _reading.bound, self.compression_type
            if bound is None or codec not in _INFLATERS or (codec == _LZ4 and self._magic == 0):
                return decompress(self, key_offset)
            key_size = struct.unpack_from(">i", self._buffer, key_offset)[0]
            pos = key_offset + 4 + max(key_size, 0)
            value_size = struct.unpack_from(">i", self._buffer, pos)[0]
            if value_size < 0:
                return decompress(self, key_offset)  # raises CorruptRecordError
            self._assert_has_codec(codec)
            inflated = _inflate(codec, self._buffer[pos + 4 : pos + 4 + value_size], bound)
            if inflated is None:
                raise UnreadableBatchError(
                    _reading.topic,
                    _reading.partition,
                    self._offset,
                    f"a legacy (v0/v1) message set of {value_size} bytes of "
                    f"{_CODEC_NAMES[codec]} inflates past max_batch_inflated_bytes={bound}, and "
                    "kafka-python cannot skip a legacy message set (a decompression bomb, or a "
                    "batch larger than the bound: raise --max-batch-inflated-bytes if it is "
                    "genuine)",
                )
            return inflated

        DefaultRecordBatch._maybe_uncompress = _maybe_uncompress
        LegacyRecordBatch._decompress = _decompress


class _Batches:
    """A fetch's records (kafka-python's ``MemoryRecords``) that tell the thread which partition
    the batch it hands out next is of: the batch inflates right after, before any other
    partition's batch is read."""

    __slots__ = ("_records", "_tp")

    def __init__(self, records: Any, tp: Any) -> None:
        self._records = records
        self._tp = tp

    def next_batch(self) -> Any:
        _reading.topic, _reading.partition = self._tp.topic, self._tp.partition
        return self._records.next_batch()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)


def _refuse(batch: Any, compressed: int, codec: int, bound: int) -> None:
    refused = RefusedBatch(
        topic=_reading.topic,
        partition=_reading.partition,
        base_offset=int(batch.base_offset),
        last_offset=int(batch.last_offset),
        compressed_bytes=compressed,
        records=int(batch.records_count),
        codec=_CODEC_NAMES[codec],
        bound=bound,
    )
    log.debug("refused to inflate %s", refused)
    if _reading.refused is not None:
        _reading.refused.append(refused)


def _inflate(codec: int, data: Any, bound: int) -> bytearray | None:
    """``data`` inflated with ``codec``, or None when that is more than ``bound`` bytes."""
    inflated: bytearray | None = _INFLATERS[codec](data, bound)
    return inflated


def _gunzip(data: Any, bound: int) -> bytearray | None:
    out = bytearray()
    rest = bytes(data)
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = rest
        while not inflater.eof:
            piece = inflater.decompress(pending, min(_PIECE, bound + 1 - len(out)))
            out += piece
            if len(out) > bound:
                return None
            pending = inflater.unconsumed_tail
            if not pending and not piece and not inflater.eof:
                raise EOFError("gzip: compressed data ended before the end-of-stream marker")
        rest = inflater.unused_data.lstrip(b"\x00")  # gzip allows zero padding after a member
    return out


def _unzstd(data: Any, bound: int) -> bytearray | None:
    out = bytearray()
    decompressor = kcodec.zstd.ZstdDecompressor()
    with decompressor.stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
        while piece := reader.read(min(_PIECE, bound + 1 - len(out))):
            out += piece
            if len(out) > bound:
                return None
    return out


def _unlz4(data: Any, bound: int) -> bytearray | None:
    out = bytearray()
    pending = bytes(data)
    inflater = kcodec.lz4.LZ4FrameDecompressor()
    while True:
        out += inflater.decompress(pending, max_length=min(_PIECE, bound + 1 - len(out)))
        pending = b""
        if len(out) > bound:
            return None
        if inflater.eof:
            pending = inflater.unused_data
            if not pending:
                return out
            inflater = kcodec.lz4.LZ4FrameDecompressor()
        elif inflater.needs_input:
            raise RuntimeError("lz4: compressed data ended before the end of the frame")


def _unsnappy(data: Any, bound: int) -> bytearray | None:
    """Snappy blocks state their inflated length first: add them up before inflating."""
    payload = bytes(data)
    total = 0
    if kcodec._detect_xerial_stream(payload):  # blocks of [int32 size][snappy block]
        cursor = 16
        while cursor + 4 <= len(payload):
            size = struct.unpack_from("!i", payload, cursor)[0]
            total += _varint(payload, cursor + 4)
            cursor += 4 + max(size, 0)
    else:
        total = _varint(payload, 0)
    if total > bound:
        return None
    return bytearray(kcodec.snappy_decode(payload))


def _varint(buf: bytes, pos: int) -> int:
    """The little-endian base-128 length that opens a snappy block (0 if there is none)."""
    value = shift = 0
    for byte in buf[pos : pos + 5]:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    return value


#: The codecs inflated here; the others (lz4 through ``lz4f`` or ``lz4framed``) as kafka-python
#: does, without a bound.
_INFLATERS: dict[int, Any] = {_GZIP: _gunzip}
if kcodec.snappy is not None:
    _INFLATERS[_SNAPPY] = _unsnappy
if getattr(kcodec.lz4, "LZ4FrameDecompressor", None) is not None:
    _INFLATERS[_LZ4] = _unlz4
if kcodec.zstd is not None:
    _INFLATERS[_ZSTD] = _unzstd


async def committed_async(consumer: Any, tps: list[Any], timeout_ms: int) -> dict[Any, Any]:
    """The group's committed offsets of ``tps`` ({TopicPartition: OffsetAndMetadata}), read
    from within a rebalance listener.

    kafka-python 3 runs listeners on its IO thread, where the blocking
    ``KafkaConsumer.committed`` raises ("Cannot block on net.run() from the IO thread"); an
    ``AsyncConsumerRebalanceListener`` awaits the coordinator's async variant instead.
    """
    coordinator = consumer._coordinator
    found: dict[Any, Any] = await coordinator.fetch_committed_offsets_async(
        tps, timeout_ms=timeout_ms
    )
    return found


async def await_commit(consumer: Any, future: Any, timeout_ms: int) -> None:
    """Wait, within a rebalance listener, for a commit sent from it to be answered.

    A commit sent by ``commit_async`` in a cooperative revocation otherwise races the rejoin
    kafka-python requests right after the listener, and fails with RebalanceInProgress:
    the partition then moves on without it. Failures are the commit callback's to report.
    """
    with contextlib.suppress(Exception):
        await consumer._coordinator._manager.wait_for(future, timeout_ms)
