"""Rejects (pure: an OffsetTracker and a recording dead-letter writer, no broker): logged at a
bounded rate and never with the payload; done at once without a dead-letter topic, handed to
the writer with one; held (neither) when the reject breaker tripped."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from streamer.input.offsets import OffsetTracker
from streamer.input.rejects import Rejects

SECRET = b"payload-that-must-never-be-logged"


class Letters:
    """What ``Rejects`` asks of a ``DeadLetterWriter``."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, str, int, int, str]] = []
        self.closed: float | None = None

    def send(self, value: bytes, topic: str, partition: int, offset: int, reason: str) -> None:
        self.sent.append((value, topic, partition, offset, reason))

    def close(self, timeout: float) -> None:
        self.closed = timeout


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _block(n: int, partition: int = 0) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    values = [SECRET + bytes([i]) for i in range(n)]
    return values, np.full(n, partition, np.int32), np.arange(n, dtype=np.int64)


def _registered(n: int) -> OffsetTracker:
    tracker = OffsetTracker()
    tracker.register(np.zeros(n, np.int32), np.arange(n, dtype=np.int64))
    return tracker


def test_without_a_dead_letter_topic_rejects_are_done_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = _registered(4)
    rejects = Rejects("t", tracker)
    values, partition, offset = _block(4)
    with caplog.at_level(logging.WARNING, logger="streamer.input.rejects"):
        rejects.handle(values, partition, offset, [(0, "shape"), (1, "format")])
    assert rejects.count == 2
    assert tracker.commit_points() == {0: 2}  # rows 2 and 3 are still in flight
    assert "rejected record t/0@0: shape" in caplog.text
    assert "rejected record t/0@1: format" in caplog.text
    assert SECRET.decode() not in caplog.text


def test_with_a_dead_letter_topic_the_writer_decides_when_they_are_done() -> None:
    tracker, letters = _registered(3), Letters()
    rejects = Rejects("t", tracker, letters)  # type: ignore[arg-type]
    values, partition, offset = _block(3)
    rejects.handle(values, partition, offset, [(1, "truncated")])
    assert letters.sent == [(values[1], "t", 0, 1, "truncated")]
    assert tracker.commit_points() == {0: 0}  # not done until the letter is acknowledged
    rejects.close()
    assert letters.closed == 5.0


def test_a_tripped_breaker_holds_them_neither_dead_lettered_nor_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker, letters = _registered(2), Letters()
    rejects = Rejects("t", tracker, letters, explain=lambda v: "shape: x expected [8]")  # type: ignore[arg-type]
    values, partition, offset = _block(2)
    with caplog.at_level(logging.WARNING, logger="streamer.input.rejects"):
        rejects.handle(values, partition, offset, [(0, "shape"), (1, "shape")], hold=True)
    assert letters.sent == [] and rejects.count == 2
    assert tracker.commit_points() == {0: 0}
    assert "shape: x expected [8]" in caplog.text and rejects.example == "shape: x expected [8]"
    no_letters = Rejects("t", tracker)
    no_letters.handle(values, partition, offset, [(0, "shape")], hold=True)
    assert tracker.commit_points() == {0: 0}


def test_log_lines_are_rate_limited_but_every_reject_is_counted_and_handled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, tracker = Clock(), _registered(100)
    explained: list[Any] = []

    def explain(value: bytes | None) -> str:
        explained.append(value)
        return "x"

    rejects = Rejects("t", tracker, log_per_second=5.0, clock=clock, explain=explain)
    values, partition, offset = _block(100)
    with caplog.at_level(logging.WARNING, logger="streamer.input.rejects"):
        rejects.handle(values, partition, offset, [(i, "format") for i in range(50)])
        assert len(caplog.records) == 5  # the bucket holds 5
        clock.now += 1.0  # refills at 5 per second
        rejects.handle(values, partition, offset, [(i, "format") for i in range(50, 100)])
    assert len(caplog.records) == 10
    assert len(explained) == 10  # only logged records are decoded again to explain them
    assert rejects.count == 100 and tracker.commit_points() == {0: 100}


class _Sent:
    """A producer's future that is acknowledged at once."""

    def add_callback(self, fn: Any) -> _Sent:
        fn(None)
        return self

    def add_errback(self, fn: Any) -> _Sent:
        return self


class _Producer:
    def __init__(self, **_settings: Any) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, topic: str, **record: Any) -> _Sent:
        self.sent.append(record)
        return _Sent()

    def close(self, timeout: float = 0) -> None:
        pass


class _Reader:
    """Reads back records of partition 0 (offset -> Original); fails its first ``fail`` reads."""

    def __init__(self, fail: int) -> None:
        from consumers.block import Original

        self.fail = fail
        self.reads: list[list[int]] = []
        self.closed = False
        self.records = {o: Original(b"k%d" % o, b"v%d" % o, [("h", b"1")], 5) for o in range(10)}

    def read(self, partition: int, offsets: list[int]) -> dict[int, Any]:
        self.reads.append(list(offsets))
        if len(self.reads) <= self.fail:
            raise RuntimeError("no broker")
        return {o: self.records[o] for o in offsets if o in self.records}

    def close(self) -> None:
        self.closed = True


def test_a_failed_read_back_retries_the_whole_batch_once_and_the_writer_closes_its_reader() -> None:
    """A skipped step's records known by coordinates: one read for the batch; when it fails
    (the broker is down) the whole batch waits for one retry (not a timed-out read per
    letter), then each letter is the original record (key, value, headers, then ours)."""
    import numpy as np

    from streamer.input.deadletter import DeadLetterWriter

    producers: list[_Producer] = []

    def factory(**settings: Any) -> _Producer:
        producers.append(_Producer(**settings))
        return producers[-1]

    done: list[tuple[int, int]] = []
    reader = _Reader(fail=1)
    writer = DeadLetterWriter(
        "127.0.0.1:1",
        "dlq",
        on_done=lambda p, o: done.append((p, o)),
        producer_factory=factory,
        reader=reader,
    )
    try:
        writer.send_held("src", np.zeros(3, np.int32), np.array([2, 3, 4], np.int64))
        assert writer.flush(10), "letters still waiting"
    finally:
        writer.close(5)
    assert reader.reads == [[2, 3, 4], [2, 3, 4]]  # one failed read of the batch, one retry
    assert sorted(done) == [(0, 2), (0, 3), (0, 4)]
    sent = producers[-1].sent
    assert [(r["key"], r["value"]) for r in sent] == [
        (b"k2", b"v2"),
        (b"k3", b"v3"),
        (b"k4", b"v4"),
    ]
    assert all(r["headers"][0] == ("h", b"1") for r in sent)
    assert reader.closed and writer.failed == 1 and len(producers) == 1  # no new producer
