"""When the worker commits and checkpoints, and the audit log every commit waits for."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

__all__ = ["AuditLog", "CommitSchedule"]


class AuditLog:
    """Appends ``topic,partition,offset`` of every trained sample; fsynced on demand.

    Each step's lines reach the OS at once, before the step is acked: a commit can be sent by
    a shard's rebalance callback at any moment (not only by the worker, which fsyncs first),
    so only a log written before the ack is never behind a commit, even after ``kill -9``.
    """

    def __init__(self, path: str, topic: str) -> None:
        self.path = path
        self.topic = topic
        self._fh = open(path, "a", encoding="ascii")  # noqa: SIM115 - kept open for the run

    def add(self, partition: np.ndarray, offset: np.ndarray) -> None:
        prefix = self.topic + ","
        self._fh.write(
            "".join(
                f"{prefix}{p},{o}\n"
                for p, o in zip(partition.tolist(), offset.tolist(), strict=True)
            )
        )
        self._fh.flush()

    def flush(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self.flush()
        self._fh.close()


class CommitSchedule:
    """Due every ``every_steps`` steps or ``every_seconds`` seconds, whichever comes first.

    >>> now = [0.0]
    >>> s = CommitSchedule(50, 5.0, step=0, clock=lambda: now[0])
    >>> s.due(49), s.due(50)
    (False, True)
    >>> s.done(50); now[0] = 5.0; s.due(51)
    True
    """

    def __init__(
        self,
        every_steps: int,
        every_seconds: float,
        *,
        step: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self._clock = clock
        self.last_step = step
        self._last_t = clock()

    def due(self, step: int) -> bool:
        return (
            step - self.last_step >= self.every_steps
            or self._clock() - self._last_t >= self.every_seconds
        )

    def done(self, step: int) -> None:
        self.last_step, self._last_t = step, self._clock()
