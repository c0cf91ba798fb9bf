"""Bad input (issue 6): a corpus of malformed records produced into a live topic between good
ones, read by a real worker process with a dead-letter topic.

The schema is the simulator's (``x``, ``y``) plus optional features of the other kinds (issue
17: a ragged id list with a cap, a string, padded float pairs), trained by the example
recommender model: the simulator's records (without them) are good, and so are records with
them; the corpus has bad values of every kind (a list over its cap, a string that is not
UTF-8, a ragged inner shape mismatch, a wrong element type).

The worker never stops; every good record is trained (audit log); every bad one is counted by
reason (/metrics) and dead-lettered with headers naming its source topic, partition, offset
and reason; the log names partition and offset and never prints a payload (every bad payload
that can carry one holds ``MARKER``, which must never reach the log). Keys and headers of odd
kinds (none, binary, huge; empty, binary, duplicate, non-ASCII headers) ride on good and bad
records alike and change nothing.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer

from streamer.decode.records import REASONS
from streamer.input.deadletter import HEADER_OFFSET, HEADER_PARTITION, HEADER_REASON, HEADER_TOPIC
from streamer.input.simulator import SimulatorTask
from tests.reliability.relutil import error_lines, http_get, metrics_base, start_worker
from tests.workerutil import audit_lines, free_port, parse_metrics, read_audit, worker_args

pytestmark = pytest.mark.kafka

TASK = SimulatorTask()  # its records: x float32 (16,), y float32 (the label)
SCHEMA_TOML = """
label = "y"
[features.x]
dtype = "float32"
shape = [16]
[features.y]
dtype = "float32"
[features.items]
dtype = "int64"
shape = [-1]
max_len = 8
default = []
[features.tag]
dtype = "string"
default = ""
[features.pairs]
dtype = "float32"
shape = [-1, 2]
max_len = 6
pad_to = 3
default = []
"""
MARKER = b"PAYLOAD-LEAK-7c1e"
_M = MARKER.decode()
_X = b"\x00" * 64


def _p(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _nest(depth: int) -> list[Any]:
    out: list[Any] = [_M]
    for _ in range(depth):
        out = [out]
    return out


def _good_sample() -> bytes:
    return TASK.records(1, np.random.default_rng(12345))[0]


_GOOD = _good_sample()


def _rich(i: int) -> bytes:
    """A good record with the optional features, and a field the schema does not know."""
    record = {"x": _X, "y": float(i % 3), "items": list(range(i % 9)), "tag": f"t{i}"}
    record["pairs"] = [[1.0, float(i)]] * (i % 5)
    record["added_later"] = i
    return _p(record)


_XY = b"\xa1x\xc4\x40" + _X + b"\xa1y\xca\x3f\x80\x00\x00"  # x and y, packed

#: name -> (value, reason). ``None`` is a tombstone (null value).
CORPUS: dict[str, tuple[bytes | None, str]] = {
    "random bytes": (b"\xc1" + MARKER + bytes(range(256)), "format"),
    "truncated": (_p({"x": _X, "y": 1.0, "note": _M * 3})[:-5], "truncated"),
    "truncated to its header": (_GOOD[:1], "truncated"),
    "trailing data": (_GOOD + MARKER, "extra_data"),
    "two records in one": (_GOOD + _GOOD, "extra_data"),
    "str for a float": (_p({"x": _X, "y": _M}), "schema"),
    "bool for a float": (_p({"x": _X, "y": False, "note": _M}), "dtype"),
    "bools for floats": (_p({"x": [True] * 16, "y": 1.0, "note": _M}), "dtype"),
    "short bin": (_p({"x": b"\x00" * 60, "y": 1.0, "note": _M}), "shape"),
    "short list": (_p({"x": [1.0] * 15, "y": 1.0, "note": _M}), "shape"),
    "matrix for a vector": (_p({"x": [[1.0] * 4] * 4, "y": 1.0, "note": _M}), "shape"),
    # A declared length past the end of the record: msgpack reports the missing bytes first.
    "huge bin length": (b"\x82\xa1x\xc6\xff\xff\xff\xff" + MARKER, "truncated"),
    "huge str length": (b"\x81\xa4note\xdb\x7f\xff\xff\xff" + MARKER, "truncated"),
    "huge array length": (b"\x81\xa1x\xdd\xff\xff\xff\xff" + MARKER, "too_large"),
    "huge map length": (b"\xdf\xff\xff\xff\xff" + MARKER, "too_large"),
    "record too large": (_p({"x": _X, "y": 1.0, "blob": _M * 5000}), "too_large"),
    "deep nesting": (_p({"x": _X, "y": 1.0, "d": _nest(20)}), "too_deep"),
    "deeper than msgpack's stack": (
        b"\x83\xa1x\xc4\x40" + _X + b"\xa1y\xca\x3f\x80\x00\x00\xa1d" + b"\x91" * 3000 + _p(_M),
        "too_deep",
    ),
    "unknown ext type": (_p({"x": _X, "y": 1.0, "e": msgpack.ExtType(42, MARKER)}), "format"),
    "ext type as a feature": (_p({"x": msgpack.ExtType(7, MARKER), "y": 1.0}), "format"),
    "not a map": (_p([_M, 1, 2]), "format"),
    "nil key": (b"\x82\xc0\x02" + _p(_M) + _p(1), "format"),
    "int key": (b"\x82\x01\x02" + _p(_M) + _p(1), "format"),
    "invalid utf-8": (b"\x82\xa1x\xc4\x40" + _X + b"\xa1y\xa3\xff\xfe\xfd", "format"),
    "empty value": (b"", "truncated"),
    "null value (tombstone)": (None, "truncated"),
    "missing feature": (_p({"y": 1.0, "note": _M}), "schema"),
    "null feature": (_p({"x": None, "y": 1.0, "note": _M}), "schema"),
    "empty map": (_p({}), "schema"),
    # The other feature kinds (issue 17).
    "ids over their cap": (_p({"x": _X, "y": 1.0, "items": list(range(9)), "n": _M}), "shape"),
    "ids as bin over their cap": (_p({"x": _X, "y": 1.0, "items": b"\x00" * 72, "n": _M}), "shape"),
    "string that is not UTF-8": (b"\x83" + _XY + b"\xa3tag\xa3\xff\xfe\xfd", "format"),
    # A key twice: msgpack would keep the last value silently (issue 21).
    "a key twice": (b"\x83" + _XY + b"\xa1y\xca\x40\x00\x00\x00", "format"),
    "ragged inner shape mismatch": (
        _p({"x": _X, "y": 1.0, "pairs": [[1.0, 2.0], [3.0]], "n": _M}),
        "shape",
    ),
    "float among the ids": (_p({"x": _X, "y": 1.0, "items": [1, 2.5], "n": _M}), "dtype"),
    "str among the ids": (_p({"x": _X, "y": 1.0, "items": [1, _M]}), "schema"),
    "number for a string": (_p({"x": _X, "y": 1.0, "tag": 5, "n": _M}), "dtype"),
    "list for a string": (_p({"x": _X, "y": 1.0, "tag": [_M]}), "shape"),
}

#: Keys of odd kinds, used in turn on good and bad records.
KEYS: list[bytes | None] = [None, b"", b"\x00\xff\xfe binary \x80", MARKER * 12_000]  # 200 KB
#: Header lists of odd kinds, used in turn.
#: (kafka-python sends no null header value: its producer takes (str, bytes) pairs only.)
HEADERS: list[list[tuple[str, bytes]]] = [
    [],
    [("", b"")],
    [("bin", b"\x00\xff" * 100), ("dup", b"1"), ("dup", b"2")],
    [("empty", b""), ("k\u00e9y \u2603", "v\u00e4lue".encode())],
    [(f"h{i}", MARKER) for i in range(50)],
]

_REJECT_LINE = re.compile(r"rejected record (\S+)/(\d+)@(\d+): (\w+)")


Where = tuple[int, int]  # (partition, offset)


Original = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]  # key, value, headers


def _produce_corpus(
    bootstrap: str, topic: str
) -> tuple[set[Where], dict[Where, str], dict[Where, Original]]:
    """Good records with the corpus spread between them over 2 partitions (a bad record first
    and last in each); returns the good (partition, offset)s, the bad ones' reasons and the
    bad records as written (key, value: None for a tombstone, headers)."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=1_000_000
    )
    rng = np.random.default_rng(7)
    good: set[Where] = set()
    bad: dict[Where, str] = {}
    values: dict[Where, Original] = {}
    bad_items = list(CORPUS.values())
    n = 0
    try:
        for p in (0, 1):
            plan: list[tuple[bytes | None, str | None]] = []
            for i, (bad_value, bad_reason) in enumerate(bad_items):
                plan.append((bad_value, bad_reason))
                plan.extend((v, None) for v in TASK.records(8 + (i + p) % 5, rng))
                plan.append((_rich(i + p), None))
            plan.append(bad_items[p])  # and a bad record last
            for value, reason in plan:
                key = KEYS[n % len(KEYS)]
                if value is None and key is None:  # Kafka needs a key or a value
                    key = b"tombstone"
                headers = HEADERS[n % len(HEADERS)]
                n += 1
                meta = producer.send(topic, value=value, key=key, headers=headers, partition=p).get(
                    timeout=60
                )
                where = (p, int(meta.offset))
                if reason is None:
                    good.add(where)
                else:
                    bad[where] = reason
                    values[where] = (key, value, headers)
        producer.flush(60)
    finally:
        producer.close(timeout=30)
    return good, bad, values


def _create(admin: Any, topic: str, partitions: int) -> None:
    from kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, partitions, 1)])


def _decode_errors(base: str, topic: str) -> dict[str, float]:
    status, body = http_get(base + "/metrics")
    assert status == 200, body
    out: dict[str, float] = {}
    for labels, value in parse_metrics(body).get("streamer_decode_errors_total", []):
        if labels.get("topic") == topic and value:
            out[labels["reason"]] = value
    return out


def _metric(base: str, name: str) -> float:
    status, body = http_get(base + "/metrics")
    assert status == 200, body
    return sum(v for _, v in parse_metrics(body).get(name, []))


def _read_dead_letters(bootstrap: str, dlq: str, expected: int) -> list[Any]:
    consumer = KafkaConsumer(
        dlq,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
        max_partition_fetch_bytes=4_000_000,
    )
    out: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while len(out) < expected and time.monotonic() < deadline:
            out.extend(consumer)
    finally:
        consumer.close(autocommit=False)
    return out


@pytest.mark.timeout(420)
def test_malformed_corpus_between_good_records_is_dead_lettered_and_counted(
    kafka_bootstrap: str, kafka_admin: Any, tmp_path: Path
) -> None:
    topic = f"bad-input-{uuid.uuid4().hex[:10]}"
    dlq = f"{topic}-dlq"
    _create(kafka_admin, topic, 2)
    _create(kafka_admin, dlq, 1)
    audit = tmp_path / "audit.csv"
    schema_file = tmp_path / "schema.toml"
    schema_file.write_text(SCHEMA_TOML)
    try:
        good, bad, values = _produce_corpus(kafka_bootstrap, topic)
        assert len(bad) == 2 * len(CORPUS) + 2 and len(good) >= 400
        args = worker_args(
            kafka_bootstrap,
            topic,
            f"g-{uuid.uuid4().hex[:8]}",
            audit,
            shards=2,
            batch_size=32,
            stop_after_idle=None,  # the test stops it
            extra=[
                "--metrics-port",
                str(free_port()),
                "--idle-timeout",
                "3",
                "--dead-letter-topic",
                dlq,
                *("--schema", str(schema_file), "--model", "examples.recommender:build"),
            ],
        )
        worker = start_worker(args, tmp_path / "worker.log")
        try:
            base = metrics_base(worker)
            worker.wait_for(lambda: audit_lines(audit) >= len(good), 240, "every good record")
            worker.wait_for(
                lambda: (
                    sum(_decode_errors(base, topic).values()) >= len(bad)
                    and _metric(base, "streamer_records_dead_lettered_total") >= len(bad)
                ),
                120,
                "every bad record counted and dead-lettered",
            )
            by_reason = _decode_errors(base, topic)
            dead_lettered = _metric(base, "streamer_records_dead_lettered_total")
            assert worker.alive(), worker.tail()
            worker.terminate()
            code = worker.wait(90)
        finally:
            worker.kill()
        dead = _read_dead_letters(kafka_bootstrap, dlq, len(bad))
    finally:
        kafka_admin.delete_topics([topic, dlq])

    log = worker.log()
    assert code == 0, worker.tail()
    # Every good record trained, once; no bad one trained.
    counts = read_audit(audit, topic)
    missing = sorted(good - counts.keys())
    assert not missing, f"good records never trained: {missing[:10]}\n{worker.tail()}"
    trained_bad = sorted(counts.keys() & bad.keys())
    assert not trained_bad, f"bad records were trained: {trained_bad[:10]}"
    assert set(counts) == good

    # Counted by reason.
    want = Counter(bad.values())
    assert by_reason == {r: float(n) for r, n in want.items()}, (by_reason, want)
    assert set(want) == set(REASONS), "the corpus should exercise every reason"
    assert dead_lettered == len(bad)

    # Dead-lettered: each bad record once, as it was written (key, value, a tombstone's null,
    # the producer's headers, odd ones included), with ours after them naming where it came
    # from.
    seen: dict[Where, str] = {}
    for rec in dead:
        h = {k: (v or b"").decode() for k, v in rec.headers if k.startswith("streamer.")}
        assert h[HEADER_TOPIC] == topic, h
        where = (int(h[HEADER_PARTITION]), int(h[HEADER_OFFSET]))
        assert where not in seen, f"dead-lettered twice: {where}"
        seen[where] = h[HEADER_REASON]
        key, value, headers = values[where]
        assert rec.value == value, f"payload of {where} changed"
        assert rec.key == key, f"key of {where} changed"
        assert list(rec.headers[: len(headers)]) == headers, f"headers of {where} changed"
    assert seen == bad, sorted(set(seen.items()) ^ set(bad.items()))[:10]

    # The log names partition and offset of rejected records, with the right reason, and
    # never prints a payload (nor a key or header: they hold the marker too).
    rejects = _REJECT_LINE.findall(log)
    assert rejects, "no 'rejected record' line"
    for t, p, o, reason in rejects:
        assert t == topic and bad.get((int(p), int(o))) == reason, (t, p, o, reason)
    assert _M not in log, "a payload (or key or header) reached the log"
    assert "PAYLOAD-LEAK" not in log
    assert not error_lines(log), error_lines(log)[:5]
