"""streamer.lifecycle: the life both loops share, driven by a loop of its own (no broker, no
model): exit codes, shutdown whatever happens, the first stop reason, non-finite steps."""

from __future__ import annotations

import io
import logging
import os
import signal
import threading
import time

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


class Loop(Lifecycle):
    """A loop that runs ``body`` and records what the shared life did around it."""

    def __init__(self, body: object, **settings: str) -> None:
        super().__init__(load_config(settings, env={}), status_out=io.StringIO())
        self.body = body
        self.closed: list[str] = []
        self.stops: list[str] = []

    def _run(self) -> int:
        self.metrics = _metrics()
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
    loop.metrics = _metrics()
    acked: list[tuple[list[int], list[int]]] = []
    part, off = np.array([0, 0], np.int32), np.array([5, 6], np.int64)
    loop.skipped_step(part, off)
    loop.applied_step(lambda p, o: acked.append((p.tolist(), o.tolist())))
    assert acked and sorted(x for _, offs in acked for x in offs) == [5, 6]
    loop.skipped_step(part, off + 2)
    with pytest.raises(ModelDivergedError, match="2 steps in a row"):
        loop.skipped_step(part, off + 4)
