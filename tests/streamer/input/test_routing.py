"""ShardRouter alone (no Kafka): who owns a partition, the forget rule, where commits go."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from consumers.clients.base import GroupCommit
from streamer.input.offsets import OffsetTracker
from streamer.input.routing import ShardRouter


class _Shard:
    def __init__(self, assigned: set[int]) -> None:
        self.assigned = frozenset(assigned)
        self.committed: list[dict[int, int]] = []
        self.queued_records = 0
        self.failed = None

    def commit(self, points: dict[int, int]) -> None:
        self.committed.append(points)


def _trained(tracker: OffsetTracker, partition: int, offsets: list[int]) -> None:
    parts = np.full(len(offsets), partition, np.int32)
    tracker.register(parts, np.array(offsets, np.int64))
    tracker.ack(parts, np.array(offsets, np.int64))


def test_a_late_revocation_never_erases_the_new_owners_partition() -> None:
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker)
    router.on_assigned(0, [3])
    router.on_assigned(1, [3])  # shard 1 owns it now (shard 0's revoke is late)
    _trained(tracker, 3, [10, 11])
    assert router.on_revoked(0, [3]) == {}  # not shard 0's any more: nothing forgotten
    assert tracker.commit_points().get(3) == 12
    assert router.on_revoked(1, [3]) == {3: 12}  # the owner's revoke hands the point back


def test_an_operators_start_holds_for_the_first_pass_and_follows_what_was_trained() -> None:
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker, restore={0: 100}, restore_reason="--start-from x")
    # The operator's start wins over the group's commit, ahead or behind.
    assert router.on_assigned(0, [0], {0: GroupCommit(500, "streamer-worker a")}) == {0: 100}
    _trained(tracker, 0, [100, 101, 102])
    router.on_revoked(0, [0])
    # Back in the same pass: from what was trained, not from the operator's start again.
    assert router.on_assigned(1, [0], {0: GroupCommit(500, "streamer-worker a")}) == {0: 103}
    router.on_revoked(1, [0])
    router.take_all()  # the pass ends: the operator's start is used up; the position stays
    assert router.restore_offsets() == {0: 103}
    assert router.on_assigned(0, [0], {0: GroupCommit(500, "streamer-worker a")}) == {0: 500}


def test_a_checkpoint_behind_the_group_starts_from_the_group() -> None:
    """A deploy: another member trained the partition since this worker's checkpoint."""
    router = ShardRouter("t", OffsetTracker(), restore={1: 16_253, 3: 16_000})
    group = {
        1: GroupCommit(46_599, "streamer-worker b"),
        3: GroupCommit(16_000, "streamer-worker b"),
    }
    assert router.on_assigned(0, [1, 3], group) == {1: 46_599, 3: 16_000}


def test_a_lagging_worker_commit_loses_to_what_this_worker_trained() -> None:
    """An outage: the group's commit is this worker's own, behind what it trained."""
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker, restore={0: 10})
    router.on_assigned(0, [0], {0: GroupCommit(10, "streamer-worker a")})
    _trained(tracker, 0, list(range(10, 60)))
    router.on_lost(0, [0])  # the session expired: nothing committed
    router.take_all()
    assert router.on_assigned(0, [0], {0: GroupCommit(10, "streamer-worker a")}) == {0: 60}


def test_a_position_ahead_of_the_group_is_committed_though_no_record_comes_again() -> None:
    """A rejected record's dead letter was acknowledged as the last pass closed: this worker's
    position passed the group's commit, with nothing left to register. The next commit
    carries it (the group's commit would stay behind forever otherwise); it is given up with
    the partition, and a start at the group's commit or an operator's rewind is not one."""
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker)
    router.on_assigned(0, [0, 1], {0: GroupCommit(51, "streamer-worker a")})
    _trained(tracker, 0, list(range(51, 82)))
    router.take_all()
    assert router.resting_points() == {}
    group = {
        0: GroupCommit(51, "streamer-worker a"),  # behind what this worker did: its own
        1: GroupCommit(7, "streamer-worker b"),  # no position of this worker's: the group's
    }
    assert router.on_assigned(0, [0, 1], group) == {0: 82, 1: 7}
    assert router.resting_points() == {0: 82}
    _trained(tracker, 0, [82, 83])
    assert router.resting_points() == {0: 82}  # the committer lets the tracker's point win
    router.on_revoked(0, [0])
    assert router.resting_points() == {}
    router.take_all()
    assert router.on_assigned(0, [0], {0: GroupCommit(3, "")}) == {0: 3}  # a rewind
    assert router.resting_points() == {}


def test_an_operators_rewind_of_the_group_wins_over_the_checkpoint() -> None:
    router = ShardRouter("t", OffsetTracker(), restore={0: 900})
    assert router.on_assigned(0, [0], {0: GroupCommit(0, "")}) == {0: 0}
    assert router.on_assigned(1, [2], None) == {}  # unknown group, no position: the client's


def test_commits_go_to_the_shard_that_owns_each_partition_now() -> None:
    router = ShardRouter("t", OffsetTracker())
    a, b = _Shard({0, 1}), _Shard({2})
    router.add(a)  # type: ignore[arg-type]
    router.add(b)  # type: ignore[arg-type]
    router.commit({0: 5, 2: 7, 9: 1})  # 9: between owners, sent again next time
    assert a.committed == [{0: 5}] and b.committed == [{2: 7}]


def test_a_missing_topic_drops_the_checkpoint_offsets() -> None:
    router = ShardRouter("t", OffsetTracker(), restore={0: 50})
    router.on_topic_missing(0, True)
    assert router.topic_missing and router.restore_offsets() == {}
    router.on_assigned(0, [0])
    assert not router.topic_missing


@pytest.mark.parametrize("when", ["dropped", "pass end"])
def test_a_deleted_topics_trained_offsets_are_not_taken_back_as_positions(when: str) -> None:
    """The topic is deleted under a pass whose records were trained: its shards report it
    missing, then drop its partitions (lost); the pass ends. None of the old topic's offsets
    is a position for the topic created again (its offsets start at 0: they would be out of
    range, reported as records lost upstream)."""
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker, restore={0: 50})
    router.on_assigned(0, [0, 1])
    _trained(tracker, 0, [50, 51])
    _trained(tracker, 1, [785])
    router.on_topic_missing(0, True)
    if when == "dropped":
        router.on_lost(0, [0, 1])
    router.take_all()
    assert router.restore_offsets() == {} and tracker.commit_points() == {}
    assert router.on_assigned(0, [0, 1]) == {}  # the new topic: where the group says
    assert not router.topic_missing


def test_a_lost_partition_trained_past_its_commit_asks_for_a_rollback() -> None:
    """A paused member: its partitions went to another member, which trains them from the
    group's commit; what this worker trained of them past it is undone, not kept."""
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker)
    router.roll_back_on_lost = True
    asked: list[int] = []
    router.on_rollback = lambda: asked.append(1)
    group = {0: GroupCommit(100, "streamer-worker a"), 1: GroupCommit(50, "streamer-worker a")}
    router.on_assigned(0, [0], group)
    router.on_assigned(1, [1], group)
    _trained(tracker, 0, [100, 101, 102])
    _trained(tracker, 1, [50, 51])
    router.on_commit({1: 52}, True, 0.01, None)  # partition 1's records are committed
    router.on_lost(1, [1])
    assert router.rollback is None and not asked  # nothing of partition 1 past its commit
    router.on_lost(0, [0])
    assert router.rollback is not None and router.rollback.lost == [0] and asked == [1]
    # While it is pending, nothing this source trained is committed, nor kept as its own.
    router.on_assigned(0, [2], {2: GroupCommit(7, "streamer-worker a")})
    _trained(tracker, 2, [7, 8])
    assert router.on_revoked(0, [2]) == {}
    router.take_all()
    assert router.rollback.trained == {0: 103, 2: 9}
    assert router.committed() == {1: 52}
    router.roll_back({0: 100, 1: 52, 2: 7}, to_start=False)
    assert router.rollback is None and tracker.commit_points() == {}
    # Back to the checkpoint's positions; a group's commit ahead of them still wins.
    assert router.on_assigned(0, [0], {0: GroupCommit(100, "streamer-worker a")}) == {0: 100}
    assert router.on_assigned(0, [2], {2: GroupCommit(90, "streamer-worker b")}) == {2: 90}


def test_a_rollback_that_cannot_go_back_keeps_what_was_trained() -> None:
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker)
    router.roll_back_on_lost = True
    router.on_assigned(0, [0], {0: GroupCommit(10, "streamer-worker a")})
    _trained(tracker, 0, [10, 11, 12])
    router.on_lost(0, [0])
    router.take_all()
    router.keep_trained()
    assert router.rollback is None
    assert router.restore_offsets() == {0: 13}


def test_a_lost_partition_without_checkpoints_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker)
    router.on_assigned(0, [0], {0: GroupCommit(10, "streamer-worker a")})
    _trained(tracker, 0, [10, 11])
    with caplog.at_level(logging.WARNING, "streamer.input.routing"):
        router.on_lost(0, [0])
    assert router.rollback is None
    assert "their next owner trains those again" in caplog.text
    assert router.restore_offsets() == {0: 12}  # as before: back here, it goes on from there


def test_a_rollback_to_the_start_applies_the_operators_start_again() -> None:
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker, restore={0: 5}, restore_reason="--start-from earliest")
    router.roll_back_on_lost = True
    router.on_assigned(0, [0], {0: GroupCommit(500, "streamer-worker a")})
    _trained(tracker, 0, [5, 6])
    router.on_lost(0, [0])
    router.take_all()
    router.roll_back({0: 5}, to_start=True)
    assert router.on_assigned(0, [0], {0: GroupCommit(500, "streamer-worker a")}) == {0: 5}


def test_only_a_revocation_past_what_the_worker_committed_counts_for_a_checkpoint() -> None:
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker)
    router.on_assigned(0, [0, 1], {})
    _trained(tracker, 0, [0, 1, 2])
    _trained(tracker, 1, [0, 1])
    router.commit({0: 3, 1: 2})  # after a checkpoint that holds them
    assert router.on_revoked(0, [0]) == {0: 3}
    assert router.revoke_commits == 0  # nothing past the checkpoint: no new one needed
    _trained(tracker, 1, [2, 3])
    assert router.on_revoked(0, [1]) == {1: 4}
    assert router.revoke_commits == 1
