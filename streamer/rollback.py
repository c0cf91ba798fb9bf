"""Rollback points: the checkpoints a worker may go back to when it loses partitions.

A member that loses partitions (fenced, or its session expired: a paused pod, a long stall)
cannot commit what it trained of them since its last commit; their next owner starts from the
group's commit and trains those records again. Kafka Streams closes such a task "dirty" and
restores its state from the last commit; a worker does the same with its model: it goes back
to a checkpoint, and the records trained since are trained once, by whoever owns them next.

The checkpoint gone back to is the oldest one at or past everything this worker committed in
this run, partition by partition (commits follow checkpoints, so that is the one whose commit
was the last to succeed): going back past a commit would undo records no one trains again.
The state the run began in (its restored checkpoint, or one written at start) is the first.
Pure: no TensorFlow, no Kafka.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RollbackPoint", "RollbackPoints"]


@dataclass(frozen=True)
class RollbackPoint:
    """A checkpoint: where it is, its step, its positions, the audit log's size and the
    records trained in this run when it was written; ``start``: the state the run began in."""

    path: str
    step: int
    positions: dict[int, int]
    audit_size: int = 0
    start: bool = False
    trained: int = 0

    def covers(self, committed: dict[int, int]) -> bool:
        """True when no commit is past this checkpoint's position."""
        return all(self.positions.get(p, -1) >= o for p, o in committed.items())


@dataclass
class RollbackPoints:
    """The checkpoints of this run still on disk, oldest first.

    >>> points = RollbackPoints(exists=lambda path: True)
    >>> points.add(RollbackPoint("base", 0, {0: 10}, start=True))
    >>> points.add(RollbackPoint("ckpt-50", 50, {0: 500}))
    >>> points.add(RollbackPoint("ckpt-90", 90, {0: 900}))
    >>> points.target({0: 500}).path   # the last commit that succeeded was ckpt-50's
    'ckpt-50'
    >>> points.target({}).path         # nothing committed this run: back to its start
    'base'
    >>> points.target({0: 950}) is None  # a commit past every checkpoint: cannot go back
    True
    """

    exists: Callable[[str], bool] = field(
        default=lambda path: os.path.exists(path + ".index"), repr=False
    )
    points: list[RollbackPoint] = field(default_factory=list)

    def add(self, point: RollbackPoint) -> None:
        self.points = [p for p in self.points if self.exists(p.path)]
        self.points.append(point)

    def target(self, committed: dict[int, int]) -> RollbackPoint | None:
        """The oldest checkpoint on disk at or past every commit (None: there is none)."""
        return next((p for p in self.points if p.covers(committed) and self.exists(p.path)), None)

    def went_back_to(self, point: RollbackPoint) -> None:
        """The newer checkpoints hold what was undone: never a target again."""
        self.points = self.points[: self.points.index(point) + 1]
