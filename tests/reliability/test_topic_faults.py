"""Topic faults (issue 6): the topic deleted mid-stream, then created again; retention deleting
records while the worker is down (offset out of range).

Real broker (the shared one: these tests only delete topics they created), real worker
processes, the audit log as the record of what was trained.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamer.input.simulator import produce
from tests.reliability.relutil import error_lines, http_get, metrics_base, start_worker
from tests.workerutil import (
    audit_lines,
    end_offsets,
    free_port,
    parse_metrics,
    summarize,
    worker_args,
)

pytestmark = pytest.mark.kafka

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ (WARNING|ERROR) (\S+): (.*)$")


def _noisy_seconds(text: str, limit: int) -> list[tuple[str, str, int]]:
    """(second, message, count) of every WARNING/ERROR message of ``text`` (a log) repeated
    more than ``limit`` times within one second.

    Numbers in a message are masked so that a loop over changing offsets still counts as one
    message."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        m = _STAMP.match(line)
        if m:
            counts[m.group(1), m.group(3) + ": " + re.sub(r"\d+", "N", m.group(4))] += 1
    return [(sec, msg, n) for (sec, msg), n in sorted(counts.items()) if n > limit]


def _kafka_errors(base: str, kind: str) -> float:
    status, body = http_get(base + "/metrics")
    assert status == 200, body
    samples = parse_metrics(body).get("streamer_kafka_errors_total", [])
    return sum(v for labels, v in samples if labels.get("type") == kind)


# ---- topic deleted mid-stream -------------------------------------------------------------


@pytest.mark.timeout(420)
def test_topic_deleted_mid_stream_not_ready_quiet_log_then_trains_the_new_topic(
    kafka_bootstrap: str, kafka_admin: Any, tmp_path: Path
) -> None:
    """Delete the topic under a live worker: /readyz turns 503 naming the topic, /healthz stays
    200, the log says once per shard what happened (no error line repeated more than 3 times
    in any second, kafka-python's included), the worker stays up; once the topic is created
    again, its records are trained.

    Semantics: a recreated topic is a new topic (its offsets start at 0 again and the group's
    commits of the old one were deleted with it), so every record of the new topic is
    trained; records of the old topic that were polled but not trained are gone with it.
    """
    topic = f"deleted-{uuid.uuid4().hex[:10]}"
    produce(kafka_bootstrap, topic, 1500, partitions=2)
    audit = tmp_path / "audit.csv"
    port = free_port()
    args = worker_args(
        kafka_bootstrap,
        topic,
        f"g-{uuid.uuid4().hex[:8]}",
        audit,
        shards=2,
        batch_size=64,
        stop_after_idle=None,  # the test stops it
        extra=["--metrics-port", str(port), "--idle-timeout", "3"],
    )
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        base = metrics_base(worker)
        worker.wait_for(lambda: audit_lines(audit) >= 1500, 180, "the first 1500 records")
        worker.wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, "ready")
        time.sleep(1.0)
        log_from = len(worker.log())  # everything logged from here on is checked for loops
        audit_from = audit_lines(audit)  # lines from here on are records of the new topic
        kafka_admin.delete_topics([topic])
        deleted_at = time.monotonic()

        def not_ready() -> bool:
            status, body = http_get(base + "/readyz")
            return status == 503 and topic in body and "does not exist" in body

        worker.wait_for(not_ready, 60, "/readyz 503 naming the deleted topic")
        not_ready_after = time.monotonic() - deleted_at
        # Stay deleted a while: alive, not ready, quiet.
        while time.monotonic() - deleted_at < 25:
            assert worker.alive(), worker.tail()
            status, body = http_get(base + "/readyz")
            assert status == 503 and topic in body, (status, body)
            assert http_get(base + "/healthz")[0] == 200, worker.tail()
            time.sleep(1.0)
        missing_errors = _kafka_errors(base, "topic_missing")
        assert missing_errors >= 1, "the deletion was not counted in kafka_errors_total"

        produce(kafka_bootstrap, topic, 700, partitions=2)  # created again, offsets from 0
        worker.wait_for(
            lambda: audit_lines(audit) >= audit_from + 700 and http_get(base + "/readyz")[0] == 200,
            180,
            "the records of the recreated topic trained and /readyz 200",
        )
        worker.terminate()
        code = worker.wait(90)
        ends = end_offsets(kafka_bootstrap, topic)
    finally:
        worker.kill()
        try:
            kafka_admin.delete_topics([topic])
        except Exception as exc:  # already gone after a failure in between
            print(f"topic clean-up: {exc}")
    log = worker.log()
    assert code == 0, worker.tail()
    assert not_ready_after < 45, not_ready_after
    # The log names the topic and the problem, once per shard rather than in a loop.
    # (A shard that sees it mid-poll says "was deleted"; one that opens while the topic is
    # gone says "does not exist"; all shards together at most once per 30 s.)
    said = [
        ln
        for ln in log[log_from:].splitlines()
        if " WARNING consumers.shard: " in ln
        and (f"topic {topic!r} was deleted" in ln or f"topic {topic!r} does not exist" in ln)
    ]
    assert 1 <= len(said) <= 4, said
    assert f"topic {topic!r} exists again" in log
    noisy = _noisy_seconds(log[log_from:], limit=3)
    assert not noisy, f"error lines in a loop: {noisy[:5]}"
    ours = error_lines(log[log_from:])
    assert not ours, ours  # a deleted topic is a WARNING (waiting for it), never our ERROR
    # Every record of the recreated topic was trained: its offsets start at 0 again.
    assert sum(ends.values()) == 700, ends
    lines = audit.read_text(encoding="ascii").splitlines()[audit_from:]
    trained_new = Counter((int(p), int(o)) for _, p, o in (ln.rsplit(",", 2) for ln in lines))
    expected_new = {(p, o) for p, end in ends.items() for o in range(end)}
    missing = sorted(expected_new - trained_new.keys())
    assert not missing, f"records of the recreated topic never trained: {summarize(missing)}"
    extra = sorted(trained_new.keys() - expected_new)
    assert not extra, f"trained after the deletion but not in the new topic: {summarize(extra)}"


# ---- offset out of range: retention deleted records while the worker was down -------------


@pytest.mark.timeout(420)
def test_records_deleted_while_the_worker_was_down_reset_policy_counted_and_logged(
    kafka_bootstrap: str, kafka_admin: Any, tmp_path: Path
) -> None:
    """A worker trains a topic and stops; more records arrive and retention deletes most of
    them (KafkaAdminClient.delete_records) past the group's committed offsets. The next
    worker applies --auto-offset-reset earliest: it trains exactly what is left, counts
    kafka_errors_total{type="offset_out_of_range"} once per partition and logs an ERROR per
    partition naming the committed offset that is gone (upstream data loss)."""
    from kafka import TopicPartition

    topic = f"retention-{uuid.uuid4().hex[:10]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka_bootstrap, topic, 600, partitions=2)
    first = start_worker(
        worker_args(
            kafka_bootstrap,
            topic,
            group,
            tmp_path / "audit-1.csv",
            shards=2,
            batch_size=50,
            stop_after_idle=5,
            extra=["--idle-timeout", "3"],
        ),
        tmp_path / "worker-1.log",
    )
    try:
        assert first.wait(240) == 0, first.tail()
    finally:
        first.kill()
    committed = _committed(kafka_bootstrap, group, topic)
    assert committed == end_offsets(kafka_bootstrap, topic), committed
    produce(kafka_bootstrap, topic, 1000, partitions=2, seed=1)
    ends = end_offsets(kafka_bootstrap, topic)
    low = {p: end - 100 for p, end in ends.items()}  # keep the last 100 of each partition
    assert all(low[p] > committed[p] for p in ends), (low, committed)
    kafka_admin.delete_records({TopicPartition(topic, p): o for p, o in low.items()})

    audit = tmp_path / "audit-2.csv"
    second = start_worker(
        worker_args(
            kafka_bootstrap,
            topic,
            group,
            audit,
            shards=2,
            batch_size=50,
            stop_after_idle=None,
            extra=[
                "--idle-timeout",
                "3",
                "--metrics-port",
                str(free_port()),
                "--auto-offset-reset",
                "earliest",
            ],
        ),
        tmp_path / "worker-2.log",
    )
    try:
        base = metrics_base(second)
        second.wait_for(lambda: audit_lines(audit) >= 200, 240, "the 200 records left")
        second.wait_for(lambda: _kafka_errors(base, "offset_out_of_range") >= 2, 60, "the count")
        time.sleep(2)  # nothing more arrives
        out_of_range = _kafka_errors(base, "offset_out_of_range")
        second.terminate()
        code = second.wait(90)
    finally:
        second.kill()
        kafka_admin.delete_topics([topic])
    assert code == 0, second.tail()
    assert out_of_range == 2, out_of_range
    trained = Counter(
        (int(p), int(o))
        for _, p, o in (ln.rsplit(",", 2) for ln in audit.read_text("ascii").splitlines())
    )
    expected = {(p, o) for p in ends for o in range(low[p], ends[p])}
    assert set(trained) == expected, sorted(set(trained) ^ expected)[:10]
    loud = [ln for ln in error_lines(second.log()) if "out of range" in ln]
    for p, off in committed.items():
        assert any(f"offset {off} of {topic} partition {p} is out of range" in ln for ln in loud), (
            p,
            off,
            loud,
        )
    assert "auto_offset_reset=earliest" in loud[0]


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from tests.workerutil import committed_offsets

    out = committed_offsets(bootstrap, group, topic)
    assert all(v is not None for v in out.values()), out
    return {p: int(v) for p, v in out.items() if v is not None}


# ---- a checkpoint of a topic that was deleted and created again ---------------------------


@pytest.mark.timeout(420)
def test_checkpoint_offsets_of_a_deleted_topic_are_not_applied_to_its_successor(
    kafka_bootstrap: str, kafka_admin: Any, tmp_path: Path
) -> None:
    """A worker checkpoints a topic to its end and stops; the topic is deleted and created
    again, longer. The next worker restores the model but not the offsets (the checkpoint
    records the topic's id): every record of the new topic is trained, none skipped."""
    topic = f"reborn-{uuid.uuid4().hex[:10]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"
    produce(kafka_bootstrap, topic, 600, partitions=2)

    def run(name: str) -> tuple[Path, str]:
        audit = tmp_path / f"audit-{name}.csv"
        worker = start_worker(
            worker_args(
                kafka_bootstrap,
                topic,
                group,
                audit,
                shards=2,
                batch_size=50,
                stop_after_idle=5,
                checkpoint_dir=ckpt,
                extra=["--idle-timeout", "3"],
            ),
            tmp_path / f"worker-{name}.log",
        )
        try:
            assert worker.wait(240) == 0, worker.tail()
        finally:
            worker.kill()
        return audit, worker.log()

    try:
        first_audit, _ = run("1")
        assert audit_lines(first_audit) >= 600
        kafka_admin.delete_topics([topic])
        deadline = time.monotonic() + 60
        while topic in kafka_admin.list_topics():
            assert time.monotonic() < deadline, "the topic was not deleted"
            time.sleep(0.5)
        produce(kafka_bootstrap, topic, 900, partitions=2, seed=1)
        ends = end_offsets(kafka_bootstrap, topic)
        second_audit, log = run("2")
    finally:
        try:
            kafka_admin.delete_topics([topic])
        except Exception as exc:  # already gone after a failure in between
            print(f"topic clean-up: {exc}")
    assert sum(ends.values()) == 900 and all(e > 300 for e in ends.values()), ends
    assert "checkpoint offsets are for an earlier topic" in log, log[-3000:]
    trained = {
        (int(p), int(o))
        for _, p, o in (ln.rsplit(",", 2) for ln in second_audit.read_text("ascii").splitlines())
    }
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    missing = sorted(expected - trained)
    assert not missing, f"records of the new topic never trained: {summarize(missing)}"
