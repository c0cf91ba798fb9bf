"""Rebalances while records are in flight: every record trained once, commits reach the end.

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
from streamer.input.pipeline import PipelineSettings
from streamer.input.simulator import SimulatorTask
from streamer.input.source import StreamSource

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
    """Joins the group as a dynamic member, holds its share for a moment, leaves; repeats.

    It speaks the shards' protocol (a group takes one): the same client library and
    assignment strategy, or Kafka 4's consumer protocol.
    """

    def __init__(
        self, cs: ConsumerSettings, started: threading.Event, rounds: int = DISRUPTIONS
    ) -> None:
        super().__init__(name="rebalance-disruptor", daemon=True)
        self.cs = cs
        self.started = started
        self.target = rounds
        self.rounds = 0
        self.stop = threading.Event()

    def run(self) -> None:
        self.started.wait(60)
        while self.rounds < self.target and not self.stop.is_set():
            if self.cs.client == "confluent":
                self._confluent_round()
            else:
                self._kafka_python_round()
            self.rounds += 1
            self.stop.wait(0.7)

    def _kafka_python_round(self) -> None:
        from consumers.clients.kafka_python import _ASSIGNORS

        member = KafkaConsumer(
            bootstrap_servers=self.cs.bootstrap_servers,
            group_id=self.cs.group_id,
            enable_auto_commit=False,  # it never commits: what it fetches is not consumed
            auto_offset_reset="earliest",
            max_poll_records=1,
            heartbeat_interval_ms=500,
            session_timeout_ms=10_000,
            partition_assignment_strategy=[_ASSIGNORS[self.cs.partition_assignment_strategy]],
        )
        member.subscribe([self.cs.topic])
        deadline = time.monotonic() + 15
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(timeout_ms=100)
        member.pause(*member.assignment())
        for _ in range(5):
            member.poll(timeout_ms=100)
        member.close()  # LeaveGroup: the group rebalances again at once

    def _confluent_round(self) -> None:
        import confluent_kafka as ck

        from consumers.clients.confluent import consumer_config

        cfg = consumer_config(self.cs, 99)
        cfg.pop("group.instance.id", None)  # dynamic: leaving rebalances at once
        member = ck.Consumer(cfg)
        member.subscribe([self.cs.topic])
        deadline = time.monotonic() + 20
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.1)
        if member.assignment():
            member.pause(member.assignment())
        for _ in range(5):
            member.poll(0.1)
        member.close()


#: (client, assignment strategy, group protocol): each client's eager and cooperative
#: rebalancing, and Kafka 4's consumer protocol.
PROTOCOLS = [
    pytest.param("kafka-python", "cooperative-sticky", "classic", "thread", id="kp-coop-thread"),
    pytest.param("kafka-python", "cooperative-sticky", "classic", "process", id="kp-coop-process"),
    pytest.param("kafka-python", "range", "classic", "process", id="kp-eager-process"),
    pytest.param("confluent", "cooperative-sticky", "classic", "thread", id="ck-coop-thread"),
    pytest.param("confluent", "range", "classic", "thread", id="ck-eager-thread"),
    pytest.param("confluent", "cooperative-sticky", "consumer", "thread", id="ck-kip848-thread"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("client", "strategy", "protocol", "runtime"), PROTOCOLS)
def test_rebalances_mid_stream_skip_nothing_and_commit_to_the_end(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    client: str,
    strategy: str,
    protocol: str,
    runtime: str,
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
        client=client,  # type: ignore[arg-type]
        partition_assignment_strategy=strategy,  # type: ignore[arg-type]
        group_protocol=protocol,  # type: ignore[arg-type]
    )
    settings = PipelineSettings(num_shards=3, batch_size=100, idle_timeout_seconds=4, linger=True)
    source = StreamSource(TASK.schema(), settings, consumer=cs)
    started = threading.Event()
    disruptor = _Disruptor(cs, started)
    disruptor.start()
    seen: list[tuple[int, int]] = []
    everything = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
    deadline = time.monotonic() + 180
    ends = dict.fromkeys(range(PARTITIONS), PER_PARTITION)

    def one_pass() -> None:
        for i, batch in enumerate(source.dataset()):
            started.set()
            parts = batch["partition"].numpy()
            offs = batch["offset"].numpy()
            seen.extend(zip(parts.tolist(), offs.tolist(), strict=True))
            # Slow "training": blocks pile up in flight while the group rebalances.
            time.sleep(0.1 if disruptor.is_alive() else 0)
            source.tracker.ack(parts, offs)
            if i % 10 == 0:
                source.commit()
        source.commit()
        source.end_pass()

    try:
        # Passes, as the worker runs them: a pass ends when its shards saw nothing for 4 s (a
        # partition held by the other member for a while, say); the next starts from the
        # commits. Every record trained, and the commits at the end, whatever the rebalances.
        while time.monotonic() < deadline and not everything <= set(seen):
            one_pass()
        # Then the group settles (the other member leaves) and a pass owns every partition
        # again: it commits what a revocation's failed commit (RebalanceInProgress) left
        # behind, training those records again (at least once). Asserting the commits right
        # after the last record was seen raced the other member, which held a partition.
        disruptor.stop.set()
        disruptor.join(30)
        while time.monotonic() < deadline and _committed(kafka_bootstrap, group_id, topic) != ends:
            one_pass()
    finally:
        source.end_pass()
        disruptor.stop.set()
        disruptor.join(30)
    assert disruptor.rounds >= 2, f"only {disruptor.rounds} rebalances happened during the pass"
    missing = everything - set(seen)
    assert not missing, f"{len(missing)} records never trained, e.g. {sorted(missing)[:5]}"
    assert _committed(kafka_bootstrap, group_id, topic) == ends
    dups = len(seen) - len(set(seen))
    print(
        f"{client} {strategy} {protocol} {runtime}: {disruptor.rounds} rebalances, "
        f"{len(seen)} records, {dups} trained twice"
    )
    # A revocation hands over exactly (streamer.input.handover): what was handed to training
    # is trained and committed first, the rest of the partition is never trained here.
    assert dups == 0, f"{dups} records trained twice across {disruptor.rounds} rebalances"
