"""Rejects: records the decoder refused: logged (rate-limited, never the payload), then
dead-lettered, or marked done at once when there is no dead-letter topic."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from streamer.input.offsets import OffsetTracker

if TYPE_CHECKING:
    from streamer.input.deadletter import DeadLetterWriter

__all__ = ["Rejects"]

log = logging.getLogger(__name__)


class Rejects:
    """One source's rejected records.

    A record with a dead-letter topic is done once its write is acknowledged (the writer's
    ``on_done``); without one it is done at once: counted and skipped.
    """

    def __init__(
        self,
        topic: str,
        tracker: OffsetTracker,
        dead_letter: DeadLetterWriter | None = None,
        *,
        log_per_second: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
        explain: Callable[[bytes | None], str] | None = None,
    ) -> None:
        self.topic = topic
        #: Why a record was refused, in words (``decode.explain_reject``); only for the
        #: records that are logged (rate-limited): it decodes the record again.
        self.explain = explain
        #: The last explanation logged, for the reject breaker's message.
        self.example = ""
        self.tracker = tracker
        self.dead_letter = dead_letter
        self.log_per_second = log_per_second
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = log_per_second
        self._last = clock()
        self.count = 0

    def handle(
        self,
        values: list[bytes],
        partition: np.ndarray,
        offset: np.ndarray,
        rejected: list[tuple[int, str]],
        *,
        hold: bool = False,
    ) -> None:
        """``rejected``: (row in the block, reason) of each refused record. ``hold``: the
        reject breaker tripped: log them, but neither dead-letter them nor mark them done (a
        fixed restart decodes them again)."""
        with self._lock:
            self.count += len(rejected)
        for row, reason in rejected:
            p, o = int(partition[row]), int(offset[row])
            if self._may_log():
                why = reason
                if self.explain is not None:
                    why = self.example = self.explain(values[row])
                # Never the payload: only where it came from and why.
                log.warning("rejected record %s/%d@%d: %s", self.topic, p, o, why)
            if self.dead_letter is not None and not hold:
                value = values[row]
                self.dead_letter.send(value if value is not None else b"", self.topic, p, o, reason)
        if hold:
            return
        if self.dead_letter is None:
            rows = np.fromiter((r for r, _ in rejected), dtype=np.int64, count=len(rejected))
            self.tracker.ack(partition[rows], offset[rows])

    def _may_log(self) -> bool:
        """A token bucket: at most ``log_per_second`` lines per second."""
        now = self._clock()
        rate = self.log_per_second
        with self._lock:
            self._tokens = min(rate, self._tokens + (now - self._last) * rate)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
        return False

    def close(self) -> None:
        if self.dead_letter is not None:
            # A short wait: the stop must fit in --shutdown-timeout; what is not written
            # stays uncommitted and is read again after a restart.
            self.dead_letter.close(timeout=5.0)
