"""ShardRouter alone (no Kafka): who owns a partition, the forget rule, where commits go."""

from __future__ import annotations

import numpy as np

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
