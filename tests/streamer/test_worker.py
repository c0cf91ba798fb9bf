"""A worker stopping on --stop-after-idle while the group still has records on partitions it
does not own (a static member that stopped keeps its partitions until its session expires):
it waits that long once, then stops and says so in its stop line. Pure logic: the group's
lag is given, no Kafka."""

from __future__ import annotations

import io

import pytest

from streamer.config import load_config
from streamer.stopping import StopReason
from streamer.worker import Worker


def _worker(lags: list[dict[int, int]]) -> Worker:
    cfg = load_config(
        {"bootstrap": "127.0.0.1:9", "topic": "t", "session_timeout_ms": 6000}, env={}
    )
    worker = Worker(cfg, status_out=io.StringIO())
    answers = iter(lags)
    worker._group_lag_elsewhere = lambda: next(answers)  # type: ignore[method-assign]
    return worker


def test_no_lag_elsewhere_stops_at_once() -> None:
    worker = _worker([{}])
    worker._stop_when_idle(8)
    assert worker._stopping.is_set() and worker._stop_reason == StopReason.idle(8)


def test_lag_on_a_stopped_members_partitions_waits_once_then_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("streamer.worker.time.monotonic", lambda: clock[0])
    worker = _worker([{1: 2500, 3: 2879}, {1: 2500, 3: 2879}, {1: 2500, 3: 2879}])
    worker._stop_when_idle(8)  # first idle: wait up to the session timeout + 10 s
    assert not worker._stopping.is_set()
    assert worker._last_data == 1000.0  # the idle clock starts again
    clock[0] += 10
    worker._stop_when_idle(8)  # still within the wait
    assert not worker._stopping.is_set()
    clock[0] += 10
    worker._stop_when_idle(8)  # past it: stop, naming what is left
    assert worker._stopping.is_set()
    assert worker._stop_reason == StopReason.idle(
        8,
        "; the group still has 5379 records not trained on partitions [1, 3], "
        "owned by no member here",
    )
    assert str(worker._stop_reason) == (
        "idle for 8s; the group still has 5379 records not trained on partitions [1, 3], "
        "owned by no member here"
    )


def test_the_lag_taken_over_meanwhile_stops_plainly() -> None:
    worker = _worker([{1: 2500}, {}])
    worker._stop_when_idle(8)
    assert not worker._stopping.is_set()
    worker._stop_when_idle(8)  # the partitions came here and were trained
    assert worker._stop_reason == StopReason.idle(8)
