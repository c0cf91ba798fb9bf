"""A process shard reports a missing topic to its owner (readiness), and its return."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from consumers.hooks import ShardHooks
from consumers.process import ProcessShard
from consumers.settings import ConsumerSettings

pytestmark = pytest.mark.kafka


class _Seen(ShardHooks):
    def __init__(self) -> None:
        self.missing: list[bool] = []

    def on_topic_missing(self, shard_index: int, missing: bool) -> None:
        self.missing.append(missing)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_process_shard_reports_a_missing_topic_and_its_creation(kafka_bootstrap: str) -> None:
    topic = f"later-{uuid.uuid4().hex[:8]}"
    settings = ConsumerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        mode="static",
        partitions=(0,),
        shard_runtime="process",
    )
    hooks = _Seen()
    shard = ProcessShard(settings, 0, 1, hooks=hooks)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="procshard-topic")
    try:
        shard.start()
        _wait(lambda: shard.topic_missing, 60, "the child to report the missing topic")
        assert hooks.missing == [True]
        admin.create_topics([NewTopic(topic, 1, 1)])
        # The child checks again with backoff (1 s doubling): within a few rounds.
        _wait(lambda: not shard.topic_missing, 60, "the child to report the topic back")
        assert hooks.missing == [True, False]
        assert shard.failed is None
    finally:
        shard.close()
        try:
            admin.delete_topics([topic])
        finally:
            admin.close()
