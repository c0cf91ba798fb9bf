"""The simulator: learnable synthetic tasks (or random records of any schema), produced into
Kafka or served in-process as shards."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, ClassVar, Protocol

import msgpack
import numpy as np
import numpy.typing as npt

from consumers.block import RecordBlock
from consumers.settings import SecuritySettings
from streamer.decode.schema import Schema

__all__ = [
    "TASKS",
    "RandomRecords",
    "RecommenderTask",
    "SimulatedShard",
    "SimulatorTask",
    "Task",
    "produce",
    "task_named",
]

log = logging.getLogger(__name__)

_PAD_KEY = "pad"


class Task(Protocol):
    """What the simulator produces: records of one schema."""

    def schema(self) -> Schema: ...
    def records(self, n: int, rng: np.random.Generator, record_bytes: int = 0) -> list[bytes]: ...


def _pad(rng: np.random.Generator, base: int, record_bytes: int) -> bytes:
    """Random bytes for an extra ``pad`` key (ignored by the schema) to reach about
    ``record_bytes`` per record."""
    pad_len = max(0, record_bytes - base - 8)
    return rng.bytes(pad_len) if pad_len else b""


@dataclass(frozen=True, slots=True)
class SimulatorTask:
    """A regression task a small MLP learns: y = tanh(x·w1) + 0.5·sin(x·w2) + noise.

    The ``regression`` task of ``streamer simulate --task`` (the default).

    >>> task = SimulatorTask()
    >>> batch = task.sample(4, np.random.default_rng(0))
    >>> batch["x"].shape, batch["y"].shape
    ((4, 16), (4,))
    """

    num_features: int = 16
    noise: float = 0.05
    seed: int = 1234
    name: ClassVar[str] = "regression"

    def _weights(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        rng = np.random.default_rng(self.seed)
        w1 = rng.normal(size=self.num_features).astype(np.float32) / np.sqrt(self.num_features)
        w2 = rng.normal(size=self.num_features).astype(np.float32) / np.sqrt(self.num_features)
        return w1, w2

    def schema(self) -> Schema:
        """The schema of the simulator's records (x: float32[num_features], y: float32 label)."""
        return Schema.from_dict(
            {
                "label": "y",
                "features": {
                    "x": {"dtype": "float32", "shape": [self.num_features]},
                    "y": {"dtype": "float32", "shape": []},
                },
            }
        )

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, npt.NDArray[np.float32]]:
        w1, w2 = self._weights()
        x = rng.normal(size=(n, self.num_features)).astype(np.float32)
        y = np.tanh(x @ w1) + 0.5 * np.sin(x @ w2) + self.noise * rng.normal(size=n)
        return {"x": x, "y": y.astype(np.float32)}

    def records(self, n: int, rng: np.random.Generator, record_bytes: int = 0) -> list[bytes]:
        """``n`` msgpack records; ``x`` travels as raw little-endian ``bin``, ``y`` as a float.

        ``record_bytes`` pads each record (an extra ``pad`` key the schema ignores) to about
        that size, to benchmark record sizes without changing the task.
        """
        batch = self.sample(n, rng)
        x = batch["x"].astype("<f4", copy=False)
        y = batch["y"]
        base = len(msgpack.packb({"x": x[0].tobytes(), "y": float(y[0])})) if n else 0
        pad = _pad(rng, base, record_bytes)
        packb = msgpack.packb
        if pad:
            return [packb({"x": x[i].tobytes(), "y": float(y[i]), _PAD_KEY: pad}) for i in range(n)]
        return [packb({"x": x[i].tobytes(), "y": float(y[i])}) for i in range(n)]


@dataclass(frozen=True, slots=True)
class RecommenderTask:
    """A recommender-like stream with a learnable rating (the ``recommender`` task).

    Each record: ``user`` (a string id), ``items`` (0 to ``max_items`` int64 item ids, a
    msgpack array; left out when empty, as producers do: the schema's default is ``[]``),
    ``x`` (``num_features`` float32 context values, raw ``bin``) and the label ``y``:

        y = tanh(0.8·bias[user] + mean(score[items]) + 0.5·x·w) + noise

    with hidden per-user biases, per-item scores (0 for an empty list) and weights ``w``. A model
    learns it from a hashed user embedding, the mean of the items' embeddings and the dense
    ``x`` (``examples/recommender.py``).

    >>> batch = RecommenderTask().sample(3, np.random.default_rng(0))
    >>> sorted(batch), batch["x"].shape
    (['items', 'user', 'x', 'y'], (3, 16))
    """

    users: int = 500
    items: int = 1000
    max_items: int = 50
    num_features: int = 16
    noise: float = 0.05
    seed: int = 1234
    name: ClassVar[str] = "recommender"

    def schema(self) -> Schema:
        """user: string; items: int64[-1] (at most ``max_items``, default []); x: float32; y."""
        return Schema.from_dict(
            {
                "label": "y",
                "features": {
                    "user": {"dtype": "string"},
                    "items": {
                        "dtype": "int64",
                        "shape": [-1],
                        "max_len": self.max_items,
                        "default": [],
                    },
                    "x": {"dtype": "float32", "shape": [self.num_features]},
                    "y": {"dtype": "float32"},
                },
            }
        )

    def _hidden(self) -> tuple[npt.NDArray[np.float64], ...]:
        rng = np.random.default_rng(self.seed)
        bias = rng.normal(size=self.users)
        score = 2.0 * rng.normal(size=self.items)
        w = rng.normal(size=self.num_features) / np.sqrt(self.num_features)
        return bias, score, w

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, Any]:
        """``n`` samples: ``user`` (list of str), ``items`` (list of int64 arrays), ``x``, ``y``."""
        bias, score, w = self._hidden()
        users = rng.integers(0, self.users, size=n)
        counts = rng.integers(0, self.max_items, size=n, endpoint=True)
        flat = rng.integers(0, self.items, size=int(counts.sum()))
        items = np.split(flat, np.cumsum(counts)[:-1]) if n else []
        sums = np.bincount(np.repeat(np.arange(n), counts), weights=score[flat], minlength=n)
        means = sums / np.maximum(counts, 1)
        x = rng.normal(size=(n, self.num_features)).astype(np.float32)
        y = np.tanh(0.8 * bias[users] + means + 0.5 * (x @ w))
        y = y + self.noise * rng.normal(size=n)
        return {
            "user": [f"user-{u}" for u in users],
            "items": items,
            "x": x,
            "y": y.astype(np.float32),
        }

    def records(self, n: int, rng: np.random.Generator, record_bytes: int = 0) -> list[bytes]:
        """``n`` msgpack records, written as a producer would with plain ``msgpack.packb``."""
        batch = self.sample(n, rng)
        x = batch["x"].astype("<f4", copy=False)
        packb = msgpack.packb
        out = []
        for i in range(n):
            record: dict[str, Any] = {"user": batch["user"][i], "x": x[i].tobytes()}
            if len(batch["items"][i]):
                record["items"] = batch["items"][i].tolist()
            record["y"] = float(batch["y"][i])
            out.append(record)
        if record_bytes and n:
            pad = _pad(rng, len(packb(out[0])), record_bytes)
            for record in out:
                record["pad"] = pad
        return [packb(r) for r in out]


@dataclass(frozen=True)
class RandomRecords:
    """Random valid records of any schema (for ``streamer bench --schema`` and ``simulate``).

    Fixed numeric features travel as raw ``bin`` (scalars as numbers), variable-length ones
    as msgpack arrays of 0 to ``max_len`` rows (at most ``max_rows``), strings as 4-12 ASCII
    characters; an optional feature is left out of a fifth of the records. Nothing is
    learnable: the label is as random as the rest.

    >>> schema = Schema.from_dict({"features": {"ids": {"dtype": "int64", "shape": [-1]}}})
    >>> len(RandomRecords(schema).records(3, np.random.default_rng(0)))
    3
    """

    spec: Schema
    max_rows: int = 1000
    name: ClassVar[str] = "random"

    def schema(self) -> Schema:
        return self.spec

    def records(self, n: int, rng: np.random.Generator, record_bytes: int = 0) -> list[bytes]:
        columns = {f.name: self._column(f, n, rng) for f in self.spec.features}
        out: list[dict[str, Any]] = [{} for _ in range(n)]
        for f in self.spec.features:
            present = (rng.random(n) >= 0.2 if not f.required else np.ones(n, dtype=bool)).tolist()
            for record, value, keep in zip(out, columns[f.name], present, strict=True):
                if keep:
                    record[f.name] = value
        packb = msgpack.packb
        if record_bytes and n:
            pad = _pad(rng, len(packb(out[0])), record_bytes)
            for record in out:
                record[_PAD_KEY] = pad
        return [packb(r) for r in out]

    def _column(self, f: Any, n: int, rng: np.random.Generator) -> list[Any]:
        if f.is_variable:
            rows = rng.integers(0, min(f.max_len, self.max_rows), size=n, endpoint=True)
            total = int(rows.sum()) * f.inner_size
            flat = _random_values(f, total, rng)
            splits = np.cumsum(rows * f.inner_size)[:-1]
            inner = f.inner_shape
            return [
                np.asarray(chunk, dtype=object if f.is_string else f.dtype)
                .reshape((-1, *inner))
                .tolist()
                for chunk in np.split(np.asarray(flat, dtype=object), splits)
            ]
        values = _random_values(f, n * f.size, rng)
        if f.is_string:
            arr = np.asarray(values, dtype=object).reshape((n, *f.shape))
            return arr.tolist()
        arr = np.asarray(values, dtype=f.dtype).reshape((n, *f.shape))
        if not f.shape:
            return arr.tolist()
        wire = arr.astype(f.dtype.newbyteorder("<"), copy=False)
        return [row.tobytes() for row in wire]


def _random_values(f: Any, count: int, rng: np.random.Generator) -> list[Any]:
    """``count`` random elements of feature ``f``'s dtype, as Python values."""
    if f.is_string:
        lengths = rng.integers(4, 12, size=count, endpoint=True)
        letters = rng.integers(97, 123, size=int(lengths.sum()), dtype=np.uint8).tobytes()
        ends = np.cumsum(lengths).tolist()
        return [letters[e - k : e].decode() for e, k in zip(ends, lengths.tolist(), strict=True)]
    kind = f.dtype.kind
    if kind == "b":
        return rng.integers(0, 2, size=count).astype(bool).tolist()
    if kind in "iu":
        hi = min(1000, int(np.iinfo(f.dtype).max))
        lo = max(0 if kind == "u" else -hi, int(np.iinfo(f.dtype).min))
        return rng.integers(lo, hi, size=count).tolist()
    return rng.normal(size=count).astype(f.dtype).tolist()


#: The simulator's learnable tasks by name (``--task``, ``--sim-task``).
TASKS: dict[str, Callable[[], Task]] = {
    SimulatorTask.name: SimulatorTask,
    RecommenderTask.name: RecommenderTask,
}


def task_named(name: str) -> Task:
    """The task called ``name`` (one of ``TASKS``); ValueError otherwise."""
    try:
        return TASKS[name]()
    except KeyError:
        raise ValueError(f"unknown task {name!r}: one of {', '.join(TASKS)}") from None


class SimulatedShard:
    """A shard with no Kafka: generates RecordBlocks of simulator records in-process.

    It is a ``consumers.ShardLike`` (start/get/commit/close/assigned and the rest) so the embedded
    source goes through exactly the same block, decode, tracker and commit path. Shard k owns
    the virtual partitions p with p % num_shards == k; offsets count up from 0 per partition.
    """

    def __init__(
        self,
        shard_index: int,
        num_shards: int,
        *,
        task: Task | None = None,
        partitions: int = 4,
        block_records: int = 512,
        record_bytes: int = 0,
        rate: float | None = None,
        start_offsets: dict[int, int] | None = None,
        topic: str = "simulator",
    ) -> None:
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.task: Task = task or SimulatorTask()
        self.topic = topic
        self._parts = [p for p in range(partitions) if p % num_shards == shard_index]
        self._next = {p: (start_offsets or {}).get(p, 0) for p in self._parts}
        self._block = block_records
        self._record_bytes = record_bytes
        self._rate = rate
        self._rng = np.random.default_rng(1000 + shard_index)
        self._turn = 0
        self._closed = threading.Event()
        self._t0 = time.monotonic()
        self._emitted = 0
        self.committed: dict[int, int] = {}
        self.last_record_monotonic = time.monotonic()
        self.last_rebalance_monotonic = self.last_record_monotonic
        self.failed: BaseException | None = None
        self.queued_records = 0
        self.joining = False  # no group: always assigned
        self.topic_missing = False

    def start(self) -> SimulatedShard:
        return self

    @property
    def assigned(self) -> frozenset[int]:
        return frozenset(self._parts)

    def get(
        self, timeout: float, claim: Callable[[RecordBlock], RecordBlock] | None = None
    ) -> RecordBlock | None:
        block = self._next_block(timeout)
        return claim(block) if claim is not None and block is not None else block

    def _next_block(self, timeout: float) -> RecordBlock | None:
        if self._closed.is_set() or not self._parts:
            self._closed.wait(timeout)
            return None
        if self._rate:
            due = self._t0 + self._emitted / self._rate
            wait = due - time.monotonic()
            if wait > timeout:
                self._closed.wait(timeout)
                return None
            if wait > 0:
                self._closed.wait(wait)
        p = self._parts[self._turn % len(self._parts)]
        self._turn += 1
        n = self._block
        start = self._next[p]
        self._next[p] = start + n
        self._emitted += n
        now_ms = int(time.time() * 1000)
        values = self.task.records(n, self._rng, self._record_bytes)
        self.last_record_monotonic = time.monotonic()
        return RecordBlock.from_columns(
            self.topic,
            values,
            np.full(n, p, dtype=np.int32),
            np.arange(start, start + n, dtype=np.int64),
            np.full(n, now_ms, dtype=np.int64),
        )

    def commit(self, offsets: dict[int, int]) -> None:
        for p, off in offsets.items():
            if p in self._next:
                self.committed[p] = max(off, self.committed.get(p, 0))

    def close(self, timeout: float = 0.0) -> None:
        self._closed.set()


def _retried(call: Callable[[], Any], tries: int = 5) -> Any:
    """An admin call, tried again when the node it went to has just died (a broker of a
    cluster restarting): kafka-python raises instead of trying another node."""
    from kafka.errors import KafkaConnectionError, NodeNotReadyError, RequestTimedOutError

    for attempt in range(tries):
        try:
            return call()
        except (KafkaConnectionError, NodeNotReadyError, RequestTimedOutError):
            if attempt == tries - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    return None


#: Off a terminal, a progress line every this many seconds.
_LOG_EVERY_S = 10.0


def _progress(out: IO[str], done: int, total: int | None, t0: float) -> None:
    """A terminal's live line: a bar for a bounded run, a count for one that runs forever."""
    elapsed = max(time.monotonic() - t0, 1e-6)
    if total:
        bar = "#" * int(done / total * 30)
        out.write(f"\r[{bar:<30}] {done:>10,}/{total:,} records  {done / elapsed:>10,.0f}/s")
    else:
        out.write(f"\r{done:>12,} records (until Ctrl-C)  {done / elapsed:>10,.0f}/s")
    out.flush()


def produce(
    bootstrap_servers: str,
    topic: str,
    records: int | None,
    *,
    partitions: int | None = 4,
    rate: float | None = None,
    record_bytes: int = 0,
    task: Task | None = None,
    security: SecuritySettings | None = None,
    progress: IO[str] | None = None,
    seed: int = 0,
    compression: str | None = None,
) -> int:
    """Create ``topic`` if missing and produce ``records`` records of ``task`` (None: until
    interrupted); returns the count the broker acknowledged.

    ``partitions``: of a topic it creates (None: 4); a topic that exists with another count
    is used as it is, with a warning. Progress: a live line on a terminal (``progress``, or
    stderr when it is one), else a log line every 10 s; Ctrl-C flushes what was sent, logs a
    summary and raises KeyboardInterrupt.

    ``compression`` is the producer's ``compression_type`` (gzip, snappy, lz4, zstd; None or
    "none": uncompressed batches).

    >>> produce("127.0.0.1:9092", "samples", 10_000, partitions=6)   # doctest: +SKIP
    10000
    """
    from kafka.admin import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    from consumers.clients.kafka_python import connect
    from consumers.producer import new_producer

    task = task or SimulatorTask()
    security = security or SecuritySettings()
    # Typed errors (BrokerUnavailableError, AuthenticationError) within 30 s, never a raw
    # KafkaTimeoutError; no password in the client libraries' log records at any level.
    admin = connect(KafkaAdminClient, bootstrap_servers, security, 30_000)
    try:
        existing = _retried(admin.list_topics)
        if topic not in existing:
            try:
                admin.create_topics(
                    {topic: {"num_partitions": partitions or 4, "replication_factor": -1}},
                    wait_for_metadata=True,
                )
                log.info("created topic %s with %d partitions", topic, partitions or 4)
            except TopicAlreadyExistsError:
                pass
        elif partitions is not None:
            found = _retried(lambda: admin.describe_topics([topic]))
            have = len(found[0].get("partitions") or []) if found else 0
            if have and have != partitions:
                log.warning(
                    "topic %s exists with %d partitions: --partitions %d applies only to a "
                    "topic this command creates (add partitions with kafka-topics.sh --alter "
                    "--partitions N)",
                    topic,
                    have,
                    partitions,
                )
    finally:
        admin.close()
    producer = connect(
        new_producer,
        bootstrap_servers,
        security,
        30_000,
        linger_ms=20,
        batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
        compression_type=None if compression in (None, "none") else compression,
    )
    rng = np.random.default_rng(seed)
    show = progress if progress is not None else (sys.stderr if sys.stderr.isatty() else None)
    t0 = time.monotonic()
    sent = 0
    delivered = 0  # acknowledged by the broker: what the summary and the return value say

    def acked(_metadata: object) -> None:  # on the producer's I/O thread only
        nonlocal delivered
        delivered += 1

    chunk = 1000
    logged = drawn = t0
    interrupted = False
    try:
        while records is None or sent < records:
            n = chunk if records is None else min(chunk, records - sent)
            if rate:
                due = t0 + sent / rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                n = min(n, max(1, int(rate / 10)))
            for value in task.records(n, rng, record_bytes):
                producer.send(topic, value=value).add_callback(acked)
                sent += 1  # a Ctrl-C may land mid-block
            now = time.monotonic()
            if show is not None and now - drawn >= 0.2:
                drawn = now
                _progress(show, sent, records, t0)
            elif show is None and now - logged >= _LOG_EVERY_S:
                logged = now
                of = f" of {records:,}" if records else ""
                log.info(
                    "produced %s%s records to %s (%.0f/s)", f"{sent:,}", of, topic,
                    sent / (now - t0),
                )  # fmt: skip
        producer.flush(timeout=120)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        producer.close(timeout=10 if interrupted else 30)  # sends what it holds first
        if show is not None:
            _progress(show, delivered, records, t0)
            show.write("\n")
        took = time.monotonic() - t0
        log.info(
            "%sproduced %s records to %s in %.1fs (%.0f/s)%s",
            "interrupted (Ctrl-C): " if interrupted else "",
            f"{delivered:,}",
            topic,
            took,
            delivered / max(took, 1e-6),
            f"; {sent - delivered:,} sent were not acknowledged" if sent > delivered else "",
        )
    return delivered
