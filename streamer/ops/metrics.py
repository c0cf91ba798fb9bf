"""The worker's Prometheus metrics (DESIGN section 5) on an injected registry."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from consumers.types import KAFKA_ERROR_TYPES, REASONS, KafkaErrorType, Reason

__all__ = [
    "AGE_BUCKETS_SECONDS",
    "COMMIT_BUCKETS_SECONDS",
    "DECODE_ERROR_REASONS",
    "KAFKA_ERROR_TYPES",
    "NAMESPACE",
    "QUEUE_STAGES",
    "STEP_BUCKETS_SECONDS",
    "DecodeErrorReason",
    "KafkaErrorType",
    "Metrics",
    "QueueStage",
    "RebalanceEvent",
]

_log = logging.getLogger(__name__)

NAMESPACE: Final = "streamer"

QueueStage = Literal["shard", "prefetch", "dead_letter"]
RebalanceEvent = Literal["assigned", "revoked", "lost"]

DecodeErrorReason = Reason  # the decode metrics' reason label: the decoder's reasons
DECODE_ERROR_REASONS: Final[tuple[str, ...]] = REASONS
QUEUE_STAGES: Final[tuple[str, ...]] = get_args(QueueStage)
_REBALANCE_EVENTS: Final[tuple[str, ...]] = get_args(RebalanceEvent)
_RESULTS: Final = ("success", "failure")

# How old a record is when trained on: 1 ms (live stream) to 1 day (replaying a backlog).
AGE_BUCKETS_SECONDS: Final[tuple[float, ...]] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 43200.0, 86400.0,
)  # fmt: skip
# A train step or an input wait: 100 us (tiny model on an accelerator) to 60 s.
STEP_BUCKETS_SECONDS: Final[tuple[float, ...]] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
COMMIT_BUCKETS_SECONDS: Final[tuple[float, ...]] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class _BatchHistogram(Collector):
    """A label-less histogram that takes a whole numpy array per call.

    ``Histogram.observe`` costs a Python call and a bucket scan per value; a training batch has
    thousands of records. Here one ``searchsorted`` + ``bincount`` gives exact bucket counts for
    the whole batch and one lock acquisition adds them, so every record age is counted exactly
    (no sampling) at numpy speed. Exposed through the public collector API as a normal
    histogram (``_bucket``/``_count``/``_sum``).
    """

    def __init__(self, name: str, documentation: str, buckets: Iterable[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError(f"{name}: buckets must be sorted, got {bounds}")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._name = name
        self._documentation = documentation
        self._bounds = np.asarray(bounds, dtype=np.float64)
        self._labels = [floatToGoString(b) for b in bounds]
        self._counts = np.zeros(len(bounds), dtype=np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: npt.NDArray[np.float64]) -> None:
        values = values[~np.isnan(values)]  # NaN would fall past +Inf and fit no bucket
        if values.size == 0:
            return
        # side="left": index of the first bound >= value, i.e. Prometheus' "le" bucket.
        idx = np.searchsorted(self._bounds, values, side="left")
        counts = np.bincount(idx, minlength=len(self._bounds))
        total = float(values.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def values(self) -> tuple[list[int], float]:
        """Cumulative bucket counts and the sum, read atomically."""
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            return cumulative, self._sum

    def describe(self) -> Iterable[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._documentation)]

    def collect(self) -> Iterable[HistogramMetricFamily]:
        cumulative, total = self.values()
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric(
            [], buckets=list(zip(self._labels, cumulative, strict=True)), sum_value=total
        )
        return [family]


#: Record timestamps before this (2000-01-01T00:00:00Z, ms) are a producer's clock unset or
#: far behind (1970 when it sends 0), not a record's age: counted as skewed, like the future.
SKEW_FLOOR_MS = 946_684_800_000
#: A partition with records waiting of which nothing trained for this long is left behind
#: (``Metrics.left_behind``): a WARNING, and the status line names it.
LEFT_BEHIND_SECONDS = 30.0


@dataclass
class _PartitionState:
    high_watermark: int = 0
    committed: int = 0
    trained: int = 0
    last_trained_ms: int = -1
    position: int = 0
    #: read_committed: how far the last stable offset was below the high watermark when last
    #: read (the records of transactions still open); 0 under read_uncommitted.
    unstable: int = 0
    #: Where this assignment starts when it does not start at the group's commit (a
    #: checkpoint's offset, --start-from's): the lag counts from here, not from the commit.
    start: int | None = None
    #: The partition's end as the broker last listed it (ListOffsets, every 2 s): a polled
    #: watermark below it is stale (a fetch that stalled reports no new one) and does not
    #: count.
    listed_end: int = 0
    #: When (monotonic) this partition last moved: a record of it trained, or nothing of it
    #: was waiting; since its assignment at first (``Metrics.left_behind``).
    moved_at: float = field(default_factory=time.monotonic)
    #: This partition's child of each per-partition gauge, by the gauge's id: looked up once
    #: at assignment, not on every step (a labels() call per gauge per step was a fifth of
    #: the worker's GIL time per step, profiled).
    series: dict[int, Any] = field(default_factory=dict)

    def floor(self) -> int:
        """Below this nothing is left to train in this assignment."""
        return max(self.trained, self.committed if self.start is None else self.start)

    def readable(self) -> int:
        """The end of what this isolation level can read: the high watermark less the open
        transactions' records as last read (every 2 s), never below the position (which
        only ever follows the last stable offset)."""
        return min(self.high_watermark, max(self.high_watermark - self.unstable, self.position))


class Metrics:
    """The metric set of one worker reading one topic, every series present from start-up.

    Example::

        registry = CollectorRegistry()
        m = Metrics("rollouts", registry, version="0.1.0", tensorflow_version="2.21.0",
                    kafka_python_version="3.0.12")
        m.partitions_assigned([0, 1])
        m.set_high_watermark(0, 100)
        m.observe_trained(np.array([0, 0]), np.array([41, 42]), np.array([t_ms, t_ms]), now)
        registry.get_sample_value("streamer_consumer_lag_records",
                                  {"topic": "rollouts", "partition": "0"})  # 57.0

    Every method may be called from any thread. Per-partition series exist only between
    ``partitions_assigned`` and ``partitions_revoked``: updates for a partition that is not
    assigned (a late batch of a revoked partition) change no per-partition series, so a
    revoked partition cannot come back as a stale series. Counters and histograms still count.

    ``consumer_lag_records`` = readable end - max(trained offset, committed offset), never
    negative, updated together with its inputs under one lock. The readable end is the high
    watermark, or under read_committed the last stable offset (``set_last_stable``): records
    of a transaction still open cannot be read yet, so they are not lag. The committed offset
    is a floor because every record below it was trained (by this worker or the one before
    it), which keeps the lag honest after a (re)assignment before the first step; where the
    assignment starts elsewhere (a checkpoint's or ``--start-from``'s offset: ``seed_start``)
    that offset is the floor instead. During normal operation committed <= trained, so it is
    high watermark - trained. The trained offset is the highest trained offset + 1 within the
    current assignment (it never moves back while assigned; with a shuffle window, records
    still in the window below it are not counted).

    ``eval_loss`` and ``model_loss`` read NaN until the first evaluation / step reports one
    (never a perfect-looking 0); ``eval_metric{metric}`` and ``train_metric{metric}`` have one
    series per metric of the model (Keras' names), from its first evaluation / window on.
    """

    def __init__(
        self,
        topic: str,
        registry: CollectorRegistry | None = None,
        *,
        version: str,
        tensorflow_version: str,
        kafka_python_version: str,
    ) -> None:
        self.topic = topic
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._partitions: dict[int, _PartitionState] = {}
        #: Per partition once revoked: its high watermark, committed offset and newest trained
        #: timestamp (ms), where its series start when it comes back here.
        self._known: dict[int, tuple[int, int, int]] = {}
        self._unknown_error_types_logged: set[str] = set()
        r = self.registry
        t = ("topic",)
        tp = ("topic", "partition")

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, namespace=NAMESPACE, registry=r)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, namespace=NAMESPACE, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, namespace=NAMESPACE, registry=r, buckets=buckets)

        # Throughput.
        self.records_polled = counter("records_polled", "Records returned by poll().", t)
        self.bytes_polled = counter("bytes_polled", "Bytes of record values polled.", t)
        self.records_decoded = counter("records_decoded", "Records decoded without error.", t)
        self.samples_trained = counter(
            "samples_trained", "Samples consumed by finished train steps.", t
        )
        self.train_steps = counter("train_steps", "Finished train steps.")
        self.decode_errors = counter(
            "decode_errors", "Records dropped by the decoder, by reason.", ("topic", "reason")
        )
        self.records_dead_lettered = counter(
            "records_dead_lettered", "Records whose dead-letter write was acknowledged.", t
        )

        # Lag, per partition.
        self.partition_high_watermark = gauge(
            "partition_high_watermark_offset", "Offset the broker will give its next record.", tp
        )
        self.partition_position = gauge(
            "partition_position_offset", "Offset of the next record the consumer fetches.", tp
        )
        self.partition_trained = gauge(
            "partition_trained_offset", "Highest offset trained on, plus one.", tp
        )
        self.partition_committed = gauge(
            "partition_committed_offset", "Last offset committed to the group.", tp
        )
        self.partition_last_stable = gauge(
            "partition_last_stable_offset",
            "End of what the consumer's isolation level can read: the last stable offset "
            "under read_committed (below the high watermark while a transaction is open), "
            "the high watermark under read_uncommitted.",
            tp,
        )
        self.consumer_lag = gauge(
            "consumer_lag_records",
            "Records not trained yet: the last stable offset (read_committed; the high "
            "watermark with read_uncommitted) minus max(trained, committed) offset; never "
            "negative.",
            tp,
        )
        self.partition_last_trained_timestamp = gauge(
            "partition_last_trained_timestamp_seconds",
            "Record timestamp of the newest record trained on (freshness).",
            tp,
        )
        self._per_partition: tuple[Gauge, ...] = (
            self.partition_high_watermark,
            self.partition_last_stable,
            self.partition_position,
            self.partition_trained,
            self.partition_committed,
            self.consumer_lag,
            self.partition_last_trained_timestamp,
        )

        # Freshness and speed.
        self.record_age = _BatchHistogram(
            f"{NAMESPACE}_record_age_at_train_seconds",
            "Age of each record (now minus record timestamp) when its train step finished; "
            "a record stamped in the future (producer clock ahead) counts as age 0.",
            AGE_BUCKETS_SECONDS,
        )
        self.records_clock_skewed = counter(
            "records_clock_skewed",
            "Trained records whose timestamp was ahead of this worker's clock (their age counts "
            "as 0, freshness is clamped to now) or before 2000-01-01 (a producer's clock unset "
            "or far behind: no age, freshness unchanged).",
            t,
        )
        r.register(self.record_age)
        self.input_wait = histogram(
            "input_wait_seconds",
            "Time the trainer waited for the next batch.",
            STEP_BUCKETS_SECONDS,
        )
        self.train_step = histogram(
            "train_step_seconds",
            "Duration of one train step (starting it, plus waiting for its result).",
            STEP_BUCKETS_SECONDS,
        )

        # Pipeline.
        self.queue_depth = gauge(
            "queue_depth_records", "Records waiting in a pipeline stage.", ("stage",)
        )
        self.queue_capacity = gauge(
            "queue_capacity_records",
            "Capacity of a pipeline stage, in records, where it has a fixed one (the shard "
            "queues; tf.data's autotuned buffers and the dead-letter writer's bytes bound have "
            "no series).",
            ("stage",),
        )
        self.paused_partitions = gauge(
            "paused_partitions",
            "Partitions paused because a shard queue stayed full past the hold.",
        )

        # Kafka health.
        self.assigned_partitions = gauge("assigned_partitions", "Partitions assigned to us.")
        self.last_poll_timestamp = gauge(
            "last_poll_timestamp_seconds", "When poll() last returned (Unix time)."
        )
        self.offset_commits = counter("offset_commits", "Offset commits, by result.", ("result",))
        self.commit_duration = histogram(
            "commit_duration_seconds", "Duration of one offset commit.", COMMIT_BUCKETS_SECONDS
        )
        self.rebalances = counter("rebalances", "Rebalance callbacks, by event.", ("event",))
        self.kafka_errors = counter("kafka_errors", "Kafka errors, by type.", ("type",))
        self.checkpoints = counter("checkpoints", "Checkpoints written, by result.", ("result",))
        self.last_checkpoint_timestamp = gauge(
            "last_checkpoint_timestamp_seconds", "When the last checkpoint succeeded (Unix time)."
        )

        self.rollbacks = counter(
            "rollbacks",
            "Times the model went back to a checkpoint because partitions were lost with "
            "records trained here and not committed (their next owner trains those).",
        )

        # Multi-worker training (one model on N workers; streamer/cluster/worker.py).
        self.padded_rows = counter(
            "padded_rows",
            "Weight-0 rows that completed a batch when this worker's input had no more records "
            "within --pad-after-seconds (multi-worker training; 0 on a worker of its own).",
        )
        self.idle_steps = counter(
            "idle_steps",
            "Rounds of the multi-worker cluster in which no worker had a real row: no weight "
            "changed (not counted in train_steps_total).",
        )
        self.cluster_workers = gauge(
            "cluster_workers",
            "Workers training this one model together (1 for a worker on its own).",
        )
        self.cluster_workers.set(1)

        # Model.
        self.eval_loss = gauge(
            "eval_loss", "Loss of the last evaluation; NaN until the first (never a fake 0)."
        )
        self.eval_loss.set(math.nan)
        self.eval_metric = gauge(
            "eval_metric",
            "Each compiled metric of the model at the last evaluation (Keras' names); a "
            "series appears with the first evaluation.",
            ("metric",),
        )
        self.model_loss = gauge(
            "model_loss", "Training loss of the last applied step; NaN until the first."
        )
        self.model_loss.set(math.nan)
        self.train_metric = gauge(
            "train_metric",
            "The model's loss and compiled metrics (Keras' names, as model.fit reports them) "
            "over the training steps of the last window (--status-interval); a series "
            "appears once the model has trained its first window.",
            ("metric",),
        )
        self.nonfinite_steps = counter(
            "nonfinite_steps",
            "Train steps whose loss or gradients were not finite: their update was not "
            "applied (the model is unchanged).",
        )
        self.build_info = gauge(
            "build_info",
            "Versions of this worker and its main libraries; always 1.",
            ("version", "tensorflow", "kafka_python"),
        )
        self.build_info.labels(version, tensorflow_version, kafka_python_version).set(1)

        # Every series exists at 0 from start-up.
        for per_topic in (
            self.records_polled,
            self.bytes_polled,
            self.records_decoded,
            self.samples_trained,
            self.records_dead_lettered,
            self.records_clock_skewed,
        ):
            per_topic.labels(topic)
        for reason in DECODE_ERROR_REASONS:
            self.decode_errors.labels(topic, reason)
        for result in _RESULTS:
            self.offset_commits.labels(result)
            self.checkpoints.labels(result)
        for event in _REBALANCE_EVENTS:
            self.rebalances.labels(event)
        for error_type in KAFKA_ERROR_TYPES:
            self.kafka_errors.labels(error_type)
        for stage in QUEUE_STAGES:
            self.queue_depth.labels(stage)
        self.queue_capacity.labels("shard")  # the one stage of a fixed capacity

    # -- partitions ---------------------------------------------------------------------------

    def partitions_assigned(self, partitions: Iterable[int]) -> None:
        """Create the per-partition series of newly assigned partitions: at 0, or, for a
        partition this worker held before (the next pass, a rebalance back), at what was
        last known of it (high watermark, committed offset, the newest record trained), never
        a 0 that reads as an empty partition or a record of 1970 until the first poll or
        step."""
        with self._lock:
            for p in map(int, partitions):
                if p in self._partitions:
                    continue
                state = self._partitions[p] = _PartitionState()
                for gauge in self._per_partition:
                    state.series[id(gauge)] = gauge.labels(self.topic, str(p))
                known = self._known.get(p)
                if known is not None:
                    hw, state.committed, state.last_trained_ms = known
                    state.high_watermark = hw
                    self._series(self.partition_high_watermark, p, state).set(hw)
                    # Everything below the commit was trained (here or by the member before):
                    # the gauge starts there; the state's own trained offset counts this
                    # assignment's steps (a rollback's start below the commit stays the floor).
                    self._series(self.partition_trained, p, state).set(state.committed)
                    self._series(self.partition_committed, p, state).set(state.committed)
                    if state.last_trained_ms >= 0:
                        gauge = self.partition_last_trained_timestamp
                        self._series(gauge, p, state).set(state.last_trained_ms / 1000.0)
                    self._update_lag(p, state)
            self.assigned_partitions.set(len(self._partitions))

    def partitions_revoked(self, partitions: Iterable[int]) -> None:
        """Remove every per-partition series of these partitions (revoked or lost); what was
        known of them is kept for their next assignment here."""
        with self._lock:
            for p in map(int, partitions):
                state = self._partitions.pop(p, None)
                if state is not None:
                    self._known[p] = (
                        state.high_watermark,
                        state.committed,
                        state.last_trained_ms,
                    )
                for gauge in self._per_partition:
                    gauge.remove(self.topic, str(p))
            self.assigned_partitions.set(len(self._partitions))

    def set_high_watermark(self, partition: int, offset: int) -> None:
        with self._lock:
            state = self._partitions.get(partition)
            if state is None:
                return
            # Never below the end the broker listed: a stalled fetch's watermark is stale.
            offset = max(offset, state.listed_end)
            state.high_watermark = offset
            self.partition_high_watermark.labels(self.topic, str(partition)).set(offset)
            self._update_lag(partition, state)

    def set_last_stable(self, partition: int, offset: int) -> None:
        """The partition's end as the broker reports it (ListOffsets, every few seconds): the
        last stable offset under read_committed, the high watermark under read_uncommitted;
        lag counts up to it.

        Kept as its distance below the high watermark: the watermark moves with every poll,
        the stable offset is read every few seconds; a topic without transactions always reads
        its high watermark, never a stale stable offset. An end above the high watermark the
        polls reported means the polls are behind (a partition whose fetch stalled after a
        broker fault reports no new watermark): the watermark moves up to it, so the lag shows
        the records waiting and the partition shows as left behind.
        """
        with self._lock:
            state = self._partitions.get(partition)
            if state is None:
                return
            state.listed_end = offset
            if offset > state.high_watermark:
                state.high_watermark = offset
                self._series(self.partition_high_watermark, partition, state).set(offset)
            state.unstable = max(0, state.high_watermark - offset)
            self._update_lag(partition, state)

    def set_position(self, partition: int, offset: int) -> None:
        with self._lock:
            state = self._partitions.get(partition)
            if state is None:
                return
            state.position = offset
            self.partition_position.labels(self.topic, str(partition)).set(offset)
            self._update_lag(partition, state)

    def assigned(self) -> frozenset[int]:
        """The partitions assigned here now."""
        with self._lock:
            return frozenset(self._partitions)

    def is_assigned(self, partition: int) -> bool:
        with self._lock:
            return partition in self._partitions

    def lag(self, partition: int) -> float:
        """Records of ``partition`` not trained yet; 0.0 for a partition not assigned."""
        with self._lock:
            state = self._partitions.get(partition)
            return 0.0 if state is None else float(self._lag_of(state))

    @staticmethod
    def _lag_of(state: _PartitionState) -> int:
        return max(0, state.readable() - state.floor())

    def _series(self, gauge: Any, partition: int, state: _PartitionState) -> Any:
        """``gauge``'s child for ``partition`` (cached in its state). Caller holds the lock."""
        child = state.series.get(id(gauge))
        if child is None:
            child = state.series[id(gauge)] = gauge.labels(self.topic, str(partition))
        return child

    def _update_lag(self, partition: int, state: _PartitionState) -> None:
        # Caller holds self._lock.
        lag = self._lag_of(state)
        if not lag:
            state.moved_at = time.monotonic()
        self._series(self.partition_last_stable, partition, state).set(state.readable())
        self._series(self.consumer_lag, partition, state).set(lag)

    def left_behind(
        self, after_seconds: float = LEFT_BEHIND_SECONDS, now: float | None = None
    ) -> dict[int, tuple[float, int]]:
        """Partitions with records waiting of which nothing trained for ``after_seconds``
        (since the assignment, or since nothing was waiting): partition -> (seconds, lag).

        >>> m = Metrics("t", CollectorRegistry(), version="0", tensorflow_version="0",
        ...             kafka_python_version="0")
        >>> m.partitions_assigned([0, 1])
        >>> m.set_high_watermark(0, 100); m.set_high_watermark(1, 100)
        >>> m.observe_trained([1], [99], [-1], 0.0)
        >>> sorted(m.left_behind(30, now=time.monotonic() + 31))
        [0]
        """
        now = time.monotonic() if now is None else now
        out: dict[int, tuple[float, int]] = {}
        with self._lock:
            for p, state in self._partitions.items():
                lag = self._lag_of(state)
                if lag and now - state.moved_at >= after_seconds:
                    out[p] = (now - state.moved_at, lag)
        return out

    # -- data path ----------------------------------------------------------------------------

    def observe_poll(self, records: int, nbytes: int, now: float) -> None:
        """Count one poll() result (possibly empty) that returned at Unix time ``now``."""
        if records:
            self.records_polled.labels(self.topic).inc(records)
        if nbytes:
            self.bytes_polled.labels(self.topic).inc(nbytes)
        self.last_poll_timestamp.set(now)

    def observe_decode(self, decoded: int, reason_counts: Mapping[str, int]) -> None:
        """Count decoded records and dropped ones by reason (a ``DecodeErrorReason``)."""
        for reason in reason_counts:
            if reason not in DECODE_ERROR_REASONS:
                raise ValueError(
                    f"decode error reason {reason!r} is not one of {DECODE_ERROR_REASONS}"
                )
        if decoded:
            self.records_decoded.labels(self.topic).inc(decoded)
        for reason, count in reason_counts.items():
            if count:
                self.decode_errors.labels(self.topic, reason).inc(count)

    def observe_dead_lettered(self, n: int) -> None:
        if n:
            self.records_dead_lettered.labels(self.topic).inc(n)

    def observe_trained(
        self,
        partition_array: npt.ArrayLike,
        offset_array: npt.ArrayLike,
        timestamp_ms_array: npt.ArrayLike,
        now: float,
    ) -> None:
        """Record the ``partition``/``offset``/``timestamp`` columns of a finished step's batch.

        Per partition: trained offset = max offset + 1, last trained timestamp = max record
        timestamp, never past ``now``. Every record's age (``now`` - timestamp, floored at 0)
        goes into the age histogram in one vectorised call; records stamped after ``now`` (a
        producer's clock ahead of ours) are counted in ``records_clock_skewed``, and so are
        records stamped before ``SKEW_FLOOR_MS`` (2000-01-01: a producer's clock unset or far
        behind), which have no age and leave the partition's freshness as it was.
        Timestamps < 0 (Kafka's "none") are left out.
        """
        parts = np.asarray(partition_array, dtype=np.int64).ravel()
        offsets = np.asarray(offset_array, dtype=np.int64).ravel()
        stamps = np.asarray(timestamp_ms_array, dtype=np.int64).ravel()
        if not parts.shape == offsets.shape == stamps.shape:
            raise ValueError(
                "observe_trained: partition, offset and timestamp columns must have the same "
                f"length, got {parts.size}, {offsets.size} and {stamps.size}"
            )
        if parts.size == 0:
            return
        has_time = stamps >= 0
        if int(stamps.min()) < SKEW_FLOOR_MS:  # one reduction in the common case: none
            past = has_time & (stamps < SKEW_FLOOR_MS)
            if past.any():  # a producer's clock far behind (1970: an unset clock): no age
                self.records_clock_skewed.labels(self.topic).inc(int(np.count_nonzero(past)))
                has_time &= ~past
                stamps = np.where(past, -1, stamps)  # nor the partition's freshness
        ages = now - stamps[has_time] / 1000.0
        future = int(np.count_nonzero(ages < 0))
        if future:  # a producer's clock runs ahead of ours: never a negative age
            self.records_clock_skewed.labels(self.topic).inc(future)
            ages = np.maximum(ages, 0.0)
        self.record_age.observe_many(ages)
        now_ms = int(now * 1000)

        # Per partition, the largest offset and timestamp: one sort and two reduceat calls
        # (np.unique's inverse and ufunc.at cost several times more per step, profiled).
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_parts[1:] != sorted_parts[:-1])))
        uniq = sorted_parts[starts]
        max_offset = np.maximum.reduceat(offsets[order], starts)
        max_stamp = np.maximum.reduceat(stamps[order], starts)
        rows: list[list[int]] = np.stack([uniq, max_offset, max_stamp], 1).tolist()
        with self._lock:
            for p, top, stamp in rows:
                state = self._partitions.get(p)
                if state is None:
                    continue
                if top + 1 > state.trained:
                    state.trained = top + 1
                    state.moved_at = time.monotonic()
                    self._series(self.partition_trained, p, state).set(state.trained)
                    self._update_lag(p, state)
                # Shuffled batches can arrive out of order: keep the newest; never past now.
                stamp = min(stamp, now_ms)
                if stamp > state.last_trained_ms:
                    state.last_trained_ms = stamp
                    gauge = self.partition_last_trained_timestamp
                    self._series(gauge, p, state).set(stamp / 1000.0)

    def observe_step(
        self,
        samples: int,
        step_seconds: float,
        input_wait_seconds: float | None,
        loss: float | None,
    ) -> None:
        """Count one finished train step of ``samples`` samples; its input wait where it was
        measured (None: not known, not observed)."""
        self.train_steps.inc()
        if samples:
            self.samples_trained.labels(self.topic).inc(samples)
        self.train_step.observe(step_seconds)
        if input_wait_seconds is not None:
            self.input_wait.observe(input_wait_seconds)
        if loss is not None:
            self.model_loss.set(loss)

    def observe_round(self, padded_rows: int, idle: bool) -> None:
        """One multi-worker round: the padding rows of this worker's batch, and whether no
        worker had a real row (an idle step)."""
        if padded_rows:
            self.padded_rows.inc(padded_rows)
        if idle:
            self.idle_steps.inc()

    def observe_nonfinite_step(self) -> None:
        """One step whose update was skipped (its loss or gradients were not finite)."""
        self.nonfinite_steps.inc()

    def observe_train_metrics(self, values: Mapping[str, float]) -> None:
        """The model's metrics over the last window of training steps (by Keras' names)."""
        for name, value in values.items():
            self.train_metric.labels(name).set(value)

    def observe_eval(self, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        """The last evaluation's loss and compiled metrics (by name)."""
        self.eval_loss.set(loss)
        for name, value in (metrics or {}).items():
            self.eval_metric.labels(name).set(value)

    def set_queue(self, stage: QueueStage, depth: int, capacity: int | None) -> None:
        """Records in ``stage`` (all shard queues together for "shard") and its capacity
        (None: it has no fixed one, and no capacity series rather than a false 0)."""
        if stage not in QUEUE_STAGES:
            raise ValueError(f"queue stage {stage!r} is not one of {QUEUE_STAGES}")
        self.queue_depth.labels(stage).set(depth)
        if capacity is not None:
            self.queue_capacity.labels(stage).set(capacity)

    def set_paused(self, n: int) -> None:
        self.paused_partitions.set(n)

    # -- Kafka health -------------------------------------------------------------------------

    def observe_commit(self, offsets: Mapping[int, int], ok: bool, seconds: float) -> None:
        """Count one commit; on success set each partition's committed offset."""
        self.offset_commits.labels("success" if ok else "failure").inc()
        self.commit_duration.observe(seconds)
        if not ok:
            return
        with self._lock:
            for p, offset in offsets.items():
                state = self._partitions.get(p)
                if state is None:
                    continue
                state.committed = offset
                self.partition_committed.labels(self.topic, str(p)).set(offset)
                self._update_lag(p, state)

    def seed_committed(self, offsets: Mapping[int, int]) -> None:
        """The group's committed offsets of (re)assigned partitions: lag counts from there.

        Never moves a partition's figure back (a commit of ours may have landed since).
        """
        with self._lock:
            for p, offset in offsets.items():
                state = self._partitions.get(p)
                if state is None or offset <= state.committed:
                    continue
                state.committed = offset
                self.partition_committed.labels(self.topic, str(p)).set(offset)
                self._update_lag(p, state)

    def seed_start(self, offsets: Mapping[int, int]) -> None:
        """Where (re)assigned partitions start when not at the group's commit (a checkpoint's
        offset, ``--start-from``'s): their lag counts from there, whatever the group holds."""
        with self._lock:
            for p, offset in offsets.items():
                state = self._partitions.get(p)
                if state is None:
                    continue
                state.start = offset
                self._update_lag(p, state)

    def rebalance(self, event: RebalanceEvent) -> None:
        if event not in _REBALANCE_EVENTS:
            raise ValueError(f"rebalance event {event!r} is not one of {_REBALANCE_EVENTS}")
        self.rebalances.labels(event).inc()

    def kafka_error(self, error_type: KafkaErrorType | str) -> None:
        """Count a Kafka error; a type outside ``KAFKA_ERROR_TYPES`` counts as "other"."""
        if error_type not in KAFKA_ERROR_TYPES:
            # Called from error handlers: never raise here, and keep the label set closed.
            if error_type not in self._unknown_error_types_logged:
                self._unknown_error_types_logged.add(error_type)
                _log.warning("kafka error type %r is not known; counted as 'other'", error_type)
            error_type = "other"
        self.kafka_errors.labels(error_type).inc()

    def checkpoint(self, ok: bool, now: float) -> None:
        """Count a checkpoint; a successful one sets the last checkpoint time (Unix ``now``)."""
        self.checkpoints.labels("success" if ok else "failure").inc()
        if ok:
            self.last_checkpoint_timestamp.set(now)

    # -- reading ------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, float]:
        """Totals for a status line; rates (samples/s) are the caller's differences."""
        commits = _by_label(self.offset_commits, "result")
        checkpoints = _by_label(self.checkpoints, "result")
        with self._lock:
            lag_total = float(sum(self._lag_of(s) for s in self._partitions.values()))
            assigned = float(len(self._partitions))
        return {
            "records_polled": _sum_samples(self.records_polled),
            "bytes_polled": _sum_samples(self.bytes_polled),
            "records_decoded": _sum_samples(self.records_decoded),
            "decode_errors": _sum_samples(self.decode_errors),
            "records_dead_lettered": _sum_samples(self.records_dead_lettered),
            "samples_trained": _sum_samples(self.samples_trained),
            "train_steps": _sum_samples(self.train_steps),
            "consumer_lag_records": lag_total,
            "assigned_partitions": assigned,
            "paused_partitions": _sum_samples(self.paused_partitions),
            "offset_commits_success": commits.get("success", 0.0),
            "offset_commits_failure": commits.get("failure", 0.0),
            "kafka_errors": _sum_samples(self.kafka_errors),
            "rebalances": _sum_samples(self.rebalances),
            "checkpoints_success": checkpoints.get("success", 0.0),
            "checkpoints_failure": checkpoints.get("failure", 0.0),
            "last_poll_timestamp_seconds": _sum_samples(self.last_poll_timestamp),
            "model_loss": _sum_samples(self.model_loss),
            "nonfinite_steps": _sum_samples(self.nonfinite_steps),
        }


def reference() -> list[tuple[str, str, tuple[str, ...], str]]:
    """Every metric family the worker exports: (name, type, labels, help), in order.

    The metric reference (``docs/reference/metrics.md``) is this list (``python -m streamer.ops.metrics`` prints it as
    Markdown; a test keeps the two equal).
    """
    m = Metrics("t", version="v", tensorflow_version="v", kafka_python_version="v")
    out: list[tuple[str, str, tuple[str, ...], str]] = []
    for value in vars(m).values():
        if isinstance(value, MetricWrapperBase):
            # prometheus_client keeps the declared label names only here.
            labels = tuple(getattr(value, "_labelnames", ()))
            for family in value.describe():
                name = family.name + ("_total" if family.type == "counter" else "")
                out.append((name, family.type, labels, family.documentation))
        elif isinstance(value, _BatchHistogram):
            for family in value.describe():
                out.append((family.name, family.type, (), family.documentation))
    return out


def reference_markdown(alerts: Mapping[str, list[str]] | None = None) -> str:
    """The metric reference as a Markdown table; ``alerts``: family -> alert rules using it."""
    lines = [
        "| metric | type | labels | meaning | alerts |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, kind, labels, doc in reference():
        used = ", ".join(sorted((alerts or {}).get(name, []))) or "-"
        shown = ", ".join(f"`{x}`" for x in labels) or "-"
        lines.append(f"| `{name}` | {kind} | {shown} | {doc} | {used} |")
    return "\n".join(lines) + "\n"


def alerts_by_metric(rules_text: str) -> dict[str, list[str]]:
    """Which alert rules of a Prometheus rule file use each ``streamer_*`` family."""
    import re

    out: dict[str, list[str]] = {}
    for block in re.split(r"\n\s*- alert: ", rules_text)[1:]:
        alert = block.split("\n", 1)[0].strip()
        expr = block.split("annotations:", 1)[0]
        for family in set(re.findall(r"\b(streamer_[a-z_]+?)(?:_bucket|_count|_sum)?\b", expr)):
            out.setdefault(family, []).append(alert)
    return out


def _value_samples(metric: MetricWrapperBase) -> Iterator[tuple[dict[str, str], float]]:
    # Counters also expose "_created" samples; only the value samples are wanted.
    for family in metric.collect():
        for sample in family.samples:
            if sample.name in (family.name, family.name + "_total"):
                yield sample.labels, sample.value


def _sum_samples(metric: MetricWrapperBase) -> float:
    return float(sum(value for _, value in _value_samples(metric)))


def _by_label(metric: MetricWrapperBase, label: str) -> dict[str, float]:
    return {labels[label]: value for labels, value in _value_samples(metric)}


if __name__ == "__main__":  # python -m streamer.ops.metrics [alerts.yml]: the reference's table
    import sys
    from pathlib import Path

    rules = Path(sys.argv[1]).read_text(encoding="utf-8") if len(sys.argv) > 1 else ""
    print(reference_markdown(alerts_by_metric(rules)), end="")
