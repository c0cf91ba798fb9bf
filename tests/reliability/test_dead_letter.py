"""The dead-letter topic against the real broker: created when missing, a refusal at start-up is
exit 2, and at run time a topic that disappears never stops training or loses a record.

While the dead-letter topic is gone, writes of rejected records fail (the broker has no such
topic and does not create topics): the failures are counted, good records keep training, and
the commit point of a partition stays below its first rejected record that is not written.
Once the topic exists again, the waiting records are written and commits reach the end.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from streamer.simulator import SimulatorTask
from tests.reliability.relutil import http_get, metrics_base, run_cli, start_worker, wait_until
from tests.workerutil import (
    committed_offsets,
    free_port,
    parse_metrics,
    read_audit,
    worker_args,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BAD = b"\xc1"  # never valid msgpack: reason "format"


def _produce(bootstrap: str, topic: str, partition: int, plan: list[bool]) -> list[int]:
    """Good (True) and bad (False) records to one partition; returns their offsets."""
    import numpy as np

    values = iter(SimulatorTask().records(len(plan), np.random.default_rng(len(plan))))
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        futures = [
            producer.send(topic, value=next(values) if good else BAD, partition=partition)
            for good in plan
        ]
        return [int(f.get(timeout=60).offset) for f in futures]
    finally:
        producer.close(timeout=30)


def _sample(base: str, name: str, **labels: str) -> float:
    status, body = http_get(f"{base}/metrics")
    assert status == 200
    return sum(
        v
        for lb, v in parse_metrics(body).get(name, [])
        if all(lb.get(k) == want for k, want in labels.items())
    )


@pytest.mark.timeout(300)
def test_a_missing_dead_letter_topic_fails_writes_without_stopping_training(
    kafka_bootstrap: str, kafka_admin: Any, make_topic: Any, tmp_path: Path, group_id: str
) -> None:
    topic = make_topic(1)
    dead = f"dlq-{uuid.uuid4().hex[:8]}"
    audit = tmp_path / "audit.csv"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        audit,
        shards=1,
        batch_size=16,
        stop_after_idle=None,
        extra=[
            *("--dead-letter-topic", dead, "--metrics-port", str(free_port())),
            *("--commit-every-seconds", "0.5", "--idle-timeout", "2"),
        ],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        base = metrics_base(worker)
        first = _produce(kafka_bootstrap, topic, 0, [True] * 20 + [False] + [True] * 20)
        worker.wait_for(
            lambda: committed_offsets(kafka_bootstrap, group_id, topic).get(0) == first[-1] + 1,
            120,
            "the first records committed (the bad one dead-lettered)",
        )
        assert _sample(base, "streamer_records_dead_lettered_total") == 1

        kafka_admin.delete_topics([dead])  # the broker creates no topic on its own
        wait_until(lambda: dead not in kafka_admin.list_topics(), 30, "the dead-letter topic gone")
        second = _produce(kafka_bootstrap, topic, 0, [True] * 10 + [False] + [True] * 30)
        bad_offset = second[10]
        worker.wait_for(
            lambda: (
                read_audit(audit, topic).keys() >= {(0, o) for i, o in enumerate(second) if i != 10}
            ),
            60,
            "the good records after the rejected one trained",
        )
        worker.wait_for(
            lambda: _sample(base, "streamer_kafka_errors_total", type="dead_letter") >= 1,
            60,
            "the failed dead-letter write counted",
        )
        assert _sample(base, "streamer_queue_depth_records", stage="dead_letter") == 1
        # Passes end after 2 s without records and read on from the commit point: the rejected
        # record again (not queued twice), the good ones after it too (trained again: at least
        # once). The commit point stays at the rejected record.
        time.sleep(5)
        assert _sample(base, "streamer_queue_depth_records", stage="dead_letter") == 1
        assert committed_offsets(kafka_bootstrap, group_id, topic)[0] == bad_offset
        assert worker.alive()

        kafka_admin.create_topics({dead: {"num_partitions": 1, "replication_factor": 1}})
        worker.wait_for(
            lambda: committed_offsets(kafka_bootstrap, group_id, topic).get(0) == second[-1] + 1,
            90,
            "the retried write acknowledged and the commits at the end",
        )
        # Written once it could be; a pass that ended while the write waited may have read it again
        # and written it a second time (dead letters are at least once, like training).
        assert _sample(base, "streamer_records_dead_lettered_total") >= 2
        assert _sample(base, "streamer_queue_depth_records", stage="dead_letter") == 0
        worker.terminate()
        assert worker.wait(60) == 0
    finally:
        worker.kill()
    assert "dead-letter write to" in worker.log()


def test_a_dead_letter_topic_the_broker_refuses_to_create_fails_start_up_with_exit_2(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    topic = make_topic(3)
    dead = f"dlq-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    proc = run_cli(
        [
            *("run", "--bootstrap", kafka_bootstrap, "--topic", topic, "--group", group_id),
            *("--dead-letter-topic", dead, "--dead-letter-replication-factor", "3"),
            *("--metrics-port", "0", "--max-steps", "1"),
        ],
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    line = next(ln for ln in proc.stderr.splitlines() if dead in ln and "ERROR" in ln)
    assert "InvalidReplicationFactorError" in line
    assert "3 partitions" in line and "Create it" in line
