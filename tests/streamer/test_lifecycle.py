"""streamer.lifecycle: the life both loops share, driven by a loop of its own (no broker, no
model): exit codes, shutdown whatever happens, the first stop reason, non-finite steps."""

from __future__ import annotations

import io
import logging
import os
import signal
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from consumers.errors import ConfigError, StreamerError
from streamer.config import load_config
from streamer.lifecycle import Lifecycle
from streamer.ops.metrics import Metrics
from streamer.stopping import StopReason
from streamer.train.errors import ModelDivergedError


def _metrics() -> Metrics:
    return Metrics("t", version="0", tensorflow_version="0", kafka_python_version="0")


def _parts(**parts: object) -> SimpleNamespace:
    """What the shared life reads of a run's parts (``streamer.parts.Parts``), built here."""
    defaults: dict[str, object] = {
        "metrics": _metrics(),
        "source": None,
        "probe": None,
        "checkpointer": None,
    }
    return SimpleNamespace(**{**defaults, **parts}, close=lambda: None)


class Loop(Lifecycle):
    """A loop that runs ``body`` and records what the shared life did around it."""

    def __init__(self, body: object, **settings: str) -> None:
        super().__init__(load_config(settings, env={}), status_out=io.StringIO())
        self.body = body
        self.closed: list[str] = []
        self.stops: list[str] = []

    def _run(self) -> int:
        self.parts = _parts()  # type: ignore[assignment]
        if isinstance(self.body, BaseException):
            raise self.body
        assert callable(self.body)
        return int(self.body(self))

    def _on_stop(self) -> None:
        self.stops.append(str(self._stop_reason))

    def _close_more(self) -> None:
        self.closed.append("more")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (lambda loop: 0, 0),
        (ConfigError("shards", 0, "a positive integer"), 2),
        (ModelDivergedError("diverged", None), 3),
        (StreamerError("a broker went away"), 1),
    ],
    ids=["clean", "config", "diverged", "runtime"],
)
def test_the_exit_code_is_the_errors_and_shutdown_runs_whatever_happens(
    body: object, code: int
) -> None:
    loop = Loop(body)
    assert loop.run() == code
    assert loop.closed == ["more"]
    assert loop.health.readiness() == (False, "shutting down") and loop._stopping.is_set()


def test_the_error_line_says_when_a_restart_as_it_is_may_succeed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``StreamerError.retriable``: a broker away may pass with no change, a config error not."""
    from consumers.errors import BrokerUnavailableError

    with caplog.at_level(logging.ERROR):
        assert Loop(BrokerUnavailableError("127.0.0.1:1", "no answer")).run() == 1
        assert Loop(ConfigError("shards", 0, "a positive integer")).run() == 2
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lines) == 2, lines
    assert "a restart as it is tries again" in lines[0]
    assert "a restart" not in lines[1] and "shards" in lines[1]


def test_an_unexpected_error_propagates_after_the_shutdown() -> None:
    loop = Loop(RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        loop.run()
    assert loop.closed == ["more"]


def test_the_first_stop_reason_is_the_one_reported() -> None:
    loop = Loop(lambda lp: 0)
    loop.request_stop(StopReason.signal("SIGTERM"))
    loop.request_stop(StopReason.idle(8))
    assert loop._stop_reason == StopReason.signal("SIGTERM")
    assert loop.stops == ["signal SIGTERM"] * 2


def test_a_sigterm_is_a_stop_request_its_late_copy_is_ignored_and_a_later_one_is_passed_on() -> (
    None
):
    """The first SIGTERM stops the loop; a copy within the grace window after the run is
    ignored; one after it reaches the handler the loop replaced."""
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))

    def body(loop: Loop) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        assert loop._stopping.wait(5), "SIGTERM did not ask the loop to stop"
        return 0

    try:
        loop = Loop(body)
        assert threading.current_thread() is threading.main_thread()
        assert loop.run() == 0
        assert loop._stop_reason == StopReason.signal("SIGTERM") and seen == []
        os.kill(os.getpid(), signal.SIGTERM)  # a late copy (a group signal sent twice)
        time.sleep(0.2)
        assert seen == []
        until = loop._signal_stop.quiet_until()
        assert until is not None
        time.sleep(max(0.0, until - time.monotonic()) + 0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_non_finite_steps_in_a_row_stop_the_worker_and_an_applied_step_releases_them() -> None:
    loop = Loop(lambda lp: 0, max_nonfinite_steps="2")
    loop.parts = _parts()  # type: ignore[assignment]
    acked: list[tuple[list[int], list[int]]] = []
    part, off = np.array([0, 0], np.int32), np.array([5, 6], np.int64)
    loop.skipped_step(part, off)
    loop.applied_step(lambda p, o: acked.append((p.tolist(), o.tolist())))
    assert acked and sorted(x for _, offs in acked for x in offs) == [5, 6]
    loop.skipped_step(part, off + 2)
    with pytest.raises(ModelDivergedError, match="2 steps in a row"):
        loop.skipped_step(part, off + 4)


class _Source:
    """What readiness reads of a source."""

    def __init__(self, assigned: int, topic_missing: bool = False) -> None:
        self.assigned, self.topic_missing = assigned, topic_missing

    def assigned_partitions(self) -> int:
        return self.assigned


class _Probe:
    def __init__(self, up: bool) -> None:
        self.up = up


def _loops() -> list[Lifecycle]:
    """Both loops, built from a config (nothing started: readiness reads only these parts)."""
    from streamer.cluster.topology import topology_from
    from streamer.cluster.worker import DistributedWorker
    from streamer.worker import Worker

    cfg = load_config({"bootstrap": "127.0.0.1:1", "topic": "t"}, env={})
    topo = topology_from({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
                          '"task": {"type": "worker", "index": 0}}'})  # fmt: skip
    assert topo is not None
    cluster = DistributedWorker(cfg, topo, status_out=io.StringIO())
    cluster._formed = True
    return [Worker(cfg, status_out=io.StringIO()), cluster]


@pytest.mark.parametrize("index", [0, 1], ids=["worker", "cluster"])
def test_both_loops_stop_being_ready_without_a_broker_or_with_the_topic_deleted(
    index: int,
) -> None:
    """One readiness for both loops (``Lifecycle.update_ready``): a cluster worker whose broker
    is away or whose topic was deleted is not ready, like a worker of its own."""
    loop = _loops()[index]
    parts = loop.parts = _parts(source=_Source(2), probe=_Probe(up=True))  # type: ignore[assignment]
    loop.update_ready()
    ready, why = loop.health.readiness()
    assert ready and "2 partitions assigned" in why, why
    parts.source = _Source(2, topic_missing=True)
    loop.update_ready()
    assert loop.health.readiness() == (False, "topic t does not exist (deleted?); waiting for it")
    parts.probe = _Probe(up=False)
    loop.update_ready()
    assert loop.health.readiness() == (False, "no broker reachable at 127.0.0.1:1")
    parts.probe = _Probe(up=True)
    parts.source = _Source(0)
    loop.update_ready()
    assert loop.health.readiness() == (False, "no partitions assigned")


@pytest.mark.parametrize("index", [0, 1], ids=["worker", "cluster"])
def test_both_loops_tune_the_gc_and_trim_the_heap(
    index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start_watch`` (both loops call it once built): the GC tuned once, and the freed heap
    handed back every TRIM_EVERY_S from the watch thread."""
    import streamer.lifecycle as lifecycle

    loop = _loops()[index]
    calls: list[str] = []
    monkeypatch.setattr(lifecycle, "tune_gc", lambda: calls.append("tune"))
    monkeypatch.setattr(lifecycle, "release_free_memory", lambda: calls.append("trim"))
    monkeypatch.setattr(lifecycle, "TRIM_EVERY_S", 0.5)
    loop.parts = _parts()  # type: ignore[assignment]  # no broker: no probe
    loop.start_watch()
    deadline = time.monotonic() + 10
    while calls.count("trim") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    loop._finished.set()
    assert calls[0] == "tune" and calls.count("tune") == 1
    assert calls.count("trim") >= 2, calls


@pytest.mark.parametrize("index", [0, 1], ids=["worker", "cluster"])
def test_a_partition_left_behind_is_warned_of_once_and_its_return_is_said(
    index: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Records waiting in partition 0 and nothing of it trained for 30 s while partition 1
    trains (a fetch stalled after a broker fault): one WARNING naming it, none while it stays
    behind, one line when it trains again."""
    loop = _loops()[index]
    metrics = _metrics()
    loop.parts = _parts(source=_Source(2), metrics=metrics)  # type: ignore[assignment]
    metrics.partitions_assigned([0, 1])
    metrics.set_high_watermark(0, 500)
    metrics.set_high_watermark(1, 500)
    metrics.observe_trained([1], [499], [-1], 0.0)
    caplog.set_level(logging.INFO, logger="streamer.lifecycle")
    loop.watch_partitions()
    assert "left behind" not in caplog.text  # not yet 30 s
    metrics._partitions[0].moved_at -= 31  # 31 s without a record of it trained
    loop.watch_partitions()
    loop.watch_partitions()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "left behind: partition 0 of t, 500 records waiting" in warnings[0]
    assert "while other partitions train" in warnings[0]
    metrics.observe_trained([0], [10], [-1], 0.0)
    loop.watch_partitions()
    assert "partition 0 of t trains again after 3" in caplog.text


def test_a_partition_left_behind_and_then_revoked_is_not_said_to_train_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _loops()[0]
    metrics = _metrics()
    loop.parts = _parts(source=_Source(1), metrics=metrics)  # type: ignore[assignment]
    metrics.partitions_assigned([0])
    metrics.set_high_watermark(0, 50)
    metrics._partitions[0].moved_at -= 31
    caplog.set_level(logging.INFO, logger="streamer.lifecycle")
    loop.watch_partitions()
    assert "left behind: partition 0 of t, 50 records waiting" in caplog.text
    assert "while no partition trains" in caplog.text
    metrics.partitions_revoked([0])
    loop.watch_partitions()
    assert "partition 0 of t, left behind for 3" in caplog.text
    assert "is no longer assigned here" in caplog.text
    assert "trains again" not in caplog.text
