"""Start positions and bounded replay against the real broker, with known record timestamps."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaProducer

from consumers.settings import ConsumerSettings
from streamer.input.pipeline import PipelineSettings
from streamer.input.simulator import SimulatorTask
from streamer.input.source import StreamSource

pytestmark = pytest.mark.kafka

TASK = SimulatorTask()


def _produce_timed(
    bootstrap: str, topic: str, partitions: int, per: int, base_ms: int
) -> dict[tuple[int, int], int]:
    """Record (p, offset) gets timestamp base + 1000*i + p (i = offset): known and increasing."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    stamps = {}
    values = TASK.records(per * partitions, np.random.default_rng(5))
    for p in range(partitions):
        for i in range(per):
            ts = base_ms + 1000 * i + p
            producer.send(topic, value=values[p * per + i], partition=p, timestamp_ms=ts)
            stamps[(p, i)] = ts
    producer.flush(30)
    producer.close()
    return stamps


def _run(bootstrap: str, topic: str, mode: str, **pipeline: object) -> set[tuple[int, int]]:
    extra = {"mode": "static", "partitions": (0, 1, 2)} if mode == "static" else {}
    cs = ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        num_shards=2,
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
        heartbeat_interval_ms=500,
        **extra,  # type: ignore[arg-type]
    )
    source = StreamSource.open(
        TASK.schema(),
        PipelineSettings(num_shards=2, batch_size=64, idle_timeout_seconds=3, **pipeline),  # type: ignore[arg-type]
        consumer=cs,
    )
    got: list[tuple[int, int]] = []
    for batch in source.dataset():
        got.extend(
            zip(batch["partition"].numpy().tolist(), batch["offset"].numpy().tolist(), strict=True)
        )
    assert len(got) == len(set(got))
    return set(got)


@pytest.mark.parametrize("mode", ["group", "static"])
def test_start_time_selects_exactly_the_records_at_or_after_it(
    kafka_bootstrap: str, make_topic: Callable[..., str], mode: str
) -> None:
    topic = make_topic(3)
    base = int(time.time() * 1000) - 3_600_000
    stamps = _produce_timed(kafka_bootstrap, topic, 3, 200, base)
    start = base + 1000 * 120  # offsets >= 120 of partition 0, >= 120 of the others (ts + p)
    got = _run(kafka_bootstrap, topic, mode, start_from=start)
    assert got == {k for k, ts in stamps.items() if ts >= start}
    assert _run(kafka_bootstrap, topic, mode, start_from="latest") == set()
    assert _run(kafka_bootstrap, topic, mode, start_from="earliest") == set(stamps)


def test_replay_range_trains_exactly_that_range(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(3)
    base = int(time.time() * 1000) - 3_600_000
    stamps = _produce_timed(kafka_bootstrap, topic, 3, 300, base)
    lo, hi = base + 1000 * 50, base + 1000 * 170
    got = _run(kafka_bootstrap, topic, "static", start_from=lo, stop_at=hi)
    assert got == {k for k, ts in stamps.items() if lo <= ts < hi}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_streamer_replay_trains_the_range_and_stops(
    kafka_bootstrap: str, make_topic: Callable[..., str], tmp_path: Path, client: str
) -> None:
    """A replay into a group of its own (--replay-group): the range trained, then the group's
    commits at the range's end, marked as a replay's (offset metadata, both clients)."""
    topic = make_topic(2)
    base = int(time.time() * 1000) - 3_600_000
    stamps = _produce_timed(kafka_bootstrap, topic, 2, 400, base)
    lo, hi = base + 1000 * 100, base + 1000 * 250
    audit = tmp_path / "audit.csv"
    group = f"g-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        [
            sys.executable, "-m", "streamer.cli", "replay",
            "--bootstrap", kafka_bootstrap, "--topic", topic, "--replay-group", group,
            "--from", str(lo), "--to", str(hi), "--shards", "2", "--batch-size", "64",
            "--metrics-port", "0", "--audit-log", str(audit), "--idle-timeout", "30",
            "--kafka-client", client,
        ],
        capture_output=True, text=True, timeout=240, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "replay range is trained" in proc.stderr
    rows = [line.split(",") for line in audit.read_text().splitlines()]
    got = [(int(p), int(o)) for _t, p, o in rows]
    assert len(got) == len(set(got))
    assert set(got) == {k for k, ts in stamps.items() if lo <= ts < hi}
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group)  # never polls
    try:
        committed = {p: reader.committed(TopicPartition(topic, p), metadata=True) for p in (0, 1)}
    finally:
        reader.close(autocommit=False)
    ends = {p: min(o for (q, o), ts in stamps.items() if q == p and ts >= hi) for p in range(2)}
    assert {p: om.offset for p, om in committed.items() if om is not None} == ends, committed
    assert all(om.metadata.startswith("streamer-replay") for om in committed.values()), committed
