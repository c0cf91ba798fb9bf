"""Committer: the one commit sequence of both loops, and when it is due.

audit log flushed -> checkpoint (model, optimizer, step and the stream position, one save) ->
Kafka commit of the same offsets -> the position remembers them. With checkpoints, commits
follow them (the checkpoint is the source of truth, Flink's rule); without, commits go every
--commit-every-steps / --commit-every-seconds. Every offset is capped below the rejects the
reject breaker has not judged yet. The anchor is quix-streams' ``Checkpoint`` object: the one
owner of "offsets since the last commit, when a commit is due, the commit sequence".

How a checkpoint is saved is the loop's: one file for a worker of its own, an all-reduce of
the offsets and the chief's save for a cluster (``Save``). Pure of TensorFlow and Kafka
itself: the parts come in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from streamer.input.breaker import capped
from streamer.input.offsets import OffsetTracker
from streamer.input.stream_position import StreamPosition
from streamer.ops.audit import AuditLog
from streamer.ops.metrics import Metrics
from streamer.train.errors import CheckpointsFailingError, ModelDivergedError

__all__ = ["CommitSchedule", "Committer", "Save"]

log = logging.getLogger(__name__)

#: The longest wait between two attempts at a checkpoint that keeps failing.
MAX_RETRY_SECONDS = 60.0

#: Saves a checkpoint of ``step`` with ``offsets``; returns the offsets to commit afterwards
#: (a cluster worker: its own partitions of the all-reduced ones), or None when the save
#: failed (nothing is committed then). Raises ModelDivergedError for non-finite weights.
Save = Callable[[int, dict[int, int]], dict[int, int] | None]


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


class _Source(Protocol):
    @property
    def rollback(self) -> object | None: ...

    @property
    def revoke_commits(self) -> int: ...

    def commit(self, points: dict[int, int] | None = None) -> dict[int, int]: ...

    def commit_caps(self) -> dict[int, int]: ...

    def resting_points(self) -> dict[int, int]: ...


class Committer:
    """Owns the commit sequence; the loops say when a step finished and when a pass ends.

    >>> committer = Committer(source, tracker, position, metrics, save=save,  # doctest: +SKIP
    ...                       commits=CommitSchedule(50, 5.0), checkpoints=None)
    >>> committer.after_step(step)              # commits or checkpoints when due  # doctest: +SKIP
    """

    def __init__(
        self,
        source: _Source,
        tracker: OffsetTracker,
        position: StreamPosition,
        metrics: Metrics,
        *,
        commits: CommitSchedule,
        checkpoints: CommitSchedule | None,
        save: Save | None,
        audit: AuditLog | None = None,
        to_group: bool = True,
        failure_seconds: float | None = None,
        failure_cause: Callable[[], str] | None = None,
        directory: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``checkpoints`` and ``save`` both or neither; ``to_group`` False: a replay without
        --replay-group commits to no group (the position still moves). A failed checkpoint
        is tried again with back-off (1 s doubling to ``MAX_RETRY_SECONDS``), not at every
        step; failures for ``failure_seconds`` in a row (None: no bound) raise
        CheckpointsFailingError, naming ``directory`` and ``failure_cause()``."""
        self.source = source
        self.tracker = tracker
        self.position = position
        self.metrics = metrics
        self.commits = commits
        self.checkpoints = checkpoints
        self.save = save
        self.audit = audit
        self.to_group = to_group
        #: ``source.revoke_commits`` as of the last checkpoint: one more is a commit past it.
        self._revokes_seen = 0
        self.failure_seconds = failure_seconds
        self._failure_cause = failure_cause
        self._directory = directory
        self._clock = clock
        #: Since when checkpoints fail (monotonic; None while they work), how many attempts
        #: failed since, and when the next may be tried.
        self.failing_since: float | None = None
        self._failed_attempts = 0
        self._retry_at = 0.0
        self._backoff = 0.0
        self._start_step = commits.last_step

    @property
    def checkpointing(self) -> bool:
        return self.save is not None

    def done_points(self) -> dict[int, int]:
        """What is done now, below the rejects not judged yet."""
        return capped(self._points(), self.source.commit_caps())

    def _points(self) -> dict[int, int]:
        """The tracker's points, and the source's own position in partitions it holds with
        nothing registered (started ahead of the group's commit: committed even if no record
        of them comes again)."""
        return {**self.source.resting_points(), **self.tracker.commit_points()}

    @property
    def checkpointed_step(self) -> int:
        """The step of the last checkpoint (the run's first step before any, or without
        checkpoints)."""
        return self._start_step if self.checkpoints is None else self.checkpoints.last_step

    def checkpoint_due(self, step: int) -> bool:
        """The checkpoint schedule is due, and after failures the back-off has passed (a
        cluster's chief votes for a checkpoint with it)."""
        if self.checkpoints is None or not self.checkpoints.due(step):
            return False
        return self.failing_since is None or self._clock() >= self._retry_at

    def after_step(self, step: int, *, agreed: bool | None = None, final: bool = False) -> None:
        """A step finished: checkpoint (and commit) or commit when due; neither while a
        rollback is asked for (what was trained since the last checkpoint is undone).

        ``agreed``: a checkpoint decision made for every worker of a cluster at once (the
        round's all-reduced vote, ``streamer.cluster.topology.decide``); it replaces the
        checkpoint schedule. ``final``: the run stops after this step, so without checkpoints
        everything done is committed now."""
        if self.source.rollback is not None:
            return
        if self.checkpoints is not None:
            # A revocation committed past the last checkpoint: checkpoint now, so that a
            # rollback always has one at or past every commit (``streamer.rollback``).
            due = agreed
            if due is None:
                revoked = self.source.revoke_commits != self._revokes_seen
                retry = self.failing_since is None or self._clock() >= self._retry_at
                due = self.checkpoint_due(step) or (revoked and retry)
            if due:
                self.checkpoint(step)
        elif final or self.commits.due(step):
            self.commit(self.done_points(), step)

    def commit(self, points: dict[int, int], step: int) -> None:
        """Send ``points`` (capped) to the group; the audit log is never behind a commit."""
        points = capped(points, self.source.commit_caps())
        if self.audit is not None:
            self.audit.flush()
        if self.to_group:
            self.source.commit(points)
        # What was committed stays known after a pass closes its shards (and their tracker
        # state): an export after the pass still records every partition's position.
        self.position.commit(points)
        self.commits.done(step)

    def _failed(self, step: int) -> None:
        """A checkpoint failed: the next attempt after a back-off; past ``failure_seconds``
        of failures, CheckpointsFailingError."""
        now = self._clock()
        if self.failing_since is None:
            self.failing_since, self._backoff = now, 1.0
        else:
            self._backoff = min(self._backoff * 2, MAX_RETRY_SECONDS)
        self._failed_attempts += 1
        self._retry_at = now + self._backoff
        failing = now - self.failing_since
        if self.failure_seconds and failing >= self.failure_seconds:
            cause = self._failure_cause() if self._failure_cause is not None else "unknown"
            raise CheckpointsFailingError(failing, self._failed_attempts, cause, self._directory)

    def rolled_back(self, step: int, positions: dict[int, int]) -> None:
        """The model went back to a checkpoint of ``step`` with these positions: the
        schedules count from it, and the position is the checkpoint's."""
        self.position.roll_back(positions)
        self.commits.done(step)
        if self.checkpoints is not None:
            self.checkpoints.done(step)

    def checkpoint(self, step: int) -> bool:
        """Checkpoint the model with the stream position, then commit the same offsets.

        False when the save failed (logged and counted; nothing committed). Raises
        ModelDivergedError (counted as a failed checkpoint) for non-finite weights."""
        assert self.save is not None and self.checkpoints is not None
        revokes = self.source.revoke_commits
        positions = capped(self.position.current(self._points()), self.source.commit_caps())
        if self.audit is not None:
            self.audit.flush()
        try:
            committed = self.save(step, positions)
        except ModelDivergedError:
            self.metrics.checkpoint(False, time.time())
            raise
        if committed is None:
            self.metrics.checkpoint(False, time.time())
            self._failed(step)
            return False
        self.metrics.checkpoint(True, time.time())
        self.failing_since, self._failed_attempts, self._backoff = None, 0, 0.0
        # Kafka commits follow the checkpoint: the checkpoint is the source of truth.
        self.commit(committed, step)
        self.checkpoints.done(step)
        self._revokes_seen = revokes
        return True
