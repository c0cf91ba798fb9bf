"""The first integration test: a real broker round trip with kafka-python."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kafka import KafkaConsumer, KafkaProducer

pytestmark = pytest.mark.kafka


def test_produce_and_read_back_every_record(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=4)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    sent = {f"r{i}".encode() for i in range(300)}
    for i, value in enumerate(sorted(sent)):
        producer.send(topic, value=value, partition=i % 4)
    producer.flush(timeout=30)
    producer.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=5000,
    )
    seen: dict[bytes, tuple[int, int]] = {}
    for record in consumer:
        seen[record.value] = (record.partition, record.offset)
        if len(seen) == len(sent):
            break
    consumer.close()
    assert set(seen) == sent
    assert {p for p, _ in seen.values()} == {0, 1, 2, 3}
    assert all(0 <= off < 75 for _, off in seen.values())
