"""The reject breaker against the real broker: a wrong schema stops the worker (exit 4) before it
commits or dead-letters the topic away; fixed and restarted, the worker trains every record. A
stray bad record among good ones never trips it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from kafka import KafkaConsumer, KafkaProducer

from streamer.input.simulator import produce
from tests.workerutil import (
    WorkerProcess,
    committed_offsets,
    end_offsets,
    read_audit,
    worker_args,
)

pytestmark = pytest.mark.kafka

RECORDS = 2000
WRONG = """
label = "y"
[features.x]
dtype = "float32"
shape = [8]
[features.y]
dtype = "float32"
"""
RIGHT = WRONG.replace("shape = [8]", "shape = [16]")


def _count(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=4000
    )
    n = sum(1 for _ in consumer)
    consumer.close()
    return n


@pytest.mark.parametrize("dead_letters", [True, False], ids=["with a dead-letter topic", "without"])
def test_a_wrong_schema_stops_the_worker_and_loses_nothing(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path, dead_letters: bool
) -> None:
    """With a dead-letter topic the breaker keeps a wrong deploy from dead-lettering the topic
    away; without one, from skipping it (the rejects would be counted and committed past)."""
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, RECORDS, partitions=2)
    dlq = f"{topic}-dlq"
    wrong, right = tmp_path / "wrong.toml", tmp_path / "right.toml"
    wrong.write_text(WRONG, encoding="utf-8")
    right.write_text(RIGHT, encoding="utf-8")
    audit = tmp_path / "audit.csv"
    base = worker_args(
        kafka_bootstrap, topic, group_id, audit, shards=2, stop_after_idle=5,
        extra=["--dead-letter-topic", dlq] if dead_letters else [],
    )  # fmt: skip
    worker = WorkerProcess.start([*base, "--schema", str(wrong)], tmp_path / "wrong.log")
    code = worker.wait(180)
    log = worker.log()
    assert code == 4, log[-4000:]
    assert "stopped by the reject breaker" in log
    # The reject lines say which feature, what was expected and what came.
    assert "shape: x expected [8] float32 (32 bytes as bin), got 64 bytes (bin)" in log
    assert "Fix the schema" in log
    # Nothing committed, nothing dead-lettered, nothing trained.
    assert all(o in (None, 0) for o in committed_offsets(kafka_bootstrap, group_id, topic).values())
    if dead_letters:
        assert _count(kafka_bootstrap, dlq) == 0
    assert not read_audit(audit, topic)
    # Fixed and restarted: every record trained once, commits at the log end.
    fixed = WorkerProcess.start([*base, "--schema", str(right)], tmp_path / "right.log")
    assert fixed.wait(180) == 0, fixed.tail()
    counts = read_audit(audit, topic)
    assert sum(counts.values()) == RECORDS and set(counts.values()) == {1}
    assert committed_offsets(kafka_bootstrap, group_id, topic) == end_offsets(
        kafka_bootstrap, topic
    )


def test_a_stray_bad_record_never_trips_the_breaker(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    """Without a dead-letter topic: one bad record in 500 is counted and skipped."""
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, 400, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for _ in range(3):
        producer.send(topic, msgpack.packb({"x": b"\x00" * 10, "y": 1.0}), partition=0)
    producer.flush()
    producer.close()
    produce(kafka_bootstrap, topic, 400, partitions=1, seed=1)
    audit = tmp_path / "audit.csv"
    args = worker_args(kafka_bootstrap, topic, group_id, audit, shards=1, stop_after_idle=5)
    worker = WorkerProcess.start(args, tmp_path / "w.log")
    assert worker.wait(180) == 0, worker.tail()
    assert sum(read_audit(audit, topic).values()) == 800
    assert committed_offsets(kafka_bootstrap, group_id, topic) == {0: 803}
