"""Benchmark: raw kafka-python, a naive per-record pipeline, ours, and the worker, side by side."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from consumers.settings import ConsumerSettings, KafkaClient, SecuritySettings
from streamer.ops.cost import Cost, CostMeter, ceiling, warm_up
from streamer.stopping import StopReason

if TYPE_CHECKING:
    from streamer.config import WorkerConfig
    from streamer.decode.schema import Schema
    from streamer.input.simulator import Task

__all__ = ["BenchResult", "run_bench"]

log = logging.getLogger(__name__)

MODES = (
    "raw",
    "naive",
    "pipeline",
    "pipeline-shuffle",
    "pipeline-process",
    "worker",
    "worker-process",
    "raw-confluent",
    "pipeline-confluent",
    "pipeline-confluent-process",
    "worker-confluent",
    "worker-confluent-process",
)
#: Ceilings measured beside the modes: the block decoder alone on one core (no Kafka, no
#: TensorFlow) and TensorFlow's part alone (generator -> numpy_function map -> rebatch, the
#: decode replaced by arrays made ready), each over the topic's records read once.
CEILINGS = ("decode-only", "tf-only")
#: A mode with ``@N`` runs with N shards (``pipeline-process@2``): the scaling table.
SCALING_MODES = (
    tuple(
        f"{scaled}@{n}"
        for scaled in (
            "pipeline",
            "pipeline-process",
            "pipeline-confluent",
            "pipeline-confluent-process",
        )
        for n in (1, 2)
    )
    + CEILINGS
)
#: The modes run when none are named: every mode of kafka-python, and confluent-kafka's when
#: the package is installed (``pip install 'streamer-train[confluent]'``).
DEFAULT_MODES = MODES[:7]
SHUFFLE_BUFFER = 10_000  # records in the shuffle window of the pipeline-shuffle mode
#: The modes that take any schema (``--schema``/``--task``); naive and worker are the
#: regression task's (one decode per record of its two features; the built-in model).
SCHEMA_MODES = ("raw", "pipeline", "pipeline-shuffle", "pipeline-process")
#: Prefix of the baseline's modes: the same modes on the fixed-shape regression records.
FIXED = "fixed:"


@dataclass
class BenchResult:
    """Records/s per mode over repeats, plus the worker's input-wait fraction."""

    topic: str
    records: int
    record_bytes: int
    shards: int
    rates: dict[str, list[float]] = field(default_factory=dict)
    input_wait_fraction: dict[str, list[float]] = field(default_factory=dict)
    soak: dict[str, float | str] | None = None
    #: Freshness runs: per client and rate, the quantiles of the age at training (seconds).
    freshness: list[dict[str, Any]] = field(default_factory=list)
    #: The codecs measured, first as the reference; with more than one, each mode's key in
    #: ``rates`` is ``mode:codec``.
    codecs: tuple[str, ...] = ("none",)
    #: With a schema or task: its name, and the fixed-shape baseline topic.
    task: str | None = None
    baseline_topic: str | None = None
    #: Per mode and repeat, the cost per record (``streamer.ops.cost.Cost.as_dict``).
    costs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: The host size the ceiling column projects to.
    ceiling_cores: int = 16

    def _cost_summary(self) -> dict[str, dict[str, float | None]]:
        """Per mode, the median of each cost figure over the repeats, and the projected
        ceiling of one worker on ``ceiling_cores`` cores."""
        out: dict[str, dict[str, float | None]] = {}
        for mode, runs in self.costs.items():
            fig: dict[str, float | None] = {}
            for name in (
                "main_cpu_us_per_record",
                "child_cpu_us_per_record",
                "total_cpu_us_per_record",
                "gil_us_per_record",
                "gil_held_fraction",
            ):
                values = [r[name] for r in runs if r[name] is not None]
                fig[name] = statistics.median(values) if values else None
            total, gil = fig["total_cpu_us_per_record"], fig["gil_us_per_record"]
            top = ceiling(total, gil, self.ceiling_cores)
            fig["ceiling_records_per_second"] = None if math.isinf(top) else top
            out[mode] = fig
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "records": self.records,
            "record_bytes": self.record_bytes,
            "shards": self.shards,
            "compression": list(self.codecs),
            "modes": {},
        }
        for mode, rates in self.rates.items():
            out["modes"][mode] = {
                "records_per_second_median": statistics.median(rates),
                "records_per_second_min": min(rates),
                "records_per_second_max": max(rates),
                "repeats": len(rates),
            }
        med = {m: statistics.median(r) for m, r in self.rates.items()}
        if "pipeline" in med and "raw" in med:
            out["ratio_pipeline_raw"] = med["pipeline"] / med["raw"]
        if "pipeline" in med and "naive" in med:
            out["ratio_pipeline_naive"] = med["pipeline"] / med["naive"]
        if "pipeline-shuffle" in med and "pipeline" in med:
            out["ratio_pipeline_shuffle_pipeline"] = med["pipeline-shuffle"] / med["pipeline"]
        if "pipeline-process" in med and "raw" in med:
            out["ratio_pipeline_process_raw"] = med["pipeline-process"] / med["raw"]
        if "pipeline-process" in med and "naive" in med:
            out["ratio_pipeline_process_naive"] = med["pipeline-process"] / med["naive"]
        for mode, waits in self.input_wait_fraction.items():
            key = mode.replace("-", "_") + "_input_wait_fraction"
            out[key] = statistics.median(waits)
        if "worker-process" in med and "worker" in med:
            out["ratio_worker_process_worker"] = med["worker-process"] / med["worker"]
        for num, den in (
            ("pipeline-confluent", "raw-confluent"),
            ("pipeline-confluent", "pipeline-process"),
            ("pipeline-confluent", "pipeline"),
            ("pipeline-confluent-process", "pipeline-confluent"),
            ("worker-confluent", "worker-process"),
            ("worker-confluent", "worker"),
            ("raw-confluent", "raw"),
        ):
            if num in med and den in med:
                out[f"ratio_{num}_{den}".replace("-", "_")] = med[num] / med[den]
        for scaled in (
            "pipeline",
            "pipeline-process",
            "pipeline-confluent",
            "pipeline-confluent-process",
        ):
            if f"{scaled}@2" in med and f"{scaled}@1" in med:
                out[f"ratio_{scaled.replace('-', '_')}_2_to_1_shards"] = (
                    med[f"{scaled}@2"] / med[f"{scaled}@1"]
                )
        # Each mode with the default decoder against the same mode with the reference alone.
        by_decoder = {
            mode: med[mode] / rate
            for key, rate in med.items()
            for mode, _, decoder in [key.partition("/")]
            if decoder == "python" and mode in med
        }
        if by_decoder:
            out["ratio_auto_to_python_decoder"] = by_decoder
        if self.freshness:
            out["freshness"] = self.freshness
        if self.task is not None:
            out["task"] = self.task
            out["baseline_topic"] = self.baseline_topic
            for mode in SCHEMA_MODES:
                if mode in med and FIXED + mode in med:
                    key = f"ratio_{mode.replace('-', '_')}_fixed"
                    out[key] = med[mode] / med[FIXED + mode]
                    # Each run right after its baseline run: the median of those pairs' ratios
                    # cancels the drift of a shared machine better than a ratio of medians.
                    pairs = zip(self.rates[mode], self.rates[FIXED + mode], strict=False)
                    out[key + "_paired"] = statistics.median(a / b for a, b in pairs)
        if self.costs:
            out["costs"] = self._cost_summary()
            out["ceiling_cores"] = self.ceiling_cores
        if self.soak is not None:
            out["soak"] = self.soak
        if len(self.codecs) > 1:
            # Each codec's median against the first codec's, per mode: what decompression costs.
            ref = self.codecs[0]
            cost: dict[str, dict[str, float]] = {}
            for key, rate in med.items():
                mode, _, codec = key.partition(":")
                base = med.get(f"{mode}:{ref}")
                if base and codec != ref:
                    cost.setdefault(codec, {})[mode] = rate / base
            out["ratio_to_first_codec"] = cost
        return out


#: The SASL/TLS settings of this run (``run_bench``'s ``security``): every client of the
#: benchmark uses them, so it measures a secured cluster as the worker reads it.
_security = SecuritySettings()


def _secured(cfg: WorkerConfig) -> WorkerConfig:
    """A worker config of the benchmark with this run's SASL/TLS settings."""
    s = _security
    return dataclasses.replace(
        cfg,
        security_protocol=s.security_protocol,
        sasl_mechanism=s.sasl_mechanism,
        sasl_username=s.sasl_plain_username,
        sasl_password=s.sasl_plain_password,
        ssl_cafile=s.ssl_cafile,
        ssl_certfile=s.ssl_certfile,
        ssl_keyfile=s.ssl_keyfile,
        ssl_password=s.ssl_password,
    )


def _fill(
    bootstrap: str,
    topic: str,
    records: int,
    record_bytes: int,
    partitions: int,
    compression: str = "none",
    task: Task | None = None,
) -> None:
    from streamer.input.simulator import produce

    produce(
        bootstrap,
        topic,
        records,
        partitions=partitions,
        record_bytes=record_bytes,
        progress=None,
        compression=compression,
        task=task,
        security=_security,
    )


def _mean_record_bytes(task: Task) -> int:
    values = task.records(2000, np.random.default_rng(0))
    return round(sum(map(len, values)) / len(values))


def _partitions(bootstrap: str, topic: str) -> list[int]:
    from consumers.admin import wait_for_topic

    settings = ConsumerSettings(bootstrap_servers=bootstrap, topic=topic, security=_security)
    return wait_for_topic(settings, attempts=2, topic_wait_seconds=0)


def _settings(
    bootstrap: str, topic: str, parts: list[int], shards: int, runtime: str = "thread"
) -> ConsumerSettings:
    return ConsumerSettings(
        shard_runtime=runtime,  # type: ignore[arg-type]
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        mode="static",
        partitions=tuple(parts),
        num_shards=shards,
        worker_id=f"bench-{uuid.uuid4().hex[:6]}",
        security=_security,
    )


def bench_raw(cs: ConsumerSettings, n: int, costs: list[Cost] | None = None) -> float:
    """A plain poll loop with the same consumer settings, touching every value (its cost per
    record appended to ``costs``)."""
    from consumers.clients import read_values

    got = 0
    touched = 0
    t0 = None
    meter = CostMeter()
    for values in read_values(cs):
        if t0 is None:
            t0 = time.perf_counter()
            meter.start()
            first = len(values)  # polled before the clock started: not counted in the cost
        touched += sum(map(len, values))
        got += len(values)
        if got >= n:
            break
    t1 = time.perf_counter()
    if costs is not None and t0 is not None:
        costs.append(meter.stop(got - first))
    return got / (t1 - (t0 or t1) + 1e-9)


def bench_naive(
    cs: ConsumerSettings, n: int, batch_size: int = 256, decoder: str = "auto"
) -> float:
    """The textbook pipeline: one record per generator call, one numpy_function per record."""
    import tensorflow as tf

    from consumers.clients import read_values
    from streamer.decode.records import decode_block
    from streamer.input.simulator import SimulatorTask

    schema = SimulatorTask().schema()

    def gen() -> Any:
        sent = 0
        for values in read_values(cs):
            for value in values:
                yield value
                sent += 1
                if sent >= n:
                    return

    def decode_one(value: bytes) -> tuple[np.ndarray, np.ndarray]:
        d = decode_block(schema, [value], decoder)
        return d.features["x"][0], d.features["y"][0]

    def tf_decode(v: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(decode_one, [v], [tf.float32, tf.float32])
        x.set_shape(schema.feature("x").shape)
        y.set_shape(())
        return x, y

    ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([], tf.string))
    ds = ds.map(tf_decode).batch(batch_size).prefetch(tf.data.AUTOTUNE)
    got = 0
    t0 = None
    for x, _y in ds:
        if t0 is None:
            t0 = time.perf_counter()
        got += int(x.shape[0])
    t1 = time.perf_counter()
    return got / (t1 - (t0 or t1) + 1e-9)


def bench_pipeline(
    cs: ConsumerSettings,
    n: int,
    batch_size: int = 256,
    shuffle_buffer: int = 0,
    schema: Schema | None = None,
    costs: list[Cost] | None = None,
    steps_per_execution: int = 1,
    decoder: str = "auto",
) -> float:
    """Our batched dataset, input only (with a shuffle window of ``shuffle_buffer`` records);
    its cost per record (this process and the shard processes, from the first batch to the
    last record) appended to ``costs``."""
    from streamer.input.pipeline import PipelineSettings
    from streamer.input.simulator import SimulatorTask
    from streamer.input.source import StreamSource

    source = StreamSource(
        schema or SimulatorTask().schema(),
        PipelineSettings(
            num_shards=cs.num_shards,
            batch_size=batch_size,
            pass_records=n,
            idle_timeout_seconds=5,
            shuffle_buffer=shuffle_buffer,
            decoder=decoder,
        ),
        consumer=cs,
    )
    got = 0
    t0 = None
    shards: list[Any] = []  # the pass's shards, kept: they leave the router as they close
    meter = CostMeter(lambda: {id(s): getattr(s, "child_cpu_seconds", None) for s in shards})
    # The clock stops at the end of the records, before the iterator is deleted: deleting a
    # tf.data iterator waits for its autotune thread to wake (0.7-0.9 s in most passes here,
    # measured; a cost per pass, not per record, which a worker pays once per pass and which
    # made this figure jump between ~55k and ~100k records/s run to run).
    iterator = iter(source.dataset())
    # Traced before the clock starts (a worker traces its compiled steps before its first).
    drain = _drain(steps_per_execution, iterator) if steps_per_execution > 1 else None
    for batch in iterator:
        if t0 is None:
            t0 = time.perf_counter()
            shards += source.router.shards()
            meter.start()
            first = int(batch["offset"].shape[0])
            handed = _handed_over(shards)
        got += int(batch["offset"].shape[0])
        if drain is not None:  # the rest in the graph, as --steps-per-execution takes them
            while True:
                rows, ended = drain(iterator)
                got += int(rows)
                if bool(ended):
                    break
            break
    t1 = time.perf_counter()
    if costs is not None and t0 is not None:
        costs.append(meter.stop(got - first, got - handed))
    _report_ring(shards)
    del iterator
    source.close()
    return got / (t1 - (t0 or t1) + 1e-9)


def _drain(k: int, iterator: Any) -> Any:
    """A compiled function taking up to ``k`` batches from an iterator in the graph (as the
    worker's --steps-per-execution does): (rows, whether the iterator ended). Traced here,
    for ``iterator``'s spec."""
    import tensorflow as tf

    @tf.function
    def drain(iterator: Any) -> tuple[Any, Any]:
        def cond(i: Any, n: Any, ended: Any) -> Any:
            return tf.logical_and(i < k, tf.logical_not(ended))

        def body(i: Any, n: Any, ended: Any) -> tuple[Any, Any, Any]:
            opt = iterator.get_next_as_optional()
            has = opt.has_value()
            rows = tf.cond(
                has,
                lambda: tf.shape(opt.get_value()["offset"], out_type=tf.int64)[0],
                lambda: tf.constant(0, tf.int64),
            )
            return i + 1, n + rows, tf.logical_not(has)

        _, n, ended = tf.while_loop(cond, body, (0, tf.constant(0, tf.int64), False))
        return n, ended

    # Called through the concrete function for the iterator's spec, as the worker's
    # Trainer.run_steps calls its compiled steps.
    return drain.get_concrete_function(tf.type_spec_from_value(iterator))


def _report_ring(shards: list[Any]) -> None:
    """Say when shard processes' blocks did not all travel zero-copy through their rings."""
    stats = [s.ring_stats for s in shards if hasattr(s, "ring_stats")]
    copied = sum(r["copied"] for r in stats)
    inline = sum(r["inline"] for r in stats)
    if copied or inline:
        print(
            f"  ring: {copied} blocks copied out of their slots, {inline} inline",
            file=sys.stderr,
        )


def _handed_over(shards: list[Any]) -> int:
    """Records these shard processes have handed over so far (read ahead)."""
    return sum(getattr(shard, "records_received", 0) for shard in shards)


def bench_worker(
    cs: ConsumerSettings,
    n: int,
    batch_size: int = 256,
    runtime: str = "thread",
    costs: list[Cost] | None = None,
    steps_per_execution: int = 1,
    decoder: str = "auto",
) -> tuple[float, float]:
    """The worker with the default model: records trained per second of wall time in its
    steady state (``_watch_worker``: from when the records its pipeline held at the first step
    are trained to its n-th record), and the share of input wait in input wait + step time;
    its cost per record over the same window appended to ``costs``."""
    from streamer.config import load_config
    from streamer.worker import Worker

    cfg = load_config(
        {
            "bootstrap": cs.bootstrap_servers,
            "topic": cs.topic,
            "group": cs.group_id,
            "partitions": ",".join(str(p) for p in cs.partitions or ()),
            "shards": str(cs.num_shards),
            "shard_runtime": runtime,
            "kafka_client": cs.client,
            "batch_size": str(batch_size),
            "pass_records": str(n),
            "stop_after_idle": "3",
            "metrics_port": "0",
            "log_level": "WARNING",
            "status_interval": "3600",
            "decoder": decoder,
            **(
                {"steps_per_execution": str(steps_per_execution)} if steps_per_execution > 1 else {}
            ),
        },
        env={},
    )
    worker = Worker(_secured(cfg))
    ended = threading.Event()
    window: list[Cost] = []
    watcher = threading.Thread(
        target=_watch_worker,
        args=(worker, cs.topic, n, window, ended),
        name="bench-cost",
        daemon=True,
    )
    watcher.start()
    try:
        worker.run()
    finally:
        ended.set()
        watcher.join(5)
    reg = worker.metrics.registry
    samples = reg.get_sample_value("streamer_samples_trained_total", {"topic": cs.topic}) or 0.0
    wait = reg.get_sample_value("streamer_input_wait_seconds_sum") or 0.0
    step = reg.get_sample_value("streamer_train_step_seconds_sum") or 0.0
    # The share of input wait in input wait + step time, the first wait excluded.
    first = worker.first_wait_seconds or 0.0
    busy = max(wait + step - first, 1e-9)
    if costs is not None:
        costs.extend(window)
    if window and window[0].records > 0 and window[0].wall_seconds > 0:
        # Records trained per second of wall time, from the first step to the n-th record:
        # the loop's own bookkeeping between steps counts too (input wait + step time left
        # it out, which overstated the rate, most with several steps a call).
        return window[0].records / window[0].wall_seconds, (wait - first) / busy
    return samples / busy, (wait - first) / busy


def _watch_worker(
    worker: Any, topic: str, n: int, costs: list[Cost] | None, ended: threading.Event
) -> None:
    """The cost windows of a benchmarked worker, sampled every 5 ms from its own counters.

    The main process, in a steady state: from the moment the records the pipeline held at the
    first step are trained (while the model was traced and the group joined, the shards read
    ahead, into tf.data's buffers; training those is faster than the input can be) to its n-th
    record trained; from the first step when that would leave under a fifth of the records.
    Shard processes: from their first record handed over to their end, over the records they
    handed over in it (they close when the pass has its records, often long before the
    trainer has trained them)."""

    def trained() -> float:
        reg = worker.parts.metrics.registry if worker.parts is not None else None
        got = reg.get_sample_value("streamer_samples_trained_total", {"topic": topic}) if reg else 0
        return float(got or 0.0)

    deadline = time.monotonic() + 600

    def waiting() -> bool:
        return not ended.is_set() and time.monotonic() < deadline

    shards: list[Any] = []
    children = CostMeter(lambda: {id(s): getattr(s, "child_cpu_seconds", None) for s in shards})
    while waiting() and not shards:
        source = getattr(worker, "source", None)
        open_now = list(source.router.shards()) if source is not None else []
        threads = not any(hasattr(s, "records_received") for s in open_now)
        if open_now and (threads or _handed_over(open_now) > 0):
            shards = open_now
        else:
            time.sleep(0.005)
    children.start()
    handed = _handed_over(shards)
    while worker.step < 1 and waiting():
        time.sleep(0.005)
    if worker.step < 1:
        return
    backlog = worker.source.records_emitted  # in tf.data's buffers, or trained: read ahead
    main = CostMeter()
    main.start()
    first = trained()
    while trained() < min(backlog, n) and waiting():
        time.sleep(0.005)
    if n - trained() >= n / 5:
        main = CostMeter()
        main.start()
        first = trained()
    while trained() < n and waiting():
        time.sleep(0.005)
    got = trained()
    cost = main.stop(int(got - first))
    while waiting() and not all(getattr(s, "child_ended", True) for s in shards):
        time.sleep(0.005)  # the children's last word (their CPU at the end) is on its way
    child = children.stop(_handed_over(shards) - handed)
    if costs is not None:
        costs.append(
            dataclasses.replace(
                cost,
                child_cpu_seconds=child.child_cpu_seconds,
                child_records=child.records,
            )
        )


def read_blocks(cs: ConsumerSettings, n: int) -> list[list[bytes]]:
    """The topic's first ``n`` records as the blocks a poll gives (read once, kept)."""
    from consumers.clients import read_values

    blocks: list[list[bytes]] = []
    got = 0
    for values in read_values(cs):
        blocks.append(list(values))
        got += len(values)
        if got >= n:
            break
    return blocks


def bench_decode_only(
    blocks: list[list[bytes]], schema: Schema | None = None, decoder: str = "auto"
) -> float:
    """The block decoder alone, on this process's one core: records/s."""
    from streamer.decode.records import decode_block
    from streamer.input.simulator import SimulatorTask

    sch = schema or SimulatorTask().schema()
    t0 = time.perf_counter()
    got = sum(len(decode_block(sch, block, decoder)) for block in blocks)
    return got / (time.perf_counter() - t0 + 1e-9)


def bench_tf_only(blocks: list[list[bytes]], batch_size: int = 256) -> float:
    """TensorFlow's share alone: from_generator of block handles -> one numpy_function per
    block returning arrays made ready (the decode's output shape) -> rebatch -> prefetch."""
    import tensorflow as tf

    ready = [(np.zeros((len(b), 16), np.float32), np.zeros(len(b), np.float32)) for b in blocks]

    def gen() -> Any:
        yield from range(len(ready))

    def fetch(i: np.int64) -> tuple[np.ndarray, np.ndarray]:
        return ready[int(i)]

    def to_arrays(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = tf.numpy_function(fetch, [i], [tf.float32, tf.float32])
        x.set_shape([None, 16])
        y.set_shape([None])
        return x, y

    ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([], tf.int64))
    ds = ds.map(to_arrays, num_parallel_calls=tf.data.AUTOTUNE).rebatch(batch_size)
    got = 0
    t0 = time.perf_counter()
    for x, _y in ds.prefetch(tf.data.AUTOTUNE):
        got += int(x.shape[0])
    return got / (time.perf_counter() - t0 + 1e-9)


def _age_quantiles(registry: Any, quantiles: tuple[float, ...]) -> dict[str, float]:
    """Quantiles of streamer_record_age_at_train_seconds from its buckets (linear within a
    bucket, as Prometheus' histogram_quantile does)."""
    name = "streamer_record_age_at_train_seconds"
    buckets: list[tuple[float, float]] = []
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name + "_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    out: dict[str, float] = {}
    for q in quantiles:
        rank, lo_bound, lo_count = q * total, 0.0, 0.0
        value = float("nan")
        for bound, count in buckets:
            if count >= rank and total:
                if bound == float("inf"):
                    value = lo_bound
                else:
                    span = count - lo_count
                    value = lo_bound + (bound - lo_bound) * (
                        (rank - lo_count) / span if span else 1
                    )
                break
            lo_bound, lo_count = bound, count
        out[f"p{round(q * 100)}"] = value
    return out


def bench_freshness(
    bootstrap: str, client: str, rate: float, seconds: float, shards: int = 2
) -> dict[str, float]:
    """A producer at ``rate`` records/s for ``seconds`` into a fresh topic while the worker
    (default model) trains it live: the quantiles of the records' age when trained, read
    as the producer stops."""
    import threading

    from kafka.admin import KafkaAdminClient

    from streamer.config import load_config
    from streamer.input.simulator import produce
    from streamer.worker import Worker

    topic = f"bench-fresh-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **_security.kafka_config())
    spec = {"num_partitions": max(2, shards), "replication_factor": 1}
    admin.create_topics({topic: spec}, wait_for_metadata=True)
    admin.close()
    cfg = load_config(
        {
            "bootstrap": bootstrap,
            "topic": topic,
            "group": f"bench-{uuid.uuid4().hex[:8]}",
            "shards": str(shards),
            "kafka_client": client,
            "stop_after_idle": "12",  # longer than the warm-up: it waits for the producer
            "metrics_port": "0",
            "log_level": "WARNING",
            "status_interval": "3600",
        },
        env={},
    )
    worker = Worker(_secured(cfg))
    runner = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    runner.start()
    time.sleep(6)  # joined and ready: only live records are measured
    produce(
        bootstrap,
        topic,
        int(rate * seconds),
        partitions=None,
        rate=rate,
        record_bytes=1024,
        security=_security,
    )
    time.sleep(1.0)
    # The steady state, as the producer stops: the records of the last partial batch wait for
    # the end of the pass (the idle timeout), which no live stream has.
    out = _age_quantiles(worker.metrics.registry, (0.5, 0.9, 0.99))
    worker.request_stop(StopReason.requested("the freshness run is over"))
    runner.join(120)
    out["rate"] = rate
    return out


def rss_mib() -> float:
    """This process's resident memory in MiB (Linux; NaN elsewhere)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def soak(
    bootstrap: str,
    topic: str,
    shards: int,
    seconds: float,
    out: IO[str],
    schema: Schema | None = None,
    client: KafkaClient = "kafka-python",
) -> dict[str, float | str]:
    """Read the topic again and again through the pipeline for ``seconds``: resident memory.

    Like the worker: one source and one dataset, iterated once per pass (every pass opens fresh
    shards in static mode and, committing nothing, reads the topic from its beginning at full
    rate). The baseline is taken after a warm-up (a tenth of the soak, at most 60 s: allocator
    arenas and TensorFlow's pools fill first); the report gives the growth from there, the
    range, and a least-squares trend of RSS over time after the warm-up.
    """
    from streamer.input.pipeline import PipelineSettings
    from streamer.input.simulator import SimulatorTask
    from streamer.input.source import StreamSource

    parts = _partitions(bootstrap, topic)
    cs = dataclasses.replace(_settings(bootstrap, topic, parts, shards), client=client)
    source = StreamSource(
        schema or SimulatorTask().schema(),
        PipelineSettings(num_shards=shards, batch_size=256, idle_timeout_seconds=2),
        consumer=cs,
    )
    dataset = source.dataset()
    warmup = min(60.0, seconds / 10)
    records = passes = 0
    samples: list[tuple[float, float]] = []  # (seconds since the baseline, RSS MiB)
    t0 = time.monotonic()
    base_t: float | None = None
    while True:
        now = time.monotonic()
        if base_t is not None and now - base_t >= seconds:
            break
        source.resume()
        source.begin_pass()
        for batch in dataset:
            records += int(batch["offset"].shape[0])
            source.tracker.ack(batch["partition"].numpy(), batch["offset"].numpy())
        source.end_pass()
        source.router.forget_positions()  # the next pass reads the topic again, from its start
        passes += 1
        now = time.monotonic()
        if base_t is None and now - t0 >= warmup:
            base_t = now
        rss = rss_mib()
        if base_t is not None:
            samples.append((now - base_t, rss))
        out.write(f"  soak pass {passes}: {records:,} records, rss {rss:.0f} MiB\n")
        out.flush()
    source.close()
    xs = np.array([x for x, _ in samples])
    ys = np.array([y for _, y in samples])
    slope = float(np.polyfit(xs, ys, 1)[0]) if len(samples) >= 3 else float("nan")
    return {
        "client": client,
        "seconds": float(xs[-1]) if len(xs) else 0.0,
        "warmup_seconds": warmup,
        "passes": passes,
        "records": records,
        "rss_start_mib": float(ys[0]),
        "rss_end_mib": float(ys[-1]),
        "rss_growth_mib": float(ys[-1] - ys[0]),
        "rss_min_mib": float(ys.min()),
        "rss_max_mib": float(ys.max()),
        "rss_trend_mib_per_hour": slope * 3600,
    }


def run_bench(
    bootstrap: str,
    *,
    records: int = 100_000,
    record_bytes: int = 1024,
    shards: int = 4,
    repeats: int = 3,
    topic: str | None = None,
    modes: tuple[str, ...] = MODES,
    naive_records: int = 20_000,
    soak_seconds: float = 0.0,
    soak_client: KafkaClient = "kafka-python",
    task: Task | None = None,
    task_name: str | None = None,
    progress: IO[str] | None = None,
    codecs: tuple[str, ...] = ("none",),
    freshness_rates: tuple[float, ...] = (),
    freshness_seconds: float = 20.0,
    freshness_clients: tuple[str, ...] = ("kafka-python", "confluent"),
    decoders: tuple[str, ...] = ("auto",),
    security: SecuritySettings | None = None,
    steps_per_execution: tuple[int, ...] = (1,),
) -> BenchResult:
    """Fill a fresh topic (unless given) and measure each mode, alternating, ``repeats`` times.

    With several ``codecs``, one topic per codec is filled and every mode runs on each (the
    result's keys are ``mode:codec``), so decompression costs are compared in one run.

    With ``task`` (random records of a schema, or a simulator task), its records fill the
    topic (padded to ``record_bytes`` when it is not 0) and a second topic gets regression
    records of the same mean size (the fixed-shape baseline); every mode (``SCHEMA_MODES``
    only) runs on both, alternating, as ``mode`` and ``fixed:mode``. One codec then.

    Each worker and pipeline mode runs with each of ``steps_per_execution``
    (``--steps-per-execution``; a pipeline then takes its batches in a compiled loop, as such a
    worker does); a value other than 1 is the key's suffix (``worker-process+spe8``).

    With several ``decoders`` (``--decoder`` values: auto, python), every mode runs with each,
    alternating; a decoder other than auto is the key's suffix (``pipeline@2/python``).
    """
    global _security
    _security = security or SecuritySettings()
    out = progress or sys.stderr
    import tensorflow  # noqa: F401  (imported before the GC settings, as in the worker)

    from streamer.ops.gctune import tune_gc

    tune_gc()  # every mode runs with the worker's GC settings
    warm_up()  # the GIL sampler's first start is not any mode's cost
    if task is not None and len(codecs) > 1:
        raise ValueError("a task or schema is measured with one codec")
    if task is not None and steps_per_execution != (1,):
        raise ValueError("a task or schema is measured with one step a call")
    schema = task.schema() if task is not None else None
    size = record_bytes
    if task is not None and not record_bytes:
        size = _mean_record_bytes(task)  # the records as they are: their mean size

    def fill(what: str, codec: str, fill_task: Task | None, fill_bytes: int) -> str:
        name = f"bench-{what}-{fill_bytes}b-{codec}-{uuid.uuid4().hex[:8]}"
        out.write(f"filling {name} with {records:,} records of ~{fill_bytes} B ({codec})\n")
        _fill(bootstrap, name, records, fill_bytes, max(shards, 4), codec, fill_task)
        return name

    #: The cost of the run in progress (raw and pipeline modes append one).
    sink: list[Cost] = []

    def runner(
        mode: str, sch: Schema | None, spe: int = 1, decoder: str = "auto"
    ) -> Callable[[ConsumerSettings], Any]:
        def process(cs: ConsumerSettings) -> ConsumerSettings:
            return dataclasses.replace(cs, shard_runtime="process")

        def confluent(cs: ConsumerSettings) -> ConsumerSettings:
            return dataclasses.replace(cs, client="confluent")

        blocks: dict[str, list[list[bytes]]] = {}

        def cached(cs: ConsumerSettings) -> list[list[bytes]]:
            if cs.topic not in blocks:
                blocks[cs.topic] = read_blocks(cs, records)
            return blocks[cs.topic]

        base, _, _n = mode.partition("@")
        # Every mode of one key measured the same way: this run's schema, cost sink,
        # --steps-per-execution and --decoder.
        pipeline = functools.partial(
            bench_pipeline, schema=sch, costs=sink, steps_per_execution=spe, decoder=decoder
        )
        worker = functools.partial(
            bench_worker, costs=sink, steps_per_execution=spe, decoder=decoder
        )
        return {
            "decode-only": lambda cs: bench_decode_only(cached(cs), sch, decoder),
            "tf-only": lambda cs: bench_tf_only(cached(cs)),
            "raw": lambda cs: bench_raw(cs, records, sink),
            "naive": lambda cs: bench_naive(cs, min(records, naive_records), decoder=decoder),
            "pipeline": lambda cs: pipeline(cs, records),
            "pipeline-shuffle": lambda cs: bench_pipeline(
                cs, records, shuffle_buffer=SHUFFLE_BUFFER, schema=sch, costs=sink, decoder=decoder
            ),
            "pipeline-process": lambda cs: pipeline(process(cs), records),
            "worker": lambda cs: worker(cs, records),
            "worker-process": lambda cs: worker(cs, records, runtime="process"),
            "raw-confluent": lambda cs: bench_raw(confluent(cs), records, sink),
            "pipeline-confluent": lambda cs: pipeline(confluent(cs), records),
            "pipeline-confluent-process": lambda cs: pipeline(process(confluent(cs)), records),
            "worker-confluent": lambda cs: worker(confluent(cs), records),
            "worker-confluent-process": lambda cs: worker(
                confluent(cs), records, runtime="process"
            ),
        }[base]

    # (key in the result, topic, how to measure it with a given --decoder)
    todo: list[tuple[str, str, Callable[[str], Callable[[ConsumerSettings], Any]]]] = []
    paired = task is not None
    if task is None:
        for codec in codecs:
            name = topic or fill("sim", codec, None, record_bytes)
            for mode in modes:
                key = mode if len(codecs) == 1 else f"{mode}:{codec}"
                with_spe = mode.startswith(("worker", "pipeline")) and "shuffle" not in mode
                for spe in steps_per_execution if with_spe else (1,):
                    spe_key = key if spe == 1 else f"{key}+spe{spe}"
                    todo.append((spe_key, name, functools.partial(runner, mode, None, spe)))
        first = todo[0][1]
        result = BenchResult(first, records, record_bytes, shards, codecs=codecs)
    else:
        first = topic or fill("task", codecs[0], task, record_bytes)
        baseline = fill("fixed", codecs[0], None, size)
        result = BenchResult(first, records, size, shards, codecs=codecs, task=task_name)
        result.baseline_topic = baseline
        for mode in modes:
            # Each mode right after its baseline: the two see the same state of the machine.
            todo.append((FIXED + mode, baseline, functools.partial(runner, mode, None, 1)))
            todo.append((mode, first, functools.partial(runner, mode, schema, 1)))
    # Each mode with each --decoder, alternating; a decoder other than auto suffixes the key.
    plan = [
        (key if decoder == "auto" else f"{key}/{decoder}", name, make(decoder))
        for key, name, make in todo
        for decoder in decoders
    ]
    parts_of = {name: _partitions(bootstrap, name) for _, name, _ in plan}
    for r in range(repeats):
        # Rotate the order every repeat so that drift on a shared machine cancels out.
        step = 2 if paired else 1
        shift = (r * step) % len(plan)
        order = plan[shift:] + plan[:shift]
        if paired and r % 2:  # and which of a pair goes first
            order = [m for i in range(0, len(order), 2) for m in (order[i + 1], order[i])]
        for key, name, run in order:
            mode = key.partition("/")[0]
            at = re.match(r"[^@+]*@(\d+)", mode)  # pipeline-process@2(+spe8): 2 shards
            n_shards = int(at.group(1)) if at else shards
            sink.clear()
            value = run(_settings(bootstrap, name, parts_of[name], n_shards))
            for cost in sink:
                result.costs.setdefault(key, []).append(cost.as_dict())
            if key.removeprefix(FIXED).startswith("worker"):
                rate, wait = value
                result.input_wait_fraction.setdefault(key, []).append(wait)
            else:
                rate = value
            result.rates.setdefault(key, []).append(rate)
            out.write(f"  repeat {r + 1}/{repeats} {key:<22} {rate:>12,.0f} records/s\n")
            out.flush()
    if soak_seconds > 0:
        result.soak = soak(bootstrap, first, shards, soak_seconds, out, schema, soak_client)
    for rate in freshness_rates:
        for client in freshness_clients:
            q = bench_freshness(bootstrap, client, rate, freshness_seconds)
            q["client"] = client  # type: ignore[assignment]
            result.freshness.append(q)
            out.write(
                f"  freshness {client} at {rate:,.0f}/s: p50 {q['p50']:.3f}s p90 {q['p90']:.3f}s "
                f"p99 {q['p99']:.3f}s\n"
            )
    return result


def format_table(summary: dict[str, Any]) -> str:
    lines = [
        f"topic {summary['topic']}: {summary['records']:,} records of ~{summary['record_bytes']} B, "
        f"{summary['shards']} shards",
        *(
            [f"records of {summary['task']}; fixed: regression records of the same mean size"]
            if "task" in summary
            else []
        ),
        f"{'mode':<22} {'median rec/s':>14} {'min':>12} {'max':>12}",
    ]
    for mode, m in summary["modes"].items():
        lines.append(
            f"{mode:<22} {m['records_per_second_median']:>14,.0f} {m['records_per_second_min']:>12,.0f} "
            f"{m['records_per_second_max']:>12,.0f}"
        )
    for key in (
        "ratio_pipeline_raw",
        "ratio_pipeline_naive",
        "ratio_pipeline_shuffle_pipeline",
        "ratio_pipeline_process_raw",
        "ratio_pipeline_process_naive",
        "worker_input_wait_fraction",
        "ratio_worker_process_worker",
        "worker_process_input_wait_fraction",
        *(f"ratio_{m.replace('-', '_')}_fixed{p}" for m in SCHEMA_MODES for p in ("", "_paired")),
        *(
            k
            for k in summary
            if k.startswith("ratio_") and "confluent" in k and not k.endswith("_2_to_1_shards")
        ),
        *(k for k in summary if k.endswith("_input_wait_fraction") and "confluent" in k),
        *(k for k in summary if k.endswith("_2_to_1_shards")),
    ):
        if key in summary:
            lines.append(f"{key}: {summary[key]:.2f}")
    for mode, ratio in summary.get("ratio_auto_to_python_decoder", {}).items():
        lines.append(f"{mode}: decoder auto / python {ratio:.2f}")
    for codec, ratios in summary.get("ratio_to_first_codec", {}).items():
        text = ", ".join(f"{mode} {ratio:.2f}" for mode, ratio in ratios.items())
        lines.append(f"{codec} / {summary['compression'][0]}: {text}")
    for q in summary.get("freshness", []):
        lines.append(
            f"freshness {q['client']} at {q['rate']:,.0f} records/s: age at training p50 "
            f"{q['p50']:.3f} s, p90 {q['p90']:.3f} s, p99 {q['p99']:.3f} s"
        )
    if "costs" in summary:
        cores = summary["ceiling_cores"]
        lines.append(
            f"{'cost per record':<26} {'main CPU':>9} {'shard CPU':>9} {'all CPU':>9} "
            f"{'GIL':>7} {'GIL held':>9} {f'ceiling @{cores} cores':>20}"
        )

        def us(v: float | None, unit: str = " us") -> str:
            return "n/a" if v is None else f"{v:.2f}{unit}"

        for mode, c in summary["costs"].items():
            ceiling = c["ceiling_records_per_second"]
            held = c["gil_held_fraction"]
            lines.append(
                f"{mode:<26} {us(c['main_cpu_us_per_record']):>9} "
                f"{us(c['child_cpu_us_per_record']):>9} {us(c['total_cpu_us_per_record']):>9} "
                f"{us(c['gil_us_per_record']):>7} "
                f"{'n/a' if held is None else f'{held:.0%}':>9} "
                f"{'n/a' if ceiling is None else f'{ceiling:,.0f}/s':>20}"
            )
    if "soak" in summary:
        sk = summary["soak"]
        lines.append(
            f"soak ({sk['client']}): {sk['seconds']:.0f} s after {sk['warmup_seconds']:.0f} s of warm-up, "
            f"{sk['records']:,} records, rss {sk['rss_start_mib']:.0f} -> {sk['rss_end_mib']:.0f} MiB "
            f"(growth {sk['rss_growth_mib']:+.1f} MiB, range {sk['rss_min_mib']:.0f}-"
            f"{sk['rss_max_mib']:.0f}, trend {sk['rss_trend_mib_per_hour']:+.0f} MiB/h)"
        )
    return "\n".join(lines)
