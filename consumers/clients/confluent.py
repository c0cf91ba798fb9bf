"""confluent-kafka (librdkafka) as a ``ConsumerClient``: fetch, decompression and parsing in C.

Facts this adapter is built on (confluent-kafka 2.16.1, librdkafka 2.16.0, Kafka 4.3; measured
here, see KAFKA.md): every call on a Consumer must come from the thread that polls it (2.16
serializes calls across threads and a second thread can wait for ever); rebalance, commit,
error and statistics callbacks all run inside ``consume()`` on that thread; start offsets must
be set on the partitions passed to ``(incremental_)assign`` (a ``seek`` in the callback fails);
``position()`` is -1001 until a record or marker was read; the cached watermark is the high
watermark, and the last stable offset comes with the statistics callback; fatal errors (a
fenced static member) arrive as a message error with code ``_FATAL``.

A batch librdkafka cannot inflate (zstd past ``receive.message.max.bytes``, which is set to the
inflation bound; a corrupt batch) comes back as a ``_BAD_COMPRESSION`` error naming the batch's
first offset only, and librdkafka fetches it again for ever. The adapter asks kafka-python
where the batch ends (``kafka_python.probe_batch``, bounded too): past the bound it seeks past
the batch and reports it as refused; otherwise it stops with ``UnreadableBatchError``.
librdkafka inflates gzip, lz4 and snappy batches whole, without a bound.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from operator import itemgetter
from typing import Any, Literal

import numpy as np

from consumers.block import RecordBlock
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
    UnreadableBatchError,
)
from consumers.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ClientFatalError,
    ConfigError,
    FencedError,
    GroupProtocolError,
    TlsHandshakeError,
)
from consumers.logs import quiet
from consumers.redact import protect
from consumers.settings import ConsumerSettings, SecuritySettings

try:
    import confluent_kafka as ck
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    from consumers.install import pip_install

    raise ConfigError(
        "kafka_client",
        "confluent",
        f"needs the confluent-kafka package: {pip_install('confluent')}",
    ) from exc

__all__ = ["ConfluentClient", "consumer_config", "open_client", "read_values"]

log = logging.getLogger(__name__)

_OFFSET_INVALID = ck.OFFSET_INVALID
_VALUE, _PARTITION, _OFFSET = ck.Message.value, ck.Message.partition, ck.Message.offset
_TIMESTAMP, _ERROR = ck.Message.timestamp, ck.Message.error
_SECOND = itemgetter(1)
#: With no partition assigned, how often the topic's existence is checked.
_TOPIC_CHECK_S = 5.0
#: How long an assignment waits for the group's committed offsets (the start rule's input).
_COMMITTED_TIMEOUT_MS = 5000
#: The receive.message.max.bytes floors above the inflation bound already logged.
_FLOORS_NOTED: set[int] = set()


def security_config(security: SecuritySettings) -> dict[str, Any]:
    """librdkafka's names for the SASL/TLS options (secrets revealed only here)."""
    out: dict[str, Any] = {"security.protocol": security.security_protocol}
    if security.sasl_mechanism:
        out["sasl.mechanism"] = security.sasl_mechanism
        out["sasl.username"] = security.sasl_plain_username
        assert security.sasl_plain_password is not None
        out["sasl.password"] = security.sasl_plain_password.get()
    if security.security_protocol.endswith("SSL"):
        out["ssl.endpoint.identification.algorithm"] = (
            "https" if security.ssl_check_hostname else "none"
        )
        for ours, theirs in (
            ("ssl_cafile", "ssl.ca.location"),
            ("ssl_certfile", "ssl.certificate.location"),
            ("ssl_keyfile", "ssl.key.location"),
        ):
            if getattr(security, ours):
                out[theirs] = getattr(security, ours)
        if security.ssl_password is not None:
            out["ssl.key.password"] = security.ssl_password.get()
    return out


def consumer_config(settings: ConsumerSettings, shard_index: int) -> dict[str, Any]:
    """librdkafka settings for one shard (callbacks added by the client). Auto-commit is off.

    >>> s = ConsumerSettings(bootstrap_servers="127.0.0.1:9092", topic="t", client="confluent")
    >>> cfg = consumer_config(s, 0)
    >>> cfg["enable.auto.commit"], cfg["partition.assignment.strategy"], cfg["isolation.level"]
    (False, 'cooperative-sticky', 'read_committed')
    """
    cfg: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": f"{settings.client_id}-{settings.worker_id}-{shard_index}",
        # librdkafka needs a group id even to assign() (an empty one aborts the process): a
        # group-less consumer (evaluation, a replay) gets a throwaway id it never commits to.
        "group.id": settings.group_id or f"streamer-nogroup-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # The shard applies auto_offset_reset itself (loudly when records were lost upstream).
        "auto.offset.reset": "error",
        "isolation.level": settings.isolation_level,
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "fetch.max.bytes": settings.fetch_max_bytes,
        "max.partition.fetch.bytes": settings.max_partition_fetch_bytes,
        # librdkafka prefetches up to this much per consumer (64 MiB by default).
        "queued.max.messages.kbytes": max(1024, settings.fetch_max_bytes // 1024),
        # Once that prefetch is full librdkafka waits this long before it looks again (1 s by
        # default): a shard that drains 50 MiB in a third of a second then starved for the
        # rest of it (a gap of 0.7 s every 100,000 records of 1 KiB; benchmarks/README.md).
        "fetch.queue.backoff.ms": 50,
        # librdkafka's only bound on inflating a batch (zstd only); it must exceed
        # fetch.max.bytes by 512 bytes, which is then the bound for zstd batches.
        "receive.message.max.bytes": min(
            max(settings.inflate_bound, settings.fetch_max_bytes + 512), 2**31 - 1
        ),
        "metadata.max.age.ms": settings.metadata_max_age_ms,
        "socket.timeout.ms": settings.request_timeout_ms,
        "statistics.interval.ms": 1000 if settings.isolation_level == "read_committed" else 0,
        "allow.auto.create.topics": False,
    }
    if settings.mode == "group":
        cfg["group.instance.id"] = settings.group_instance_id(shard_index)
        if settings.group_protocol == "consumer":
            cfg["group.protocol"] = "consumer"  # KIP-848: the broker assigns and times out
        else:
            cfg["partition.assignment.strategy"] = settings.partition_assignment_strategy
            cfg["session.timeout.ms"] = settings.session_timeout_ms
            cfg["heartbeat.interval.ms"] = settings.heartbeat_interval_ms
    cfg.update(security_config(settings.security))
    return cfg


def _raise_config_error(settings: ConsumerSettings, exc: BaseException) -> None:
    text = str(exc)
    for secret in (settings.security.sasl_plain_password, settings.security.ssl_password):
        if secret is not None and secret.get():
            text = text.replace(secret.get(), "***")
    raise ConfigError("kafka_client", "confluent", f"librdkafka refused the settings: {text}")


def open_client(settings: ConsumerSettings, shard_index: int) -> ConfluentClient:
    # librdkafka logs a refused connection at ERROR about 20 times a second while a broker is
    # down: at most WARNING, and each message once per 10 s (the shard says what it does).
    quiet("confluent_kafka", fold_numbers=True, max_level=logging.WARNING)
    floor = settings.fetch_max_bytes + 512
    if settings.inflate_bound < floor and floor not in _FLOORS_NOTED:
        _FLOORS_NOTED.add(floor)
        log.info(
            "librdkafka inflates zstd batches up to receive.message.max.bytes=%d (its floor: "
            "fetch_max_bytes + 512), more than max_batch_inflated_bytes=%d",
            floor,
            settings.inflate_bound,
        )
    return ConfluentClient(settings, shard_index)


def read_values(
    settings: ConsumerSettings, *, timeout_seconds: float = 600.0
) -> Iterator[list[bytes]]:
    """The values of ``settings.partitions`` from their beginning, one list per ``consume``,
    in a plain confluent-kafka loop (the benchmark's reference for the client's cost)."""
    protect(settings.security)
    cfg = consumer_config(settings, 0)
    cfg.pop("group.instance.id", None)
    cfg["logger"] = logging.getLogger("confluent_kafka")  # not librdkafka's own stderr lines
    consumer = ck.Consumer(cfg)
    try:
        consumer.assign(
            [
                ck.TopicPartition(settings.topic, p, ck.OFFSET_BEGINNING)
                for p in settings.partitions or ()
            ]
        )
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            msgs = consumer.consume(settings.max_poll_records, 0.2)
            if msgs:
                yield [v for v in map(_VALUE, msgs) if v is not None]
    finally:
        consumer.close()


class ConfluentClient:
    """A confluent-kafka Consumer of one topic behind the ``ConsumerClient`` interface."""

    name = "confluent"

    def __init__(self, settings: ConsumerSettings, shard_index: int) -> None:
        self.settings = settings
        self.shard_index = shard_index
        self.topic = settings.topic
        self._cooperative = settings.mode == "group" and (
            settings.group_protocol == "consumer"
            or settings.partition_assignment_strategy == "cooperative-sticky"
        )
        self._listener: RebalanceListener | None = None
        self._assigned: set[int] = set()
        self._paused: set[int] = set()
        self._assigned_once = settings.mode != "group"
        self._in_callback = False
        self._pending: BaseException | None = None  # raised by the next poll()
        self._commit_callback: CommitCallback | None = None
        self._stable: dict[int, int] | None = None  # from the statistics callback
        self._topic_missing = False
        self._topic_checked = time.monotonic()
        self._partitions: frozenset[int] | None = None
        #: Batches librdkafka could not inflate: {partition: (first offset, its error)}, the
        #: batches skipped since the last ``refused_batches``, and per partition the offset
        #: after the last one skipped (librdkafka's position is unknown after a seek).
        self._unreadable: dict[int, tuple[int, str]] = {}
        self._refused: list[RefusedBatch] = []
        self._skipped: dict[int, int] = {}
        protect(settings.security)
        cfg = consumer_config(settings, shard_index)
        cfg.update(
            on_commit=self._on_commit,
            error_cb=self._on_error,
            stats_cb=self._on_stats,
            logger=logging.getLogger("confluent_kafka"),
        )
        try:
            self.consumer = ck.Consumer(cfg)
        except ck.KafkaException as exc:
            _raise_config_error(settings, exc)

    def _tp(self, partition: int, offset: int = _OFFSET_INVALID) -> Any:
        return ck.TopicPartition(self.topic, partition, offset)

    # ---- membership ------------------------------------------------------------------------

    def subscribe(self, listener: RebalanceListener) -> None:
        self._listener = listener
        self.consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def assign(self, partitions: list[int], starts: dict[int, int] | None = None) -> None:
        starts = starts or {}
        self.consumer.assign([self._tp(p, starts.get(p, _OFFSET_INVALID)) for p in partitions])
        self._assigned = set(partitions)
        self._skipped.clear()

    def _on_assign(self, consumer: Any, tps: list[Any]) -> None:
        self._in_callback = True
        try:
            parts = [tp.partition for tp in tps]
            if not self._cooperative:
                self._assigned = set()
                self._skipped.clear()
            for p in parts:
                self._skipped.pop(p, None)
            self._assigned |= set(parts)
            self._assigned_once = True
            group: dict[int, GroupCommit] | None = None
            if parts and self.settings.group_id:
                try:  # librdkafka answers this from its own threads: allowed in the callback
                    group = self.committed(parts, _COMMITTED_TIMEOUT_MS)
                except RetriableClientError as exc:  # the shard starts from what it knows
                    log.warning(
                        "shard %d: the group's committed offsets could not be read at "
                        "assignment: %s",
                        self.shard_index,
                        exc,
                    )
            seeks = self._listener.assigned(parts, group) if self._listener is not None else {}
            for tp in tps:
                if tp.partition in seeks:
                    tp.offset = seeks[tp.partition]  # a seek in this callback would fail
            log.debug(
                "shard %d: assign %s", self.shard_index, [(tp.partition, tp.offset) for tp in tps]
            )
            if self._cooperative:
                consumer.incremental_assign(tps)
            else:
                consumer.assign(tps)
        except BaseException as exc:  # out of consume() it would lose the batch: raise later
            self._pending = self._pending or exc
        finally:
            self._in_callback = False

    def _revoke(self, consumer: Any, tps: list[Any], *, lost: bool) -> None:
        self._in_callback = True
        try:
            parts = [tp.partition for tp in tps]
            if self._listener is not None:
                self._listener.revoked(parts, lost=lost)
            self._assigned -= set(parts)
            self._paused -= set(parts)
            for p in parts:
                self._skipped.pop(p, None)
            if self._cooperative:
                # Only what librdkafka still holds: a partition it dropped already (a
                # rebalance racing a lost session) is refused with _INVALID_ARG "not in the
                # current assignment", which failed the shard (seen once in CI).
                held = {(tp.topic, tp.partition) for tp in consumer.assignment()}
                tps = [tp for tp in tps if (tp.topic, tp.partition) in held]
                if tps:
                    consumer.incremental_unassign(tps)
            else:
                consumer.unassign()
        except BaseException as exc:
            self._pending = self._pending or exc
        finally:
            self._in_callback = False

    def _on_revoke(self, consumer: Any, tps: list[Any]) -> None:
        self._revoke(consumer, tps, lost=False)

    def _on_lost(self, consumer: Any, tps: list[Any]) -> None:
        self._revoke(consumer, tps, lost=True)

    def group_state(self) -> GroupState:
        # librdkafka tells no generation; within one process the shards' barrier only needs
        # every shard to have had its first assignment.
        return GroupState(self._assigned_once, 0 if self._assigned_once else None)

    def before_poll(self) -> None:
        return None

    def upkeep(self, shard: ShardContext) -> None:
        return None  # librdkafka (or the broker, KIP-848) follows the topic's metadata itself

    def repair_rejoin(self) -> None:
        return None

    def detach(self) -> None:
        self._listener = None

    # ---- callbacks (inside consume(), on the poller thread) ---------------------------------

    def _on_commit(self, error: Any, tps: list[Any]) -> None:
        callback = self._commit_callback
        if callback is None:
            return
        offsets = {tp.partition: tp.offset for tp in tps if tp.topic == self.topic}
        callback(offsets, None if error is None else RetriableClientError(str(error)))

    def _on_error(self, error: Any) -> None:
        code = error.code()
        if code == ck.KafkaError.INCONSISTENT_GROUP_PROTOCOL:
            self._pending = self._pending or GroupProtocolError(
                self.settings.group_id, self.settings.partition_assignment_strategy
            )
            return
        if code in (ck.KafkaError._AUTHENTICATION, ck.KafkaError._SSL):
            # A refused login or certificate is final, as at the start-up probe: retrying would
            # not help, and librdkafka reports a repeated identical error only once anyway.
            # (The probe catches most; this is a password or certificate changed meanwhile.)
            kind = TlsHandshakeError if code == ck.KafkaError._SSL else AuthenticationError
            self._pending = self._pending or kind(self.settings.bootstrap_servers, error.str())
            return
        if error.fatal():
            self._pending = self._pending or ClientFatalError("confluent-kafka", error.str())
            return
        log.debug("shard %d: confluent-kafka: %s", self.shard_index, error.str())

    def _on_stats(self, text: str) -> None:
        try:
            parts = json.loads(text)["topics"][self.topic]["partitions"]
        except (KeyError, ValueError):
            return
        self._stable = {
            int(p): int(d["ls_offset"])
            for p, d in parts.items()
            if int(p) >= 0 and int(d.get("ls_offset", -1)) >= 0
        }

    # ---- records -----------------------------------------------------------------------------

    def poll(self, timeout_ms: int, serial: int) -> RecordBlock | None:
        if self._pending is not None:
            error, self._pending = self._pending, None
            raise error
        # What is queued now, else wait for the first record and take what came with it:
        # consume(n, timeout) would hold records that are here until n came or the timeout
        # passed (up to poll_timeout_ms of latency on every block of a stream slower than n).
        most = self.settings.max_poll_records
        msgs = self.consumer.consume(most, 0)
        if not msgs and self._pending is None:  # a callback's error: raised below, at once
            msgs = self.consumer.consume(1, timeout_ms / 1000)
            if msgs and most > 1:
                msgs.extend(self.consumer.consume(most - 1, 0))
        if self._pending is not None and not msgs:
            error, self._pending = self._pending, None
            raise error
        if any(map(_ERROR, msgs)):
            msgs = self._take_errors(msgs)
        if self._unreadable:
            self._skip_unreadable()
        if not msgs:
            return None
        n = len(msgs)
        return RecordBlock(
            self.topic,
            [v if v is not None else b"" for v in map(_VALUE, msgs)],
            np.fromiter(map(_PARTITION, msgs), np.int32, n),
            np.fromiter(map(_OFFSET, msgs), np.int64, n),
            np.fromiter(map(_SECOND, map(_TIMESTAMP, msgs)), np.int64, n),
            sum(len(v) for v in map(_VALUE, msgs) if v is not None),
            serial,
        )

    def _take_errors(self, msgs: list[Any]) -> list[Any]:
        """The records of a batch; its errors become the next poll()'s exception (never
        raised now: the records polled with them would be lost)."""
        good: list[Any] = []
        no_offset: list[int] = []
        out_of_range: dict[int, int] = {}
        for m in msgs:
            error = m.error()
            if error is None:
                good.append(m)
                continue
            code = error.code()
            if code == ck.KafkaError._AUTO_OFFSET_RESET:
                if m.offset() is None or m.offset() < 0:
                    no_offset.append(m.partition())
                else:
                    out_of_range[m.partition()] = m.offset()
            elif code == ck.KafkaError.INCONSISTENT_GROUP_PROTOCOL:
                self._pending = GroupProtocolError(
                    self.settings.group_id, self.settings.partition_assignment_strategy
                )
            elif code == ck.KafkaError._FATAL or error.fatal():
                text = error.str()
                if "fenced" in text.lower() or "instance id" in text.lower():
                    self._pending = FencedError(self.settings.group_instance_id(self.shard_index))
                else:
                    self._pending = ClientFatalError("confluent-kafka", text)
            elif code in (ck.KafkaError.UNKNOWN_TOPIC_OR_PART, ck.KafkaError._UNKNOWN_TOPIC):
                self._topic_missing = True
            elif code == ck.KafkaError._BAD_COMPRESSION:
                p, offset = m.partition(), m.offset()
                # Once skipped, errors of the same batch still queued are stale.
                if p in self._assigned and offset is not None and offset >= self._skipped.get(p, 0):
                    self._unreadable.setdefault(p, (offset, error.str()))
            elif code == ck.KafkaError._MAX_POLL_EXCEEDED:
                log.warning("shard %d: confluent-kafka: %s", self.shard_index, error.str())
            else:
                self._pending = self._pending or RetriableClientError(error.str())
        if self._pending is None and out_of_range:
            self._pending = OffsetsOutOfRange(out_of_range)
        elif self._pending is None and no_offset:
            self._pending = NoCommittedOffset(no_offset)
        return good

    def _skip_unreadable(self) -> None:
        """Seek past each batch librdkafka could not inflate that inflates past the bound
        (kafka-python says where it ends); any other is an ``UnreadableBatchError``."""
        from consumers.clients.kafka_python import probe_batch

        unreadable, self._unreadable = self._unreadable, {}
        for p, (offset, text) in sorted(unreadable.items()):
            try:
                found = probe_batch(self.settings, p, offset)
            except RetriableClientError as exc:
                self._pending = self._pending or exc  # librdkafka reports the batch again
                continue
            except Exception as exc:  # kafka-python cannot inflate it either: corrupt
                self._pending = self._pending or UnreadableBatchError(
                    self.topic, p, offset, f"librdkafka: {text}; kafka-python: {exc}"
                )
                continue
            if found is None:
                self._pending = self._pending or UnreadableBatchError(
                    self.topic,
                    p,
                    offset,
                    f"librdkafka cannot inflate it ({text}) although it inflates within "
                    f"max_batch_inflated_bytes={self.settings.inflate_bound}: librdkafka inflates "
                    "a zstd batch that does not state its inflated size (the Java producer's) "
                    "into guessed sizes, each 3 times the last, and gives up at the last below "
                    "receive.message.max.bytes (the bound), which may be a third of it. Raise "
                    "--max-batch-inflated-bytes to 3 times the batch's inflated size, or read "
                    "the topic with --kafka-client kafka-python",
                )
                continue
            if p not in self._assigned:
                continue  # revoked meanwhile: its next owner meets the batch again
            self.consumer.seek(self._tp(p, found.last_offset + 1))
            self._skipped[p] = found.last_offset + 1
            self._refused.append(found)

    def refused_batches(self) -> list[RefusedBatch]:
        refused, self._refused = self._refused, []
        return refused

    # ---- positions -------------------------------------------------------------------------

    def positions(self) -> dict[int, int]:
        if not self._assigned:
            return {}
        found = self.consumer.position([self._tp(p) for p in sorted(self._assigned)])
        out = {tp.partition: tp.offset for tp in found if tp.offset >= 0}
        # After the seek past a refused batch librdkafka knows no position until a record
        # comes: the skip is where the partition is (a commit may move there).
        for p, skipped in self._skipped.items():
            if p in self._assigned and skipped > out.get(p, -1):
                out[p] = skipped
        return out

    def highwaters(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in self._assigned:
            try:
                _low, high = self.consumer.get_watermark_offsets(self._tp(p), cached=True)
            except ck.KafkaException:
                continue
            if high is not None and high >= 0:
                out[p] = high
        return out

    def stable_offsets(self) -> dict[int, int] | None:
        stable, self._stable = self._stable, None
        if stable is None:
            return None
        return {p: o for p, o in stable.items() if p in self._assigned}

    def committed(self, partitions: list[int], timeout_ms: int) -> dict[int, GroupCommit]:
        try:
            found = self.consumer.committed(
                [self._tp(p) for p in partitions], timeout=timeout_ms / 1000
            )
        except ck.KafkaException as exc:
            raise RetriableClientError(f"reading committed offsets failed: {exc}") from exc
        return {
            tp.partition: GroupCommit(tp.offset, tp.metadata or "")
            for tp in found
            if tp.offset >= 0 and tp.error is None
        }

    # ---- flow control ----------------------------------------------------------------------

    def pause(self, partitions: list[int]) -> None:
        parts = [p for p in partitions if p in self._assigned]
        if parts:
            self.consumer.pause([self._tp(p) for p in parts])
            self._paused |= set(parts)

    def resume(self, partitions: list[int]) -> None:
        parts = [p for p in partitions if p in self._paused]
        if parts:
            self.consumer.resume([self._tp(p) for p in parts])
            self._paused -= set(parts)

    def paused(self) -> set[int]:
        return set(self._paused)

    def seek(self, partition: int, offset: int) -> None:
        self._skipped.pop(partition, None)
        self.consumer.seek(self._tp(partition, offset))

    def seek_to(self, partitions: list[int], where: Literal["earliest", "latest"]) -> None:
        for p in partitions:
            self._skipped.pop(p, None)
        # Only what librdkafka still holds: a cooperative rebalance may have taken a partition
        # since the poll that asked for the reset (its next owner resets it), and unassigning
        # it fails with _INVALID_ARG "not in the current assignment" (seen once in CI).
        held = {tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic}
        partitions = [p for p in partitions if p in held]
        if not partitions:
            return
        # After an offset-reset error the partition stops fetching and a seek fails (_STATE):
        # assign it again from the chosen end. Incrementally where librdkafka allows it (no
        # group, or a cooperative one); an eager group takes the whole assignment, the other
        # partitions at their positions.
        offset = ck.OFFSET_BEGINNING if where == "earliest" else ck.OFFSET_END
        tps = [self._tp(p, offset) for p in partitions]
        if self._cooperative or self.settings.mode != "group":
            self.consumer.incremental_unassign([self._tp(p) for p in partitions])
            self.consumer.incremental_assign(tps)
            return
        others = sorted((self._assigned & held) - set(partitions))
        kept = self.consumer.position([self._tp(p) for p in others]) if others else []
        self.consumer.assign(
            [
                self._tp(tp.partition, tp.offset if tp.offset >= 0 else _OFFSET_INVALID)
                for tp in kept
            ]
            + tps
        )

    # ---- commits ---------------------------------------------------------------------------

    def commit(
        self,
        offsets: dict[int, int],
        *,
        callback: CommitCallback | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        meta = self.settings.commit_metadata_text  # TopicPartition refuses None (a str or left out)
        tps = [
            ck.TopicPartition(self.topic, p, o, meta)
            if meta
            else ck.TopicPartition(self.topic, p, o)
            for p, o in offsets.items()
        ]
        if callback is None or self._in_callback:
            # In a revocation the commit must land before the partitions move on.
            try:
                self.consumer.commit(offsets=tps, asynchronous=False)
            except ck.KafkaException as exc:
                if callback is None:
                    raise RetriableClientError(f"commit failed: {exc}") from exc
                callback(offsets, RetriableClientError(f"commit failed: {exc}"))
                return
            if callback is not None:
                callback(offsets, None)
            return
        self._commit_callback = callback
        self.consumer.commit(offsets=tps, asynchronous=True)

    # ---- the topic -------------------------------------------------------------------------

    def topic_partitions(self, *, refresh: bool = False) -> frozenset[int] | None:
        if self._topic_missing:
            return None
        if not refresh:
            return self._partitions
        try:
            meta = self.consumer.list_topics(self.topic, timeout=5.0)
        except ck.KafkaException as exc:
            raise BrokerUnavailableError(self.settings.bootstrap_servers, str(exc)) from exc
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            self._partitions = None
        else:
            self._partitions = frozenset(topic.partitions)
        return self._partitions

    def topic_gone(self) -> bool:
        """The topic was reported unknown, or (checked every 5 s while nothing is assigned:
        librdkafka revokes a deleted topic's partitions without an error) is not in the
        metadata."""
        if self._topic_missing:
            return True
        now = time.monotonic()
        if self._assigned or now - self._topic_checked < _TOPIC_CHECK_S:
            return False
        self._topic_checked = now
        try:
            meta = self.consumer.list_topics(self.topic, timeout=2.0)
        except ck.KafkaException:
            return False  # the broker is down: that is not a deleted topic
        topic = meta.topics.get(self.topic)
        self._topic_missing = topic is None or topic.error is not None
        return self._topic_missing

    def close(self, timeout_ms: int) -> None:
        self.consumer.close()
