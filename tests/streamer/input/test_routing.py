"""ShardRouter alone (no Kafka): who owns a partition, the forget rule, where commits go."""

from __future__ import annotations

import numpy as np

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


def test_restore_offsets_follow_what_was_trained_before_a_revocation() -> None:
    tracker = OffsetTracker()
    router = ShardRouter("t", tracker, restore={0: 100}, restore_reason="--start-from x")
    assert router.on_assigned(0, [0]) == {0: 100}
    assert router.seek_reason(0) == "--start-from x"
    _trained(tracker, 0, [100, 101, 102])
    router.on_revoked(0, [0])
    assert router.on_assigned(1, [0]) == {0: 103}  # the next owner starts where it was left
    assert router.seek_reason(0) == "trained up to here before a revocation"
    router.take_all()  # the pass ends: restore offsets are used up
    assert router.restore_offsets() == {}


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
