"""The status line (pure: a fake clock and a snapshot): its rate counts training time only,
its final frame is the run's average, and a replay's lag is what is left of its range."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from streamer.ops.status import StatusLine


class Snapshot:
    """What ``Metrics.snapshot`` gives the line (the totals it reads)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {
            "samples_trained": 0.0,
            "consumer_lag_records": 10_000.0,
            "offset_commits_success": 0.0,
            "decode_errors": 0.0,
        }

        #: What ``Metrics.left_behind`` gives: partition -> (seconds, lag).
        self.behind: dict[int, tuple[float, int]] = {}

    def snapshot(self) -> dict[str, float]:
        return dict(self.values)

    def left_behind(self) -> dict[int, tuple[float, int]]:
        return dict(self.behind)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def progress(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress")]
    return [dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv) for line in lines]


def test_the_rate_leaves_idle_waits_out_and_the_final_frame_is_the_run_average(
    caplog: pytest.LogCaptureFixture,
) -> None:
    snap, clock = Snapshot(), Clock()
    line = StatusLine(io.StringIO(), 10.0, snap, clock=clock)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="streamer.ops.status")
    line.maybe(1, 0.5)  # the first step is always shown
    clock.now += 10.0
    snap.values["samples_trained"] = 10_000.0
    line.waited(5.0)  # idle: half of the window
    line.maybe(2, 0.4)
    clock.now += 3.0  # not due: no frame
    line.maybe(3, 0.3)
    clock.now += 20.0
    line.waited(20.0)  # idle to the end: the final rate ignores it
    line.maybe(3, 0.3, final=True)
    frames = progress(caplog)
    assert len(frames) == 3
    assert frames[1]["samples_per_second"] == "2000"  # 10,000 in 5 s of training
    assert frames[2]["samples_per_second"] == "1250"  # 10,000 in 33 s less 25 s idle
    assert frames[2]["lag"] == "10000"


def test_a_replays_lag_is_what_is_left_of_its_range(caplog: pytest.LogCaptureFixture) -> None:
    left = [300]
    line = StatusLine(io.StringIO(), 10.0, Snapshot(), clock=Clock(), lag=lambda: left[0])  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="streamer.ops.status")
    line.maybe(1, 0.5)
    left[0] = 0
    line.maybe(2, 0.4, final=True)
    assert [f["lag"] for f in progress(caplog)] == ["300", "0"]


def test_a_terminal_gets_one_line_rewritten_in_place() -> None:
    out: Any = io.StringIO()
    out.isatty = lambda: True
    clock = Clock()
    line = StatusLine(out, 10.0, Snapshot(), clock=clock)  # type: ignore[arg-type]
    line.maybe(1, 0.5)
    clock.now += 1.0
    line.maybe(2, 0.25)
    line.end()
    text = out.getvalue()
    assert text.count("\r\x1b[K") >= 2 and "loss 0.2500" in text and text.endswith("\n")


def test_the_final_rate_leaves_start_up_and_shutdown_out_and_shows_the_lag_it_is_given(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's rate is over its steps: the group join before the first batch and the
    checkpoint, commit and close after the last are not training time. The final lag is the
    one read before the shards closed (the partitions are gone by then)."""
    snap, clock = Snapshot(), Clock()
    line = StatusLine(io.StringIO(), 10.0, snap, clock=clock)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="streamer.ops.status")
    clock.now += 30.0
    line.waited(30.0)  # joining the group
    snap.values["samples_trained"] = 256.0
    line.maybe(1, 0.5)
    for step in range(2, 12):  # ten steps of 256 in 2 s
        clock.now += 0.2
        snap.values["samples_trained"] += 256.0
        line.maybe(step, 0.4)
    clock.now += 40.0  # checkpoint, commit, close, export
    snap.values["consumer_lag_records"] = 0.0  # the partitions were revoked
    line.maybe(11, 0.4, final=True, lag=59_080)
    final = progress(caplog)[-1]
    assert final["samples_per_second"] == "1280"  # 2,560 in 2 s, not 2,816 in 72 s
    assert final["lag"] == "59080"


def test_the_compiled_metrics_follow_the_loss_on_every_frame(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As ``model.fit``'s progress bar shows them: the model's compiled metrics of the last
    window, on the log lines and on a terminal's line (the window's ``loss`` left out: the
    line shows the step's own)."""
    caplog.set_level(logging.INFO, logger="streamer.ops.status")
    line = StatusLine(io.StringIO(), 10.0, Snapshot(), clock=Clock())  # type: ignore[arg-type]
    line.maybe(1, 0.5)
    line.show_metrics({"loss": 0.45, "mae": 0.125})
    line.maybe(2, 0.4, force=True)
    frames = progress(caplog)
    assert "mae" not in frames[0]
    assert frames[1]["mae"] == "0.12500" and frames[1]["loss"] == "0.40000", frames
    out: Any = io.StringIO()
    out.isatty = lambda: True
    tty = StatusLine(out, 10.0, Snapshot(), clock=Clock())  # type: ignore[arg-type]
    tty.show_metrics({"mae": 0.25})
    tty.maybe(1, 0.5)
    assert "| loss 0.5000 | mae 0.2500 | trained" in out.getvalue(), out.getvalue()


def test_a_log_record_on_a_terminal_never_lands_on_the_live_line() -> None:
    """The handler clears the live line, writes the record on a line of its own and draws
    the line again; after ``end`` a record is written as it is."""
    from streamer.ops.status import LiveLineHandler

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, snap = Tty(), Snapshot()
    line = StatusLine(out, 10.0, snap, clock=Clock())  # type: ignore[arg-type]
    handler = LiveLineHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("streamer.test-live-line")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        line.maybe(1, 0.5)
        frame = out.getvalue().split("\r\x1b[K")[-1]
        assert frame.startswith("step")
        logger.warning("a broker went away")
        # Cleared, the record alone on its line, the frame drawn again after it.
        assert out.getvalue().endswith(f"\r\x1b[KWARNING a broker went away\n{frame}")
        line.end()
        assert out.getvalue().endswith(frame + "\n")
        logger.warning("after the end")
        assert out.getvalue().endswith(frame + "\nWARNING after the end\n")
    finally:
        logger.removeHandler(handler)
        line.end()


def test_a_loss_not_known_yet_is_shown_as_unknown_never_as_nan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cluster's loss of a round comes one all-reduce later: its first frame has none."""
    caplog.set_level(logging.INFO, logger="streamer.ops.status")
    clock = Clock()
    line = StatusLine(io.StringIO(), 10.0, Snapshot(), clock=clock)  # type: ignore[arg-type]
    line.maybe(1, float("nan"))
    clock.now += 11.0
    line.maybe(2, 0.25)
    frames = progress(caplog)
    assert [f["loss"] for f in frames] == ["-", "0.25000"]
    out: Any = io.StringIO()
    out.isatty = lambda: True
    tty = StatusLine(out, 10.0, Snapshot(), clock=Clock())  # type: ignore[arg-type]
    tty.maybe(1, float("nan"))
    tty.end()
    assert "loss      -" in out.getvalue() and "nan" not in out.getvalue()


def test_a_partition_left_behind_is_named_on_every_frame_until_it_trains(
    caplog: pytest.LogCaptureFixture,
) -> None:
    snap, clock, out = Snapshot(), Clock(), io.StringIO()
    line = StatusLine(out, 10.0, snap, clock=clock)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="streamer.ops.status")
    line.maybe(1, 0.5)
    snap.behind = {3: (45.2, 1200), 5: (31.0, 80)}
    clock.now += 10.0
    line.maybe(2, 0.4)
    snap.behind = {}
    clock.now += 10.0
    line.maybe(3, 0.4)
    frames = progress(caplog)
    assert [f.get("left_behind") for f in frames] == [None, "3:45s,5:31s", None]
    tty = StatusLine(out, 10.0, snap, clock=clock)  # type: ignore[arg-type]
    tty.tty = True
    snap.behind = {3: (45.2, 1200)}
    tty.maybe(4, 0.4)
    assert out.getvalue().rstrip().endswith("| behind 3:45s")
