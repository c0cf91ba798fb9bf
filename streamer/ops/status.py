"""StatusLine: the worker's progress, live on a terminal, as key=value log lines otherwise.

The rate is over **training time**: the samples trained since the last frame divided by the
time since then less the waits for input of a second or more (an idle stream is not a slow
worker); the final frame shows the whole run's rate over its training time. On a terminal a
log record never lands on the live line: the handler clears it, writes the record, and draws
the line again (``LiveLineHandler``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import IO

from streamer.ops.metrics import Metrics

__all__ = ["IDLE_WAIT_S", "LiveLineHandler", "StatusLine"]

log = logging.getLogger(__name__)

#: A wait for input this long or longer is idle time, not training time.
IDLE_WAIT_S = 1.0

_CLEAR = "\r\x1b[K"

_active_lock = threading.Lock()
_active: StatusLine | None = None


class StatusLine:
    """A live status line on a terminal, key=value log lines otherwise."""

    def __init__(
        self,
        out: IO[str],
        interval: float,
        metrics: Metrics,
        *,
        clock: Callable[[], float] | None = None,
        lag: Callable[[], int] | None = None,
    ) -> None:
        """``lag``: what the line shows as lag, where the consumer's lag would mislead (a
        replay: the records of its range not trained yet, not those after its end)."""
        self.out = out
        self._lag = lag
        self.tty = out.isatty()
        self.interval = 1.0 if self.tty else interval
        self.metrics = metrics
        self._clock = clock or time.monotonic
        self._last = self._clock()
        self._last_samples = 0.0
        self._idle = 0.0  # idle waits since the last frame
        #: The run's training time: from the first step's frame to the last step's, less the
        #: idle waits between (start-up, the first trace and shutdown are not training).
        self._began: float | None = None
        self._began_samples = 0.0
        self._last_step_at = self._last
        self._idle_total = 0.0
        self._idle_at_last_step = 0.0
        self._frame = ""
        self._shown = False  # the first step is always shown: where the loss starts
        self._metrics: dict[str, float] = {}
        if self.tty:
            global _active
            with _active_lock:
                _active = self

    def show_metrics(self, values: dict[str, float]) -> None:
        """The model's compiled metrics over the last window (``loss`` aside: the line shows
        the step's own): shown on every frame after the loss, as the progress bar of
        ``model.fit`` shows them."""
        self._metrics = {k: v for k, v in values.items() if k != "loss"}

    def waited(self, seconds: float) -> None:
        """The trainer waited ``seconds`` for input: a wait of a second or more is idle."""
        if seconds >= IDLE_WAIT_S:
            self._idle += seconds
            if self._began is not None:  # the first batch's wait is start-up (the group join)
                self._idle_total += seconds

    def maybe(
        self,
        step: int,
        loss: float,
        force: bool = False,
        final: bool = False,
        lag: int | None = None,
    ) -> None:
        """A frame if one is due (``force``: now). ``final``: the last one, its rate over the
        run's training time; ``lag``: the lag to show where the partitions are gone by then
        (read before the shards closed)."""
        now = self._clock()
        if not final:
            self._last_step_at, self._idle_at_last_step = now, self._idle_total
        if not force and not final and self._shown and now - self._last < self.interval:
            return
        self._shown = True
        snap = self.metrics.snapshot()
        samples = snap["samples_trained"]
        if self._began is None and not final:
            self._began, self._began_samples = now, samples
        if final:  # the whole run over its training time: a true last frame
            began = self._last_step_at if self._began is None else self._began
            busy = self._last_step_at - began - self._idle_at_last_step
            done = samples - self._began_samples
            rate = done / busy if busy > 0 and done else 0.0
        else:
            busy = now - self._last - self._idle
            rate = (samples - self._last_samples) / busy if busy > 0 else 0.0
        self._last, self._last_samples, self._idle = now, samples, 0.0
        if self._lag is not None:
            lag = int(self._lag())
        elif lag is None:
            lag = int(snap["consumer_lag_records"])
        commits = int(snap["offset_commits_success"])
        metrics = self._metrics
        # A loss not known yet (a cluster's comes one all-reduce after its step; none before
        # the first step) is shown as "-", never as a value: NaN would read as a diverged step.
        known = not math.isnan(loss)
        # Partitions left behind (records waiting, none trained for 30 s): named with how long.
        behind = (
            ""
            if final
            else ",".join(
                f"{p}:{seconds:.0f}s"
                for p, (seconds, _) in sorted(self.metrics.left_behind().items())
            )
        )
        if self.tty:
            shown = "".join(f" | {name} {value:.4f}" for name, value in metrics.items())
            text = f"{loss:.4f}" if known else "-"
            self._frame = (
                f"step {step:>9,} | {rate:>9,.0f} samples/s | lag {lag:>10,} | loss {text:>6}"
                f"{shown} | trained {int(samples):,} | commits {commits:,}"
                + (f" | behind {behind}" if behind else "")
            )
            with _active_lock:
                self.out.write(_CLEAR + self._frame)
                self.out.flush()
        else:
            log.info(
                "progress step=%d samples_per_second=%.0f lag=%d loss=%s samples_trained=%d "
                "decode_errors=%d commits=%d%s%s%s",
                step,
                rate,
                lag,
                f"{loss:.5f}" if known else "-",
                samples,
                snap["decode_errors"],
                commits,
                "".join(f" {name}={value:.5f}" for name, value in metrics.items()),
                f" left_behind={behind}" if behind else "",
                " (final: samples/s over the run's training time)" if final else "",
            )

    def end(self) -> None:
        global _active
        with _active_lock:
            if _active is self:
                _active = None
            if self.tty and self._frame:
                self.out.write("\n")
                self.out.flush()
                self._frame = ""

    # ---- for LiveLineHandler -------------------------------------------------------------------

    def _clear_for(self, stream: IO[str]) -> bool:
        if self.tty and self._frame and stream is self.out:
            stream.write(_CLEAR)
            return True
        return False

    def _redraw(self) -> None:
        self.out.write(self._frame)
        self.out.flush()


class LiveLineHandler(logging.StreamHandler):
    """A StreamHandler that moves a live status line out of a log record's way."""

    def emit(self, record: logging.LogRecord) -> None:
        with _active_lock:
            line = _active
            cleared = line is not None and line._clear_for(self.stream)
            super().emit(record)
            if cleared and line is not None:
                line._redraw()
