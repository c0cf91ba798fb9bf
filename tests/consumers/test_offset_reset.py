"""auto_offset_reset applied by the shard: quiet without a commit, loud and counted when out of range."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry

from consumers.settings import ConsumerSettings
from streamer.input.pipeline import PipelineSettings
from streamer.input.simulator import SimulatorTask
from streamer.input.source import StreamSource
from streamer.ops.metrics import Metrics

pytestmark = pytest.mark.kafka

TASK = SimulatorTask()


def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for v in TASK.records(n, np.random.default_rng(3)):
        producer.send(topic, value=v, partition=0)
    producer.flush(30)
    producer.close()


def _source(
    bootstrap: str,
    topic: str,
    group: str,
    reset: str,
    registry: CollectorRegistry,
    runtime: str = "thread",
) -> StreamSource:
    cs = ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        mode="static",
        partitions=(0,),
        num_shards=1,
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
        auto_offset_reset=reset,  # type: ignore[arg-type]
        shard_runtime=runtime,  # type: ignore[arg-type]
    )
    metrics = Metrics(
        topic, registry, version="t", tensorflow_version="t", kafka_python_version="t"
    )
    return StreamSource(
        TASK.schema(),
        PipelineSettings(num_shards=1, batch_size=50, idle_timeout_seconds=3),
        consumer=cs,
        metrics=metrics,
    )


def _offsets(source: StreamSource) -> list[int]:
    out: list[int] = []
    for batch in source.dataset():
        out.extend(batch["offset"].numpy().tolist())
    return out


def test_out_of_range_offset_applies_policy_and_is_counted_loudly(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = make_topic(1)
    _produce(kafka_bootstrap, topic, 300)
    tp = TopicPartition(topic, 0)
    committer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=group_id, enable_auto_commit=False
    )
    committer.assign([tp])
    committer.commit({tp: OffsetAndMetadata(50, "", -1)})
    committer.close()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.delete_records({tp: 200})  # retention removed 0..199 while nobody consumed
    admin.close()

    registry = CollectorRegistry()
    with caplog.at_level(logging.ERROR, logger="consumers.shard"):
        offsets = _offsets(_source(kafka_bootstrap, topic, group_id, "earliest", registry))
    assert offsets == list(range(200, 300))
    assert (
        registry.get_sample_value("streamer_kafka_errors_total", {"type": "offset_out_of_range"})
        == 1
    )
    assert any("out of range" in r.getMessage() and "50" in r.getMessage() for r in caplog.records)


def test_no_committed_offset_uses_policy_quietly(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    topic = make_topic(1)
    _produce(kafka_bootstrap, topic, 120)
    registry = CollectorRegistry()
    assert _offsets(_source(kafka_bootstrap, topic, group_id, "earliest", registry)) == list(
        range(120)
    )
    assert (
        registry.get_sample_value("streamer_kafka_errors_total", {"type": "offset_out_of_range"})
        == 0
    )
    assert (
        _offsets(_source(kafka_bootstrap, topic, group_id + "-l", "latest", CollectorRegistry()))
        == []
    )


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_policy_none_without_committed_offset_fails_with_a_clear_error(
    runtime: str, kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    """In a shard process the error crosses the pipe (pickled) and still fails the pass."""
    topic = make_topic(1)
    _produce(kafka_bootstrap, topic, 10)
    source = _source(kafka_bootstrap, topic, group_id, "none", CollectorRegistry(), runtime)
    with pytest.raises(Exception, match="auto_offset_reset=none") as info:
        _offsets(source)
    assert source.shard_failure() is not None or "no committed offset" in str(info.value)
