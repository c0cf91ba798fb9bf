"""The simulator: a learnable synthetic task, produced into Kafka or served in-process as shards."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import msgpack
import numpy as np
import numpy.typing as npt

from consumers.block import RecordBlock
from streamer.schema import Schema

__all__ = [
    "SimulatedShard",
    "SimulatorTask",
    "produce",
]

log = logging.getLogger(__name__)

_PAD_KEY = "pad"


@dataclass(frozen=True, slots=True)
class SimulatorTask:
    """A regression task a small MLP learns: y = tanh(x·w1) + 0.5·sin(x·w2) + noise.

    >>> task = SimulatorTask()
    >>> batch = task.sample(4, np.random.default_rng(0))
    >>> batch["x"].shape, batch["y"].shape
    ((4, 16), (4,))
    """

    num_features: int = 16
    noise: float = 0.05
    seed: int = 1234

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
        pad_len = max(0, record_bytes - base - 8)
        pad = rng.bytes(pad_len) if pad_len else b""
        packb = msgpack.packb
        if pad:
            return [packb({"x": x[i].tobytes(), "y": float(y[i]), _PAD_KEY: pad}) for i in range(n)]
        return [packb({"x": x[i].tobytes(), "y": float(y[i])}) for i in range(n)]


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
        task: SimulatorTask | None = None,
        partitions: int = 4,
        block_records: int = 512,
        record_bytes: int = 0,
        rate: float | None = None,
        start_offsets: dict[int, int] | None = None,
        topic: str = "simulator",
    ) -> None:
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.task = task or SimulatorTask()
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


def _progress(out: IO[str], done: int, total: int, t0: float) -> None:
    elapsed = max(time.monotonic() - t0, 1e-6)
    frac = done / total if total else 1.0
    bar = "#" * int(frac * 30)
    out.write(f"\r[{bar:<30}] {done:>10,}/{total:,} records  {done / elapsed:>10,.0f}/s")
    out.flush()


def produce(
    bootstrap_servers: str,
    topic: str,
    records: int,
    *,
    partitions: int = 4,
    rate: float | None = None,
    record_bytes: int = 0,
    task: SimulatorTask | None = None,
    security: dict[str, Any] | None = None,
    progress: IO[str] | None = None,
    seed: int = 0,
    compression: str | None = None,
) -> int:
    """Create ``topic`` if missing and produce ``records`` simulator samples; returns the count.

    ``compression`` is the producer's ``compression_type`` (gzip, snappy, lz4, zstd; None or
    "none": uncompressed batches).

    >>> produce("127.0.0.1:9092", "samples", 10_000, partitions=6)   # doctest: +SKIP
    10000
    """
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    task = task or SimulatorTask()
    sec = security or {}
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap_servers, client_id="streamer-simulate", **sec
    )
    try:
        if topic not in admin.list_topics():
            try:
                admin.create_topics(
                    {topic: {"num_partitions": partitions, "replication_factor": 1}},
                    wait_for_metadata=True,
                )
                log.info("created topic %s with %d partitions", topic, partitions)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()
    producer = KafkaProducer(
        bootstrap_servers=bootstrap_servers,
        client_id="streamer-simulate",
        acks="all",
        linger_ms=20,
        batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
        compression_type=None if compression in (None, "none") else compression,
        **sec,
    )
    rng = np.random.default_rng(seed)
    show = progress if progress is not None else (sys.stderr if sys.stderr.isatty() else None)
    t0 = time.monotonic()
    sent = 0
    chunk = 1000
    try:
        while sent < records:
            n = min(chunk, records - sent)
            if rate:
                due = t0 + sent / rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                n = min(n, max(1, int(rate / 10)))
            for value in task.records(n, rng, record_bytes):
                producer.send(topic, value=value)
            sent += n
            if show is not None:
                _progress(show, sent, records, t0)
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=30)
        if show is not None:
            show.write("\n")
    log.info("produced %d records to %s in %.1fs", sent, topic, time.monotonic() - t0)
    return sent
