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
