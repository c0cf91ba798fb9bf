"""Smoke test of the 3-node cluster tool (issue 24): deploy/local/kafka-cluster.sh and the
``kafka_cluster`` fixture. A partition leader is killed with SIGKILL: producing with acks=all
goes on through the new leader, and the restarted node rejoins the ISR."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.reliability.cluster import KafkaCluster

pytestmark = [pytest.mark.kafka]

PARTITIONS = 6


def _produce(producer: Any, topic: str, tag: str, per_partition: int) -> int:
    """Write ``per_partition`` records to every partition and wait for every acknowledgement."""
    futures = [
        producer.send(topic, partition=p, value=f"{tag}-{p}-{i}".encode())
        for p in range(PARTITIONS)
        for i in range(per_partition)
    ]
    for future in futures:
        future.get(timeout=60)
    return len(futures)


def test_leader_killed_producer_goes_on_node_rejoins_isr(kafka_cluster: KafkaCluster) -> None:
    from kafka import KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, OffsetSpec

    cluster = kafka_cluster
    cluster.heal()  # a test before this one in the module may have left a node down
    assert len(cluster.servers) == 3
    assert cluster.controller() in (1, 2, 3)

    topic = cluster.create_topic("cluster", PARTITIONS)
    assert cluster.isr_of(topic, 0) == [1, 2, 3]

    producer = KafkaProducer(
        bootstrap_servers=cluster.servers,
        acks="all",
        request_timeout_ms=10_000,
        delivery_timeout_ms=60_000,
        linger_ms=5,
    )
    try:
        acked = _produce(producer, topic, "before", 20)
        leader = cluster.leader_of(topic, 0)

        cluster.kill_node(leader)
        assert cluster.status()[leader] == "stopped"
        t0 = time.monotonic()
        acked += _produce(producer, topic, "after-kill", 20)  # 2 replicas left: min ISR met
        failover_s = time.monotonic() - t0
        new_leader = cluster.wait_for_leader(topic, 0, not_on=leader, timeout=30)
        assert new_leader != leader
        assert leader not in cluster.isr_of(topic, 0)

        t0 = time.monotonic()
        cluster.restart_node(leader)  # returns once 3 brokers are live and every ISR is full
        restart_s = time.monotonic() - t0
        assert leader in cluster.isr_of(topic, 0)
        assert cluster.isr_of(topic, 0) == [1, 2, 3]
        healthy, line = cluster.health()
        assert healthy, line
        acked += _produce(producer, topic, "after-restart", 5)
        print(f"produce through the failover {failover_s:.1f}s, node restart {restart_s:.1f}s")
    finally:
        producer.close(timeout=10)

    # Nothing acknowledged was lost: the log end offsets add up to at least what was acked.
    admin = KafkaAdminClient(bootstrap_servers=cluster.servers, client_id="cluster-smoke")
    try:
        ends = admin.list_partition_offsets(
            {TopicPartition(topic, p): OffsetSpec.LATEST for p in range(PARTITIONS)}
        )
        total = sum(info.offset for info in ends.values())
        admin.delete_topics([topic])
    finally:
        admin.close()
    assert total >= acked, (total, acked)
