"""Topics written by Apache Kafka's Java producer, checked with Kafka's own tools.

One topic holds what production producers write: batches of every codec (gzip, snappy, lz4,
zstd: checked in the log segments with ``kafka-dump-log``), transactions of which every third
is aborted (left in the log), keys, headers, tombstones and record timestamps an hour ahead of
our clock. A real worker process reads it to idle. Then:

- read_committed (the default): every committed record trained exactly once, no aborted one;
  commits at every partition's log end, so Kafka's ``kafka-consumer-groups --describe``,
  ``streamer lag`` and the worker's ``/metrics`` all show lag 0; tombstones dead-lettered
  (reason ``truncated``) to a dead-letter topic the worker created (4 partitions, as the
  source); the future timestamps counted as clock skew and never fresher than now;
- read_uncommitted: aborted records are trained too (what the option says), commits still at
  the log end.

A ``LogAppendTime`` topic gives the broker's time, not the producer's, as record time.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from tests.interop.javaclients import (
    JavaProducer,
    broker_data_dir,
    by_kind,
    describe_group,
    log_codecs,
    read_manifest,
)
from tests.reliability.relutil import http_get, metrics_base, run_cli, start_worker
from tests.workerutil import end_offsets, free_port, parse_metrics, read_audit, worker_args

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 4
CODECS = ("gzip", "snappy", "lz4", "zstd")
# The transactions come last: every partition's log ends with a transaction marker (the last
# transaction is aborted), which a commit must move past for a lag of 0.
PHASES = (
    *(f"records=400,codec={codec}" for codec in CODECS),
    "records=210,codec=lz4,keys=1,headers=1,tombstone_every=7,ts_offset_ms=3600000",
    "records=1200,codec=zstd,txn=100,abort_every=3",
)
FUTURE_RECORDS = 180  # the last phase's records that are not tombstones


@dataclass(frozen=True)
class JavaTopic:
    name: str
    committed: set[tuple[int, int]]
    aborted: set[tuple[int, int]]
    tombstones: set[tuple[int, int]]
    ends: dict[int, int]


@pytest.fixture(scope="module")
def java_producer() -> JavaProducer:
    return JavaProducer()


@pytest.fixture(scope="module")
def java_topic(
    kafka_bootstrap: str, java_producer: JavaProducer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JavaTopic]:
    from kafka.admin import KafkaAdminClient

    name = f"java-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="interop")
    admin.create_topics(
        {name: {"num_partitions": PARTITIONS, "replication_factor": 1}}, wait_for_metadata=True
    )
    manifest = tmp_path_factory.mktemp("java") / "manifest.csv"
    java_producer.run(kafka_bootstrap, name, manifest, *PHASES)
    kinds = by_kind(read_manifest(manifest))
    yield JavaTopic(
        name,
        kinds.get("committed", set()),
        kinds.get("aborted", set()),
        kinds.get("tombstone", set()),
        end_offsets(kafka_bootstrap, name),
    )
    try:
        admin.delete_topics([name])
    finally:
        admin.close()


def test_the_java_topic_holds_every_codec_and_aborted_transactions(java_topic: JavaTopic) -> None:
    assert len(java_topic.committed) == 4 * 400 + 800 + FUTURE_RECORDS
    assert len(java_topic.aborted) == 400
    assert len(java_topic.tombstones) == 30
    # Markers occupy offsets: every log ends with one, past the partition's last record.
    records = java_topic.committed | java_topic.aborted | java_topic.tombstones
    for p, end in java_topic.ends.items():
        assert end > max(o for q, o in records if q == p) + 1
    data = broker_data_dir()
    if data is None:
        pytest.skip("KAFKA_BOOTSTRAP names a broker whose log segments this test cannot read")
    codecs = log_codecs(data, java_topic.name)
    for codec in CODECS:
        assert codecs[codec] > 0, codecs
    assert codecs["control"] >= 12 * PARTITIONS // 2, codecs  # commit and abort markers


def _run_to_idle(
    bootstrap: str,
    topic: JavaTopic,
    tmp_path: Path,
    group: str,
    extra: list[str],
    on_caught_up: Callable[[str], None] | None = None,
) -> Path:
    """A worker reads the topic until its commits reach every log end (its pass ends after 3 s
    without records, and commits); ``on_caught_up(metrics_base_url)`` runs then, and SIGTERM
    stops the worker."""
    audit = tmp_path / "audit.csv"
    args = worker_args(
        bootstrap,
        topic.name,
        group,
        audit,
        shards=2,
        stop_after_idle=None,
        extra=["--idle-timeout", "3", "--metrics-port", str(free_port()), *extra],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        base = metrics_base(worker)

        def committed() -> dict[int, float]:
            status, body = http_get(f"{base}/metrics")
            if status != 200:
                return {}
            samples = parse_metrics(body).get("streamer_partition_committed_offset", [])
            return {int(lb["partition"]): v for lb, v in samples}

        last: list[dict[int, float]] = [{}]

        def caught_up() -> bool:
            last[0] = committed()
            return last[0] == {p: float(e) for p, e in topic.ends.items()}

        try:
            worker.wait_for(caught_up, 120, f"commits at the log ends {topic.ends}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast committed offsets on /metrics: {last[0]}") from None
        if on_caught_up is not None:
            on_caught_up(base)
        worker.terminate()
        assert worker.wait(60) == 0, worker.tail()
    finally:
        worker.kill()  # a no-op once it exited; never a worker left behind by a failure
    return audit


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_read_committed_trains_every_committed_record_once_and_commits_the_log_end(
    kafka_bootstrap: str, java_topic: JavaTopic, tmp_path: Path, group_id: str, client: str
) -> None:
    dead = f"dlq-{uuid.uuid4().hex[:8]}"  # does not exist: the worker creates it
    seen: dict[str, object] = {}

    def at_idle(base: str) -> None:
        metrics = parse_metrics(http_get(f"{base}/metrics")[1])
        seen["lag"] = {lb["partition"]: v for lb, v in metrics["streamer_consumer_lag_records"]}
        seen["skewed"] = metrics["streamer_records_clock_skewed_total"][0][1]
        seen["freshness"] = [
            v for _, v in metrics["streamer_partition_last_trained_timestamp_seconds"]
        ]
        seen["now"] = time.time()

    audit = _run_to_idle(
        kafka_bootstrap,
        java_topic,
        tmp_path,
        group_id,
        ["--dead-letter-topic", dead, "--kafka-client", client],
        on_caught_up=at_idle,
    )
    trained = read_audit(audit, java_topic.name)
    assert not set(trained) & java_topic.aborted, "an aborted transaction's record was trained"
    assert set(trained) == java_topic.committed
    assert max(trained.values()) == 1, "a record was trained twice in a clean run"

    # Lag 0 everywhere: our /metrics, `streamer lag`, and Kafka's own consumer-groups tool.
    assert set(seen["lag"].values()) == {0.0}, seen["lag"]  # type: ignore[attr-defined]
    lag = run_cli(
        [
            "lag",
            "--bootstrap",
            kafka_bootstrap,
            "--group",
            group_id,
            "--topic",
            java_topic.name,
            "--json",
        ]
    )
    assert lag.returncode == 0, lag.stderr
    rows = json.loads(lag.stdout)["partitions"]
    assert {r["partition"]: r["committed"] for r in rows} == java_topic.ends
    assert {r["lag"] for r in rows} == {0}
    described = describe_group(kafka_bootstrap, group_id)
    assert {r.partition: r.current_offset for r in described} == java_topic.ends
    assert {r.lag for r in described} == {0}, described

    # Future record timestamps: counted, never fresher than now.
    assert seen["skewed"] == FUTURE_RECORDS
    assert max(seen["freshness"]) <= seen["now"]  # type: ignore[call-overload]

    # Tombstones went to the dead-letter topic the worker created like the source topic.
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(dead)
        assert parts is not None and len(parts) == PARTITIONS
        tps = [TopicPartition(dead, p) for p in parts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        letters: list[tuple[int, int, str]] = []
        deadline = time.monotonic() + 30
        while len(letters) < len(java_topic.tombstones) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    h = {k: v.decode() for k, v in r.headers}
                    letters.append(
                        (
                            int(h["streamer.input.source.partition"]),
                            int(h["streamer.input.source.offset"]),
                            h["streamer.reason"],
                        )
                    )
    finally:
        consumer.close(autocommit=False)
    assert {(p, o) for p, o, _ in letters} == java_topic.tombstones
    assert {reason for _, _, reason in letters} == {"truncated"}


def test_read_uncommitted_trains_aborted_records_too(
    kafka_bootstrap: str, java_topic: JavaTopic, tmp_path: Path, group_id: str
) -> None:
    audit = _run_to_idle(
        kafka_bootstrap,
        java_topic,
        tmp_path,
        group_id,
        ["--isolation-level", "read_uncommitted"],
    )
    trained = read_audit(audit, java_topic.name)
    assert set(trained) == java_topic.committed | java_topic.aborted
    assert {r.lag for r in describe_group(kafka_bootstrap, group_id)} == {0}


def test_log_append_time_topics_give_the_brokers_time(
    kafka_bootstrap: str,
    java_producer: JavaProducer,
    make_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    from consumers.settings import ConsumerSettings
    from streamer.input.simulator import SimulatorTask
    from streamer.input.source import PipelineSettings, StreamSource

    topic = make_topic(2, config={"message.timestamp.type": "LogAppendTime"})
    t0 = time.time()
    java_producer.run(
        kafka_bootstrap, topic, tmp_path / "m.csv", "records=300,codec=zstd,ts_offset_ms=3600000"
    )
    t1 = time.time()
    settings = ConsumerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        mode="static",
        partitions=(0, 1),
        num_shards=1,
        shard_runtime="thread",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
    )
    source = StreamSource(
        SimulatorTask().schema(),
        PipelineSettings(num_shards=1, batch_size=100, idle_timeout_seconds=2.0),
        consumer=settings,
    )
    stamps: list[int] = []
    try:
        for batch in source.dataset():
            stamps.extend(batch["timestamp"].numpy().tolist())
    finally:
        source.close()
    assert len(stamps) == 300
    # The producer stamped an hour ahead; the broker's append time is what arrives.
    assert t0 - 1 <= min(stamps) / 1000 <= max(stamps) / 1000 <= t1 + 1
