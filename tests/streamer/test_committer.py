"""Committer alone (no Kafka, no TensorFlow): the sequence, when it is due, caps, failures."""

from __future__ import annotations

import numpy as np
import pytest

from streamer.committer import CommitSchedule, Committer
from streamer.input.offsets import OffsetTracker
from streamer.input.stream_position import StreamPosition
from streamer.ops.metrics import Metrics
from streamer.train.errors import ModelDivergedError


class _Source:
    def __init__(self) -> None:
        self.commits: list[dict[int, int]] = []
        self.caps: dict[int, int] = {}
        self.resting: dict[int, int] = {}
        self.rollback: object | None = None
        self.revoke_commits = 0

    def commit(self, points: dict[int, int] | None = None) -> dict[int, int]:
        self.commits.append(dict(points or {}))
        return dict(points or {})

    def commit_caps(self) -> dict[int, int]:
        return dict(self.caps)

    def resting_points(self) -> dict[int, int]:
        return dict(self.resting)


class _Audit:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def flush(self) -> None:
        self.log.append("audit")


def _parts(
    save: object = None, *, every: int = 2
) -> tuple[Committer, _Source, OffsetTracker, StreamPosition, list[str]]:
    order: list[str] = []
    source, tracker, position = _Source(), OffsetTracker(), StreamPosition({1: 40})
    metrics = Metrics("t", version="v", tensorflow_version="v", kafka_python_version="v")
    committer = Committer(
        source,
        tracker,
        position,
        metrics,
        commits=CommitSchedule(every, 10.0**9),
        checkpoints=None if save is None else CommitSchedule(every, 10.0**9),
        save=save,  # type: ignore[arg-type]
        audit=_Audit(order),  # type: ignore[arg-type]
    )
    tracker.register(np.array([0, 0, 0]), np.array([7, 8, 9]))
    tracker.ack(np.array([0, 0]), np.array([7, 8]))
    return committer, source, tracker, position, order


def test_commits_when_due_with_the_audit_log_first() -> None:
    committer, source, _, position, order = _parts()
    committer.after_step(1)
    assert source.commits == []
    committer.after_step(2)
    assert source.commits == [{0: 9}] and order == ["audit"]
    assert position.current() == {1: 40, 0: 9}


def test_a_checkpoint_saves_the_position_and_commits_what_it_saved() -> None:
    saved: list[tuple[int, dict[int, int]]] = []

    def save(step: int, offsets: dict[int, int]) -> dict[int, int]:
        saved.append((step, offsets))
        return offsets

    committer, source, _, _, order = _parts(save)
    committer.after_step(2)
    assert saved == [(2, {1: 40, 0: 9})]  # the restored partition too
    assert source.commits == [{1: 40, 0: 9}] and order == ["audit", "audit"]


def test_nothing_is_committed_past_unjudged_rejects_or_after_a_failed_save() -> None:
    committer, source, *_ = _parts(lambda step, offsets: None)
    committer.after_step(2)
    assert source.commits == []  # the save failed: nothing committed
    committer, source, *_ = _parts()
    source.caps = {0: 8}
    committer.commit(committer.done_points(), 3)
    assert source.commits == [{0: 8}]


def test_a_diverged_model_is_never_saved_nor_committed() -> None:
    def save(step: int, offsets: dict[int, int]) -> dict[int, int]:
        raise ModelDivergedError("NaN weights", None)

    committer, source, *_ = _parts(save)
    with pytest.raises(ModelDivergedError):
        committer.checkpoint(5)
    assert source.commits == []


def test_a_resting_position_is_committed_and_the_trackers_point_wins() -> None:
    """A partition held with nothing registered (``ShardRouter.resting_points``) is committed
    at this worker's position; where the tracker has a point, the tracker's is used."""
    committer, source, *_ = _parts()
    source.resting = {0: 3, 2: 60}
    committer.after_step(2)
    assert source.commits == [{0: 9, 2: 60}]


def test_nothing_is_committed_or_checkpointed_while_a_rollback_is_asked_for() -> None:
    saved: list[int] = []

    def save(step: int, offsets: dict[int, int]) -> dict[int, int]:
        saved.append(step)
        return offsets

    committer, source, _, _, _ = _parts(save)
    source.rollback = object()
    committer.after_step(2)
    assert saved == [] and source.commits == []
    source.rollback = None
    committer.after_step(3)
    assert saved == [3]


def test_a_revocation_that_committed_is_followed_by_a_checkpoint_at_the_next_step() -> None:
    """A planned move committed past the last checkpoint: a lost partition could otherwise
    find no checkpoint to go back to without undoing a commit."""
    saved: list[int] = []

    def save(step: int, offsets: dict[int, int]) -> dict[int, int]:
        saved.append(step)
        return offsets

    committer, source, _, position, _ = _parts(save, every=100)
    committer.after_step(1)
    assert saved == []
    source.revoke_commits += 1
    committer.after_step(2)
    committer.after_step(3)
    assert saved == [2]
    committer.rolled_back(2, {0: 8})
    assert position.current() == {0: 8}
    assert committer.checkpoints is not None and committer.checkpoints.last_step == 2


def test_a_clusters_agreed_decision_replaces_the_checkpoint_schedule() -> None:
    """The round's all-reduced vote decides (every worker alike), whatever this worker's own
    schedule says; the schedule still counts from each checkpoint (the chief's vote)."""
    saved: list[int] = []

    def save(step: int, offsets: dict[int, int]) -> dict[int, int]:
        saved.append(step)
        return offsets

    committer, source, _, _, _ = _parts(save, every=2)
    assert committer.checkpointed_step == 0 and not committer.checkpoint_due(1)
    committer.after_step(2, agreed=False)  # due here, but the round said no
    assert saved == [] and source.commits == [] and committer.checkpoint_due(2)
    committer.after_step(3, agreed=True)  # the round said yes
    assert saved == [3] and source.commits == [{0: 9, 1: 40}]
    assert committer.checkpointed_step == 3 and not committer.checkpoint_due(4)


def test_without_checkpoints_a_final_step_commits_whatever_the_schedule() -> None:
    committer, source, _, _, _ = _parts(every=100)
    committer.after_step(1, agreed=False)
    assert source.commits == []
    committer.after_step(2, agreed=False, final=True)
    assert source.commits == [{0: 9}]
    assert committer.checkpointed_step == 0  # no checkpoints: the run's first step


def test_a_failing_checkpoint_is_retried_with_back_off_then_stops_the_run() -> None:
    """Not at every step (198 ERROR lines in 20 s of a full disk once): 1 s doubling, and
    past the bound a typed error that names the directory and the cause."""
    from streamer.train.errors import CheckpointsFailingError

    now = [0.0]
    attempts: list[int] = []
    works = [False]

    def save(step: int, offsets: dict[int, int]) -> dict[int, int] | None:
        attempts.append(step)
        return offsets if works[0] else None

    source, tracker, position = _Source(), OffsetTracker(), StreamPosition()
    metrics = Metrics("t", version="v", tensorflow_version="v", kafka_python_version="v")
    committer = Committer(
        source,
        tracker,
        position,
        metrics,
        commits=CommitSchedule(1, 10.0**9, clock=lambda: now[0]),
        checkpoints=CommitSchedule(1, 10.0**9, clock=lambda: now[0]),
        save=save,
        failure_seconds=30.0,
        failure_cause=lambda: "No space left on device",
        directory="/ckpt",
        clock=lambda: now[0],
    )
    for step in range(1, 101):  # 100 steps in 10 s: attempts at 0, 1, 3, 7 s
        now[0] = step / 10
        committer.after_step(step)
    assert len(attempts) == 4 and committer.failing_since == pytest.approx(0.1)
    assert source.commits == []  # commits follow checkpoints
    works[0] = True
    now[0] = 16.0  # the back-off (8 s after the attempt at 7.1 s) has passed: it works again
    committer.after_step(101)
    assert committer.failing_since is None and source.commits
    works[0] = False
    with pytest.raises(CheckpointsFailingError, match=r"/ckpt have failed for 3\ds.*No space"):
        for step in range(102, 1000):
            now[0] += 0.5
            committer.after_step(step)
