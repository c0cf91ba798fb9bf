"""The dead-letter topic against the real broker: created when missing, a refusal at start-up is
exit 2, and at run time a topic that disappears never stops training or loses a record.

While the dead-letter topic is gone, writes of rejected records fail (the broker has no such
topic and does not create topics): the failures are counted, good records keep training, and
the commit point of a partition stays below its first rejected record that is not written.
Once the topic exists again, the waiting records are written and commits reach the end.

A dead letter always advances: the dead-letter topic is created as large as the source topic
(max.message.bytes), so a large rejected record fits whole; a letter the topic refuses for good
(an older, smaller dead-letter topic) is written without its value, and one refused even so
counts as done: the source partition's commit point never freezes behind a rejected record.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType

from streamer.input.deadletter import (
    HEADER_ERROR,
    HEADER_OFFSET,
    HEADER_ORIGINAL_SIZE,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_TOPIC,
    DeadLetterWriter,
)
from streamer.input.simulator import SimulatorTask
from tests.reliability.relutil import http_get, metrics_base, run_cli, start_worker, wait_until
from tests.workerutil import (
    committed_offsets,
    end_offsets,
    free_port,
    parse_metrics,
    read_audit,
    worker_args,
)

MiB = 1024 * 1024


def _broker(test: Any) -> Any:
    """The marks of a test that runs against the real broker (the unit tests here do not)."""
    return pytest.mark.kafka(pytest.mark.slow(test))


BAD = b"\xc1"  # never valid msgpack: reason "format"


def _produce(
    bootstrap: str, topic: str, partition: int, plan: list[bool], bad: bytes = BAD
) -> list[int]:
    """Good (True) and bad (False: ``bad``) records to one partition; returns their offsets."""
    import numpy as np

    values = iter(SimulatorTask().records(len(plan), np.random.default_rng(len(plan))))
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=len(bad) + MiB
    )
    try:
        futures = [
            producer.send(topic, value=next(values) if good else bad, partition=partition)
            for good in plan
        ]
        return [int(f.get(timeout=60).offset) for f in futures]
    finally:
        producer.close(timeout=30)


def _records(bootstrap: str, topic: str, want: int) -> list[Any]:
    """The first ``want`` records of ``topic`` (kafka-python's ConsumerRecords), or fewer
    after 30 s."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=30_000,
        max_partition_fetch_bytes=64 * MiB,
        fetch_max_bytes=64 * MiB,
    )
    out: list[Any] = []
    try:
        for rec in consumer:
            out.append(rec)
            if len(out) >= want:
                break
    finally:
        consumer.close()
    return out


def _letters(bootstrap: str, topic: str, want: int) -> list[tuple[bytes, dict[str, str]]]:
    """The first ``want`` records of ``topic`` (value, headers), or fewer after 30 s."""
    return [
        (rec.value or b"", {k: v.decode() for k, v in rec.headers})
        for rec in _records(bootstrap, topic, want)
    ]


def _max_message_bytes(admin: Any, topic: str) -> int:
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, ["max.message.bytes"])
    described = admin.describe_configs([resource], config_filter="all")
    return int(described["topic"][topic]["max.message.bytes"]["value"])


def _run_to_idle_stop(
    bootstrap: str, topic: str, group: str, dead: str, tmp_path: Path
) -> tuple[int, str, Path]:
    """One worker over ``topic`` with ``dead`` as its dead-letter topic, until it stops idle:
    (exit code, log, audit log)."""
    audit = tmp_path / "audit.csv"
    args = worker_args(
        bootstrap,
        topic,
        group,
        audit,
        shards=1,
        batch_size=16,
        stop_after_idle=8,
        extra=["--dead-letter-topic", dead],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        code = worker.wait(240)
    finally:
        worker.kill()
    return code, worker.log(), audit


def _sample(base: str, name: str, **labels: str) -> float:
    status, body = http_get(f"{base}/metrics")
    assert status == 200
    return sum(
        v
        for lb, v in parse_metrics(body).get(name, [])
        if all(lb.get(k) == want for k, want in labels.items())
    )


@_broker
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
        # The queue gauges are sampled every second (the worker's watch): the commit may come
        # first (a CI run read 1 here just after it).
        worker.wait_for(
            lambda: _sample(base, "streamer_queue_depth_records", stage="dead_letter") == 0,
            10,
            "the dead-letter queue gauge back to 0",
        )
        worker.terminate()
        assert worker.wait(60) == 0
    finally:
        worker.kill()
    assert "dead-letter write to" in worker.log()


@_broker
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


# ---- a dead letter always advances ---------------------------------------------------------


@_broker
@pytest.mark.timeout(420)
def test_a_large_rejected_record_is_dead_lettered_whole_and_the_partition_moves_on(
    kafka_bootstrap: str, kafka_admin: Any, make_topic: Any, tmp_path: Path, group_id: str
) -> None:
    """The source allows 30 MiB: the dead-letter topic the worker creates does too, so a 20 MB
    rejected record is written whole; every good record around it is trained exactly once and
    the group commits the log end. (With the broker's default 1 MB, its write failed forever:
    the commit point froze below it and the good records after it were trained on every pass.)
    """
    topic = make_topic(1, config={"max.message.bytes": str(30 * MiB)})
    dead = f"dlq-{uuid.uuid4().hex[:8]}"
    big = b"\xc1" * (20 * 1000 * 1000)  # never valid msgpack
    offsets = _produce(kafka_bootstrap, topic, 0, [True] * 30 + [False] + [True] * 30, bad=big)
    bad_offset = offsets[30]
    try:
        code, log_text, audit = _run_to_idle_stop(kafka_bootstrap, topic, group_id, dead, tmp_path)
        assert code == 0, log_text[-3000:]
        assert _max_message_bytes(kafka_admin, dead) >= 30 * MiB

        letters = _letters(kafka_bootstrap, dead, 1)
        assert len(letters) == 1, "no letter in the dead-letter topic"
        value, headers = letters[0]
        assert len(value) == len(big), "the letter is not whole"
        assert headers[HEADER_TOPIC] == topic
        assert (headers[HEADER_PARTITION], headers[HEADER_OFFSET]) == ("0", str(bad_offset))
        assert headers[HEADER_REASON]
        assert HEADER_ERROR not in headers and HEADER_ORIGINAL_SIZE not in headers

        trained = read_audit(audit, topic)
        good = {(0, o) for o in offsets if o != bad_offset}
        assert set(trained) == good
        assert set(trained.values()) == {1}, "a good record was trained more than once"
        end = end_offsets(kafka_bootstrap, topic)[0]
        assert committed_offsets(kafka_bootstrap, group_id, topic)[0] == end
        assert "refused the letter" not in log_text
    finally:
        kafka_admin.delete_topics([dead])


@_broker
@pytest.mark.timeout(420)
def test_a_dead_letter_topic_too_small_for_a_record_gets_a_header_only_letter(
    kafka_bootstrap: str, kafka_admin: Any, make_topic: Any, tmp_path: Path, group_id: str
) -> None:
    """An existing dead-letter topic of max.message.bytes=1000 is left as it is and named at
    start-up with the command that raises it; a 5 KB rejected record, which it refuses, is
    written as a header-only letter with its size and the produce error, and the commits
    reach the log end."""
    topic = make_topic(1)
    dead = make_topic(1, prefix="dlq", config={"max.message.bytes": "1000"})
    bad = b"\xc1" * 5000
    offsets = _produce(kafka_bootstrap, topic, 0, [True] * 20 + [False] + [True] * 20, bad=bad)
    bad_offset = offsets[20]
    code, log_text, audit = _run_to_idle_stop(kafka_bootstrap, topic, group_id, dead, tmp_path)
    assert code == 0, log_text[-3000:]

    warning = next(
        (ln for ln in log_text.splitlines() if "WARNING" in ln and "kafka-configs.sh" in ln),
        None,
    )
    assert warning is not None, log_text[-3000:]
    assert dead in warning and topic in warning
    source_max = _max_message_bytes(kafka_admin, topic)  # the broker's default
    assert "1000 bytes" in warning and f"{source_max} bytes" in warning  # both sizes
    assert f"--entity-name {dead} --add-config max.message.bytes={source_max}" in warning
    assert sum("kafka-configs.sh" in ln for ln in log_text.splitlines()) == 1

    letters = _letters(kafka_bootstrap, dead, 1)
    assert len(letters) == 1, "no letter in the dead-letter topic"
    value, headers = letters[0]
    assert value == b""
    assert headers[HEADER_TOPIC] == topic
    assert (headers[HEADER_PARTITION], headers[HEADER_OFFSET]) == ("0", str(bad_offset))
    assert headers[HEADER_REASON]
    assert headers[HEADER_ORIGINAL_SIZE] == str(len(bad))
    assert headers[HEADER_ERROR] == "MessageSizeTooLargeError"

    trained = read_audit(audit, topic)
    assert set(trained) == {(0, o) for o in offsets if o != bad_offset}
    assert set(trained.values()) == {1}
    end = end_offsets(kafka_bootstrap, topic)[0]
    assert committed_offsets(kafka_bootstrap, group_id, topic)[0] == end
    assert bad not in log_text.encode()


@_broker
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("topic_max", "size", "lost"),
    [
        # The broker refuses it (the producer, sized to 1000 bytes + headroom, sends it).
        ("1000", 5000, False),
        # The default 1 MB topic; the producer, sized to it, refuses 2 MB before sending.
        (None, 2_000_000, False),
        # Even a header-only letter is too large for this topic: the record is given up.
        ("10", 100, True),
    ],
    ids=["refused-by-the-broker", "refused-by-the-producer", "header-only-refused-too"],
)
def test_a_letter_refused_for_good_is_done_without_retries(
    kafka_bootstrap: str,
    kafka_admin: Any,
    make_topic: Any,
    topic_max: str | None,
    size: int,
    lost: bool,
) -> None:
    """Written header-only (or given up) at once, never retried, and the writer goes on: a
    later letter that fits is written whole."""
    dead = make_topic(
        1, prefix="dlq", config={"max.message.bytes": topic_max} if topic_max else None
    )
    done: list[tuple[int, int]] = []
    errors: list[str] = []
    writer = DeadLetterWriter(
        kafka_bootstrap,
        dead,
        on_done=lambda p, o: done.append((p, o)),
        on_failure=lambda exc: errors.append(type(exc).__name__),
        max_message_bytes=_max_message_bytes(kafka_admin, dead),
    )
    try:
        writer.send(b"\xc1" * size, "source", 3, 77, "format")
        assert writer.flush(30), "the letter is still waiting: retried, not advanced"
        writer.send(b"\xc1" * 5, "source", 3, 78, "format")
        assert writer.flush(30), "the next letter is still waiting"
    finally:
        writer.close(10)
    assert done == [(3, 77), (3, 78)]
    counts = (writer.header_only, writer.lost, writer.failed)
    assert counts == ((2, 2, 0) if lost else (1, 0, 0))
    if lost:  # the second letter too: 4 refusals, nothing written
        assert errors == ["MessageSizeTooLargeError"] * 4
        return
    assert errors == ["MessageSizeTooLargeError"]
    (first, first_headers), (second, second_headers) = _letters(kafka_bootstrap, dead, 2)
    assert first == b""
    assert first_headers[HEADER_ORIGINAL_SIZE] == str(size)
    assert first_headers[HEADER_ERROR] == "MessageSizeTooLargeError"
    assert (first_headers[HEADER_TOPIC], first_headers[HEADER_PARTITION]) == ("source", "3")
    assert (first_headers[HEADER_OFFSET], first_headers[HEADER_REASON]) == ("77", "format")
    assert second == b"\xc1" * 5 and second_headers[HEADER_OFFSET] == "78"
    assert HEADER_ERROR not in second_headers


def _produce_whole(bootstrap: str, topic: str, records: list[tuple[Any, Any, Any]]) -> list[int]:
    """(key, value, headers) records to partition 0; returns their offsets."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        futures = [
            producer.send(topic, key=k, value=v, headers=h or [], partition=0)
            for k, v, h in records
        ]
        return [int(f.get(timeout=60).offset) for f in futures]
    finally:
        producer.close(timeout=30)


def _whole_letters(bootstrap: str, topic: str, want: int) -> dict[int, Any]:
    """The first ``want`` letters of ``topic`` by their source offset (whole ConsumerRecords)."""
    return {int(dict(rec.headers)[HEADER_OFFSET]): rec for rec in _records(bootstrap, topic, want)}


TRACE = [("trace-id", b"4bf92f35"), ("content-type", b"application/msgpack")]


@_broker
@pytest.mark.timeout(300)
def test_a_dead_letter_keeps_the_records_key_and_headers_and_a_tombstone_stays_one(
    kafka_bootstrap: str, kafka_admin: Any, make_topic: Any, tmp_path: Path, group_id: str
) -> None:
    """As Kafka Connect's dead-letter queue: the letter is the original record (key, value,
    headers) with our headers after the producer's; a tombstone's letter has a null value."""
    topic = make_topic(1)
    dead = f"dlq-{uuid.uuid4().hex[:8]}"
    good = iter(SimulatorTask().records(40, __import__("numpy").random.default_rng(3)))
    records: list[tuple[Any, Any, Any]] = [(b"user-%d" % i, next(good), None) for i in range(20)]
    records.append((b"user-bad", BAD, TRACE))
    records.append((b"user-gone", None, [("op", b"delete")]))  # a tombstone
    records += [(b"user-%d" % i, next(good), None) for i in range(20, 40)]
    offsets = _produce_whole(kafka_bootstrap, topic, records)
    bad, tombstone = offsets[20], offsets[21]
    try:
        code, log_text, audit = _run_to_idle_stop(kafka_bootstrap, topic, group_id, dead, tmp_path)
        assert code == 0, log_text[-3000:]
        letters = _whole_letters(kafka_bootstrap, dead, 2)
        assert set(letters) == {bad, tombstone}, letters

        letter = letters[bad]
        assert letter.key == b"user-bad"
        assert letter.value == BAD
        names = [k for k, _ in letter.headers]
        assert letter.headers[:2] == TRACE, "the producer's headers first, as they were"
        assert names[2:6] == [HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET, HEADER_REASON]
        assert dict(letter.headers)[HEADER_REASON] == b"format"
        assert "streamer.input.source.timestamp" in names

        gone = letters[tombstone]
        assert gone.key == b"user-gone"
        assert gone.value is None, "a tombstone's letter became an empty value"
        assert gone.headers[0] == ("op", b"delete")

        trained = read_audit(audit, topic)
        assert set(trained) == {(0, o) for o in offsets if o not in (bad, tombstone)}
        assert committed_offsets(kafka_bootstrap, group_id, topic)[0] == offsets[-1] + 1
    finally:
        kafka_admin.delete_topics([dead])


@_broker
@pytest.mark.timeout(120)
def test_records_known_by_coordinates_are_read_back_whole_and_a_gone_one_is_header_only(
    kafka_bootstrap: str, kafka_admin: Any, make_topic: Any
) -> None:
    """A skipped step's records (their offsets only) are read back from the source: whole
    letters; one the topic no longer holds (deleted below the log start) is written
    header-only and is done all the same."""
    from kafka import TopicPartition

    from consumers.clients.kafka_python import RecordReader
    from consumers.settings import ConsumerSettings

    source = make_topic(1)
    dead = make_topic(1, prefix="dlq")
    records = [(b"k%d" % i, b"value-%d" % i, [("n", b"%d" % i)]) for i in range(6)]
    records.append((b"k6", None, None))
    offsets = _produce_whole(kafka_bootstrap, source, records)
    kafka_admin.delete_records({TopicPartition(source, 0): offsets[2]})
    done: list[tuple[int, int]] = []
    reader = RecordReader(ConsumerSettings(bootstrap_servers=kafka_bootstrap, topic=source))
    writer = DeadLetterWriter(
        kafka_bootstrap, dead, on_done=lambda p, o: done.append((p, o)), reader=reader
    )
    import numpy as np

    try:
        wanted = [offsets[1], offsets[3], offsets[5], offsets[6]]
        writer.send_held(source, np.zeros(4, np.int32), np.array(wanted, np.int64))
        assert writer.flush(60), "letters still waiting"
    finally:
        writer.close(10)
    assert sorted(done) == [(0, o) for o in wanted]
    letters = _whole_letters(kafka_bootstrap, dead, 4)
    assert set(letters) == set(wanted)
    for i in (3, 5):
        letter = letters[offsets[i]]
        assert (letter.key, letter.value) == (b"k%d" % i, b"value-%d" % i)
        assert letter.headers[0] == ("n", b"%d" % i)
        assert dict(letter.headers)[HEADER_REASON] == b"nonfinite_step"
    assert letters[offsets[6]].value is None and letters[offsets[6]].key == b"k6"
    gone = letters[offsets[1]]
    assert gone.value in (b"", None) and gone.key is None
    assert dict(gone.headers)[HEADER_ERROR] == b"SourceRecordGone"
    assert HEADER_ORIGINAL_SIZE not in dict(gone.headers)
