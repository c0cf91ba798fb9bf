"""Decompression bombs: record batches of ~100 KB that inflate to ~100 MB (25,000 records of
4 KiB of zeros), between good records, read by a real worker process with
``--max-batch-inflated-bytes 8 MiB``, on both clients (kafka-python: zstd and gzip, in shard
child processes; confluent: zstd with and without its inflated size in the frame).

Fetch limits count compressed bytes, so without a bound kafka-python inflates such a batch
whole (a 1 GB bomb took the worker's process tree to 2.5-2.7 GiB: a larger one is an OOM and
a crash loop on the same offset), and librdkafka refuses it and fetches it again for ever (the
partition stalls, counted as connection errors). With the bound the batch is never inflated:
each client skips it, the shard logs one ERROR naming the topic, partition, offset range, sizes
and the setting, and counts it (``streamer_kafka_errors_total{type="batch_refused"}``); every
good record before and after it is trained once, the group commits the log end (a bomb that
ends its partition too), and the worker exits 0 at idle. Memory stays bounded: the peak RSS of
each shard child stays below ``SHARD_CHILD_BOUND`` and their sum below ``MEMORY_BOUND``.

A batch librdkafka cannot inflate although it is within the bound stops the worker with a clear
error (never a silent stall).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import KafkaProducer

from streamer.input.simulator import SimulatorTask
from tests.reliability.relutil import http_get, metrics_base, start_worker
from tests.workerutil import (
    committed_offsets,
    end_offsets,
    free_port,
    parse_metrics,
    read_audit,
    worker_args,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MiB = 1024 * 1024
BOUND = 8 * MiB
#: One bomb: this many records of zeros in one zstd batch (~100 MB inflated, ~100 KB on the wire).
BOMB_RECORDS, BOMB_RECORD_BYTES = 25_000, 4096
#: Memory, as the peak RSS (VmHWM) of each of the worker's processes. Measured here: the sum
#: is ~715 MiB without a bomb and ~740 MiB with the two (kafka-python's shard children: ~52
#: and ~64 MiB; ~190 MiB each when the bound is out of reach and they inflate their bomb);
#: confluent (one process) ~610 and ~640 MiB.
MEMORY_BOUND = 1536 * MiB
SHARD_CHILD_BOUND = 128 * MiB
_REFUSED = re.compile(
    r"ERROR .*record batch of (\S+) partition (\d+), offsets (\d+)-(\d+) \((\d+) records, "
    r"(\d+) bytes of (\w+)\), inflates past max_batch_inflated_bytes=(\d+)"
)


def _good(bootstrap: str, topic: str, partition: int, n: int, seed: int) -> list[int]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        values = SimulatorTask().records(n, np.random.default_rng(seed))
        futures = [producer.send(topic, value=v, partition=partition) for v in values]
        return [int(f.get(timeout=60).offset) for f in futures]
    finally:
        producer.close(timeout=30)


def _bomb(
    bootstrap: str, topic: str, partition: int, codec: str, records: int = BOMB_RECORDS
) -> tuple[int, int]:
    """One batch of ``records`` records of zeros; its first and last offset.

    ``codec`` "zstd-unsized": a zstd frame that does not state its inflated size (as the Java
    producer writes them; kafka-python's states it), which librdkafka inflates by guesses.
    """
    import kafka.record.default_records as builder
    import zstandard

    encode = builder.zstd_encode
    if codec == "zstd-unsized":
        builder.zstd_encode = zstandard.ZstdCompressor(write_content_size=False).compress
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        compression_type=codec.split("-")[0],
        linger_ms=60_000,  # everything goes in one batch, sent by flush()
        delivery_timeout_ms=300_000,
        batch_size=records * (BOMB_RECORD_BYTES + 64) + MiB,
    )
    try:
        value = bytes(BOMB_RECORD_BYTES)
        futures = [producer.send(topic, value=value, partition=partition) for _ in range(records)]
        producer.flush(60)
        first, last = (int(f.get(timeout=60).offset) for f in (futures[0], futures[-1]))
    finally:
        producer.close(timeout=30)
        builder.zstd_encode = encode
    assert last - first == records - 1
    return first, last


class PeakMemory:
    """Samples the worker's process tree every 50 ms: the largest sum of RSS seen, and per
    process its peak RSS as the kernel counted it (VmHWM: no spike is missed)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tree_rss = 0
        self.hwm: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def hwm_sum(self) -> int:
        return sum(self.hwm.values())

    def _tree(self) -> list[int]:
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(child for child, parent in parents.items() if parent == pid)
        return tree

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            total = 0
            for pid in self._tree():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                fields = dict(
                    line.split(":", 1) for line in status.splitlines() if line.startswith("Vm")
                )
                if "VmRSS" not in fields:
                    continue  # a zombie
                total += int(fields["VmRSS"].split()[0]) * 1024
                hwm = int(fields["VmHWM"].split()[0]) * 1024
                self.hwm[pid] = max(hwm, self.hwm.get(pid, 0))
            self.tree_rss = max(self.tree_rss, total)


def _kafka_errors(base: str) -> dict[str, float]:
    status, body = http_get(f"{base}/metrics")
    assert status == 200, body
    return {
        labels["type"]: value
        for labels, value in parse_metrics(body).get("streamer_kafka_errors_total", [])
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("client", "codecs"),
    [
        # kafka-python inflates every codec itself, within the bound (in shard children).
        pytest.param("kafka-python", ("zstd", "gzip"), id="kafka-python"),
        # librdkafka bounds zstd only (receive.message.max.bytes); kafka-python finds the end.
        pytest.param("confluent", ("zstd", "zstd-unsized"), id="confluent"),
        # librdkafka inflates gzip and lz4 whole: a topic with compression.type=zstd has the
        # broker write every batch as zstd (docs/explanation/reliability.md, decompression bombs), which it bounds.
        pytest.param("confluent", ("gzip", "lz4"), id="confluent, gzip and lz4 on a zstd topic"),
    ],
)
def test_a_decompression_bomb_is_skipped_without_inflating_it(
    client: str,
    codecs: tuple[str, str],
    kafka_bootstrap: str,
    make_topic: Any,
    group_id: str,
    tmp_path: Path,
) -> None:
    """Partition 0: good records, a bomb, good records; partition 1: good records, a bomb (its
    last batch: the commit still reaches the log end)."""
    stored = {c: "zstd" for c in codecs} if client == "confluent" and "lz4" in codecs else {}
    topic = make_topic(2, config={"compression.type": "zstd"} if stored else None)
    good = {(0, o) for o in _good(kafka_bootstrap, topic, 0, 20, 1)}
    good |= {(1, o) for o in _good(kafka_bootstrap, topic, 1, 20, 2)}
    bombs = {p: _bomb(kafka_bootstrap, topic, p, codec) for p, codec in enumerate(codecs)}
    good |= {(0, o) for o in _good(kafka_bootstrap, topic, 0, 20, 3)}

    audit = tmp_path / "audit.csv"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        audit,
        shards=2,
        batch_size=16,
        stop_after_idle=6,
        extra=[
            *("--metrics-port", str(free_port())),
            *("--kafka-client", client),
            *("--shard-runtime", "process" if client == "kafka-python" else "thread"),
            *("--max-batch-inflated-bytes", str(BOUND)),
        ],
    )
    started = time.monotonic()
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        with PeakMemory(worker.pid) as memory:
            base = metrics_base(worker)
            worker.wait_for(lambda: len(read_audit(audit, topic)) >= len(good), 90, "good records")
            worker.wait_for(
                lambda: _kafka_errors(base).get("batch_refused", 0) >= 2, 30, "refusals counted"
            )
            errors = _kafka_errors(base)
            code = worker.wait(60)
    finally:
        worker.kill()
    seconds = time.monotonic() - started
    log = worker.log()
    print(
        f"{client}: {seconds:.1f}s, peak RSS of the process tree {memory.tree_rss / MiB:.0f} MiB, "
        f"sum of per-process peaks {memory.hwm_sum / MiB:.0f} MiB ({len(memory.hwm)} processes)"
    )

    assert code == 0, worker.tail()
    trained = read_audit(audit, topic)
    assert set(trained) == good, sorted(set(trained) ^ good)[:10]
    assert set(trained.values()) == {1}, "a record was trained twice"

    # One ERROR per bomb, naming it; counted once each, never as a connection error.
    refused = sorted(
        (int(p), int(first), int(last), codec)
        for t, p, first, last, records, _size, codec, bound in _REFUSED.findall(log)
        if t == topic and int(records) == BOMB_RECORDS and int(bound) == BOUND
    )
    want = [(p, *bombs[p], stored.get(codecs[p], codecs[p].split("-")[0])) for p in (0, 1)]
    assert refused == want, _errors_of(log)
    assert errors.get("batch_refused") == 2, errors
    assert not errors.get("connection"), errors

    ends = end_offsets(kafka_bootstrap, topic)
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends
    assert ends[1] == bombs[1][1] + 1
    assert memory.hwm_sum < MEMORY_BOUND, (memory.hwm_sum / MiB, memory.hwm)
    children = [hwm for pid, hwm in memory.hwm.items() if pid != worker.pid]
    assert len(children) >= (2 if client == "kafka-python" else 0), memory.hwm
    assert all(hwm < SHARD_CHILD_BOUND for hwm in children), memory.hwm


def _errors_of(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if " ERROR " in line or "WARNING" in line)[
        -4000:
    ]


@pytest.mark.timeout(180)
def test_a_batch_librdkafka_cannot_inflate_within_the_bound_stops_the_worker_loudly(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    """A zstd batch that does not state its inflated size (~59 MB) under a bound of 60 MiB:
    librdkafka's guesses stop at ~29 MB (each 3x the last, within receive.message.max.bytes =
    the bound) and it refuses the batch, yet the batch is within the bound. The confluent
    client cannot skip it (it is not a bomb) nor read it: the worker stops with a clear error
    naming the partition and offset, instead of stalling on the partition."""
    bound = 60 * MiB
    topic = make_topic(1)
    good = {(0, o) for o in _good(kafka_bootstrap, topic, 0, 20, 1)}
    first, _last = _bomb(kafka_bootstrap, topic, 0, "zstd-unsized", records=14_500)
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        tmp_path / "audit.csv",
        shards=1,
        batch_size=4,
        stop_after_idle=30,
        extra=[*("--kafka-client", "confluent"), *("--max-batch-inflated-bytes", str(bound))],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        code = worker.wait(90)
    finally:
        worker.kill()
    log = worker.log()
    assert code != 0, worker.tail()
    assert set(read_audit(tmp_path / "audit.csv", topic)) <= good
    message = f"the record batch at offset {first} of {topic} partition 0 cannot be read"
    assert message in log, worker.tail()
    assert "librdkafka cannot inflate it" in log and "although it inflates within" in log
