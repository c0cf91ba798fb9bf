"""StatusLine: the worker's progress, live on a terminal, as key=value log lines otherwise."""

from __future__ import annotations

import logging
import time
from typing import IO

from streamer.metrics import Metrics

__all__ = ["StatusLine"]

log = logging.getLogger("streamer.worker")  # the progress lines keep their logger name


class StatusLine:
    """A live status line on a terminal, key=value log lines otherwise."""

    def __init__(self, out: IO[str], interval: float, metrics: Metrics) -> None:
        self.out = out
        self.tty = out.isatty()
        self.interval = 1.0 if self.tty else interval
        self.metrics = metrics
        self._last = time.monotonic()
        self._last_samples = 0.0

    def maybe(self, step: int, loss: float, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        snap = self.metrics.snapshot()
        rate = (snap["samples_trained"] - self._last_samples) / max(now - self._last, 1e-9)
        self._last, self._last_samples = now, snap["samples_trained"]
        lag = int(snap["consumer_lag_records"])
        if self.tty:
            self.out.write(
                f"\rstep {step:>9,} | {rate:>9,.0f} samples/s | lag {lag:>10,} | loss {loss:.4f} "
                f"| trained {int(snap['samples_trained']):,}   "
            )
            self.out.flush()
        else:
            log.info(
                "progress step=%d samples_per_second=%.0f lag=%d loss=%.5f samples_trained=%d "
                "decode_errors=%d commits=%d",
                step,
                rate,
                lag,
                loss,
                snap["samples_trained"],
                snap["decode_errors"],
                snap["offset_commits_success"],
            )

    def end(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()
