"""Rebalances while records are in flight: every record is trained, commits reach the end.

A member that joins and leaves the group (dynamic membership, so leaving rebalances at once)
makes the source's shards revoke and get back their partitions again and again while blocks
sit in their queues, in the tf.data pipeline and between a shard and the tracker. Whatever
the interleaving, no record may be skipped and the commit point must reach the end of every
partition: a commit that is lost between two owners, or a block taken by the pipeline just
as its partition is revoked, would leave the group's committed offsets behind.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from consumers.settings import ConsumerSettings
from streamer.settings import PipelineSettings
from streamer.simulator import SimulatorTask
from streamer.source import StreamSource

pytestmark = pytest.mark.kafka

TASK = SimulatorTask()
PARTITIONS = 6
PER_PARTITION = 2_000
DISRUPTIONS = 6


def _produce(bootstrap: str, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    rng = np.random.default_rng(3)
    for p in range(PARTITIONS):
        for v in TASK.records(PER_PARTITION, rng, 200):
            producer.send(topic, value=v, partition=p)
    producer.flush(60)
    producer.close()


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    probe = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {
            p: probe.committed(TopicPartition(topic, p), timeout_ms=10_000)
            for p in range(PARTITIONS)
        }
    finally:
        probe.close()


class _Disruptor(threading.Thread):
    """Joins the group as a dynamic member, holds its share for a moment, leaves; repeats."""

    def __init__(self, bootstrap: str, group: str, topic: str, started: threading.Event) -> None:
        super().__init__(name="rebalance-disruptor", daemon=True)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.started = started
        self.rounds = 0
        self.stop = threading.Event()

    def run(self) -> None:
        self.started.wait(60)
        while self.rounds < DISRUPTIONS and not self.stop.is_set():
            member = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group,
                enable_auto_commit=False,  # it never commits: what it fetches is not consumed
                auto_offset_reset="earliest",
                max_poll_records=1,
                heartbeat_interval_ms=500,
                session_timeout_ms=10_000,
            )
            member.subscribe([self.topic])
            deadline = time.monotonic() + 15
            while not member.assignment() and time.monotonic() < deadline:
                member.poll(timeout_ms=100)
            member.pause(*member.assignment())
            for _ in range(5):
                member.poll(timeout_ms=100)
            member.close()  # LeaveGroup: the group rebalances again at once
            self.rounds += 1
            self.stop.wait(0.7)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_rebalances_mid_stream_skip_nothing_and_commit_to_the_end(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, runtime: str
) -> None:
    topic = make_topic(PARTITIONS)
    _produce(kafka_bootstrap, topic)
    cs = ConsumerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group_id,
        num_shards=3,
        worker_id=f"w-{uuid.uuid4().hex[:8]}",
        heartbeat_interval_ms=500,
        session_timeout_ms=10_000,
        max_poll_records=200,
        queue_max_blocks=2,
        shard_runtime=runtime,  # type: ignore[arg-type]
    )
    settings = PipelineSettings(num_shards=3, batch_size=100, idle_timeout_seconds=4, linger=True)
    source = StreamSource(TASK.schema(), settings, consumer=cs)
    started = threading.Event()
    disruptor = _Disruptor(kafka_bootstrap, group_id, topic, started)
    disruptor.start()
    seen: list[tuple[int, int]] = []
    try:
        for i, batch in enumerate(source.dataset()):
            started.set()
            parts = batch["partition"].numpy()
            offs = batch["offset"].numpy()
            seen.extend(zip(parts.tolist(), offs.tolist(), strict=True))
            # Slow "training": blocks pile up in flight while the group rebalances.
            time.sleep(0.01 if disruptor.is_alive() else 0)
            source.tracker.ack(parts, offs)
            if i % 10 == 0:
                source.commit()
        source.commit()
    finally:
        source.end_pass()
        disruptor.stop.set()
        disruptor.join(30)
    assert disruptor.rounds >= 2, f"only {disruptor.rounds} rebalances happened during the pass"
    everything = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
    missing = everything - set(seen)
    assert not missing, f"{len(missing)} records never trained, e.g. {sorted(missing)[:5]}"
    assert _committed(kafka_bootstrap, group_id, topic) == dict.fromkeys(
        range(PARTITIONS), PER_PARTITION
    )
    dups = len(seen) - len(set(seen))
    print(f"{runtime}: {disruptor.rounds} rebalances, {len(seen)} records, {dups} trained twice")
