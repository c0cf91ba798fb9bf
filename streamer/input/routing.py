"""ShardRouter: the source's side of its shards: who owns which partition, where commits go,
and every shard event routed to the offset tracker, metrics and health."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from consumers import ShardHooks, ShardLike
from consumers.clients.base import GroupCommit
from consumers.types import KafkaErrorType
from streamer.input.handover import EpochTable
from streamer.input.offsets import OffsetTracker
from streamer.input.starts import choose_start

if TYPE_CHECKING:
    from streamer.input.handover import HandOver
    from streamer.ops.health import Health
    from streamer.ops.metrics import Metrics

__all__ = ["Rollback", "ShardRouter"]

log = logging.getLogger(__name__)


@dataclass
class Rollback:
    """Partitions were lost with records trained here and not committed (``lost``), and what
    this source had trained of every partition then (``trained``: next offsets)."""

    lost: list[int]
    trained: dict[int, int]


class ShardRouter(ShardHooks):
    """The shards of one source: their hooks, their partitions, their commits, their starts.

    Where an assigned partition starts is decided here (``streamer.input.starts``), from this
    source's own position (``restore``: a checkpoint's offsets at first, then what it trained
    and committed, kept across passes), the group's committed offset as the shard read it in
    the assignment, and an operator's start (``restore`` with another ``restore_reason``:
    ``--start-from``, a replay's range), which holds for the first pass. ``topic_missing`` is
    what the last shard to look said, kept across passes (a new pass's shards have not looked
    yet) until one finds the topic or is assigned. ``handover`` (set by the dataset that
    trains) makes a revocation wait for the records it handed to training.
    """

    def __init__(
        self,
        topic: str,
        tracker: OffsetTracker,
        *,
        metrics: Metrics | None = None,
        health: Health | None = None,
        restore: dict[int, int] | None = None,
        restore_reason: str = "checkpoint",
    ) -> None:
        self.topic = topic
        self.tracker = tracker
        self.metrics = metrics
        self.health = health
        self._lock = threading.Lock()
        self._open: list[ShardLike] = []
        self._owner: dict[int, int] = {}
        self._paused: dict[int, int] = {}
        own = restore_reason == "checkpoint"
        #: This source's position per partition (what it trained), when it holds none now.
        self._mine: dict[int, int] = dict(restore or {}) if own else {}
        #: An operator's start per partition, and why: the first pass only.
        self._forced: dict[int, int] = {} if own else dict(restore or {})
        self._reasons: dict[int, str] = dict.fromkeys(self._forced, restore_reason)
        #: Partitions held now that started at this source's own position, ahead of the
        #: group's commit (or with none): that position is committed even if no record of
        #: them comes again (the group's commit lagged what was done: a dead letter acked as
        #: the last pass closed, a commit that failed).
        self._resting: dict[int, int] = {}
        #: This source's successful commits this run, per partition (the highest): a
        #: rollback never goes behind them (records committed are trained by no one again).
        self._committed: dict[int, int] = {}
        #: Per partition held, where this source began it or last committed it: records
        #: trained past it are this source's alone until a commit (``on_lost``).
        self._floor: dict[int, int] = {}
        #: The operator's start as given (``_forced`` is used up by the first pass): a
        #: rollback to the state this run began in starts there again.
        self._initial_forced = (dict(self._forced), dict(self._reasons))
        #: Set by a worker with a checkpoint to go back to: partitions lost (not revoked: no
        #: commit was possible) with records trained here since the last commit ask for a
        #: rollback (``rollback``) instead of being trained again by their next owner too.
        self.roll_back_on_lost = False
        #: A lost partition's records trained here and not committed: the pass ends and the
        #: worker goes back to a checkpoint; until then nothing this source did is committed.
        self.rollback: Rollback | None = None
        #: Revocations that committed (a planned move: what was trained, outside any
        #: checkpoint): the worker checkpoints at its next step, so it has one to go back to.
        self.revoke_commits = 0
        #: What the worker asked to commit, per partition (the highest): with checkpoints,
        #: offsets a checkpoint holds; a revocation at or below them commits nothing new.
        self._asked: dict[int, int] = {}
        #: Called (once) when a rollback is asked for: the source ends its pass.
        self.on_rollback: Callable[[], None] | None = None
        self.handover: HandOver | None = None
        #: Per partition, the epoch of its latest assignment to this source: a claimed block
        #: carries the table of its claim (streamer.input.handover drops rows of an ended one).
        self.epochs = EpochTable()
        self.topic_missing = False

    # ---- the shards --------------------------------------------------------------------------

    def add(self, shard: ShardLike) -> None:
        with self._lock:
            self._open.append(shard)

    def remove(self, shard: ShardLike) -> bool:
        """Forget a shard; False if it was not (or no longer) open."""
        with self._lock:
            if shard in self._open:
                self._open.remove(shard)
                return True
        return False

    def take_all(self) -> list[ShardLike]:
        """Every open shard, forgotten (the pass ends); an operator's start is used up, and
        what this pass trained is this source's position for the next."""
        with self._lock:
            shards, self._open = self._open, []
            self._forced.clear()
            self._reasons.clear()
            self._resting.clear()
            if self.topic_missing:  # positions in a topic that is gone (on_topic_missing)
                self.tracker.revoke(list(self.tracker.commit_points()))
            elif self.rollback is None:
                self._mine.update(self.tracker.commit_points())
            else:  # undone by ``roll_back``, or kept by ``keep_trained``
                self.rollback.trained.update(self.tracker.commit_points())
        return shards

    def committed(self) -> dict[int, int]:
        """This source's successful commits this run: the highest offset per partition."""
        with self._lock:
            return dict(self._committed)

    def roll_back(self, positions: dict[int, int], *, to_start: bool) -> None:
        """The worker went back to a checkpoint with these positions (after ``take_all``):
        they are this source's position now, and what was tracked since is dropped.
        ``to_start``: the state this run began in, where an operator's start applies again."""
        with self._lock:
            self.tracker.revoke(list(self.tracker.commit_points()))
            self._mine = dict(positions)
            self._resting.clear()
            if to_start:
                forced, reasons = self._initial_forced
                self._forced, self._reasons = dict(forced), dict(reasons)
                for p in forced:
                    self._mine.pop(p, None)
            self.rollback = None

    def keep_trained(self) -> None:
        """The worker could not go back to a checkpoint (one would undo records already
        committed): what this source trained stays its position, as without a rollback."""
        with self._lock:
            if self.rollback is not None:
                self._mine.update(self.rollback.trained)
                self._mine.update(self.tracker.commit_points())
            self.rollback = None

    def shards(self) -> list[ShardLike]:
        with self._lock:
            return list(self._open)

    def restore_offsets(self) -> dict[int, int]:
        """Where partitions would start now, as far as this source knows without the group:
        a process shard's fallback should its parent not answer an assignment in time."""
        with self._lock:
            return {**self._mine, **self.tracker.commit_points(), **self._forced}

    def forget_positions(self) -> None:
        """Forget this source's position in every partition (and the tracker's state of them):
        the next assignment starts where the group or ``auto_offset_reset`` says. For a reader
        that reads the same records again on purpose (the benchmark's memory soak)."""
        with self._lock:
            self._mine.clear()
            self._resting.clear()
            self.tracker.revoke(list(self.tracker.commit_points()))

    def mine(self, partition: int, points: dict[int, int] | None = None) -> int | None:
        """This source's position in ``partition``: the tracker's point while it holds
        records of it (``points``: the tracker's points, when the caller has them), else what
        it trained and committed before."""
        point = (self.tracker.commit_points() if points is None else points).get(partition)
        return point if point is not None else self._mine.get(partition)

    def assigned_count(self) -> int:
        with self._lock:
            return len(self._owner)

    def queued_records(self) -> int:
        return sum(s.queued_records for s in self.shards())

    def failure(self) -> BaseException | None:
        return next((s.failed for s in self.shards() if s.failed is not None), None)

    def commit(self, points: dict[int, int]) -> None:
        """Each partition's point to the shard that owns it now; a partition between owners (a
        rebalance under way) is sent again next time, and shards drop what is committed."""
        with self._lock:
            for p, o in points.items():
                self._asked[p] = max(o, self._asked.get(p, o))
        for shard in self.shards():
            owned = shard.assigned
            mine = {p: o for p, o in points.items() if p in owned}
            if mine:
                shard.commit(mine)

    # ---- hooks -------------------------------------------------------------------------------

    def on_assigned(
        self,
        shard_index: int,
        partitions: list[int],
        group: dict[int, GroupCommit] | None = None,
    ) -> dict[int, int]:
        known = group is not None
        found = group or {}
        seeks: dict[int, int] = {}
        epochs: dict[int, int] = {}
        points = self.tracker.commit_points()
        with self._lock:
            self._owner.update(dict.fromkeys(partitions, shard_index))
            if partitions:
                self.topic_missing = False
            for p in partitions:
                forced = (self._forced[p], self._reasons[p]) if p in self._forced else None
                mine = self.mine(p, points)
                group_commit = found.get(p)
                start = choose_start(
                    mine=mine, group=group_commit, group_known=known, forced=forced
                )
                self._resting.pop(p, None)
                if (
                    known
                    and forced is None
                    and mine is not None
                    and start.offset == mine
                    and (group_commit is None or group_commit.offset < mine)
                ):
                    self._resting[p] = mine
                epochs[p] = self.epochs.get(p) + 1
                began = start.offset
                if began is None and group_commit is not None:
                    began = group_commit.offset
                if began is not None:
                    self._floor[p] = began
                else:
                    self._floor.pop(p, None)
                if start.offset is not None:
                    seeks[p] = start.offset
                log.log(
                    logging.INFO if start.notable else logging.DEBUG,
                    "partition %d of %s starts at %s: %s",
                    p,
                    self.topic,
                    "the client's position" if start.offset is None else start.offset,
                    start.why,
                )
            self.epochs = self.epochs.updated(epochs)
        if self.handover is not None:
            self.handover.assign(epochs)
        if self.metrics is not None:
            self.metrics.partitions_assigned(partitions)
            self.metrics.seed_start(seeks)  # the lag counts from where they start
            self.metrics.rebalance("assigned")
        return seeks

    def resting_points(self) -> dict[int, int]:
        """This source's own position in partitions it holds now and started ahead of the
        group's commit: to be committed with what the tracker has (its points win)."""
        with self._lock:
            return {p: o for p, o in self._resting.items() if p in self._owner}

    def _forget(self, shard_index: int, partitions: list[int], event: str) -> dict[int, int]:
        """Drop the tracker state of partitions ``shard_index`` gives up; return their points.

        Only partitions this shard still owns: the tracker is keyed by partition alone, and a
        late revocation (a consumer closed after its session expired, or a child process's
        event arriving after a sibling's assignment) must not erase the new owner's records.
        """
        with self._lock:
            mine = [p for p in partitions if self._owner.get(p, shard_index) == shard_index]
            points = self.tracker.revoke(mine)
            rollback = self.rollback
            if rollback is not None:  # undone, unless the worker cannot go back after all
                rollback.trained.update(points)
            for p in mine:
                self._owner.pop(p, None)
                self._resting.pop(p, None)
                if p in points and rollback is None and not self.topic_missing:
                    self._mine[p] = points[p]
                    if p in self._forced:
                        # Back in this pass, it starts from what is done, not from the
                        # operator's start again.
                        self._forced[p] = points[p]
                        self._reasons[p] = "trained up to here before a revocation"
        if self.metrics is not None:
            self.metrics.partitions_revoked(mine)
            self.metrics.rebalance(event)  # type: ignore[arg-type]
        return points

    def on_revoking(self, shard_index: int, partitions: list[int]) -> None:
        """Before the revocation: no more of their records reach training, and those handed
        to it are trained first (bounded), so the commit that follows is exact."""
        handover = self.handover
        if handover is None:
            return
        with self._lock:
            if not any(getattr(s, "shard_index", None) == shard_index for s in self._open):
                return  # a shard closing at the end of its pass: nothing trains meanwhile
            mine = [p for p in partitions if self._owner.get(p, shard_index) == shard_index]
        if mine:
            points = self.tracker.commit_points
            handover.release(mine, lambda p: points().get(p))

    def on_revoked(self, shard_index: int, partitions: list[int]) -> dict[int, int]:
        points = self._forget(shard_index, partitions, "revoked")
        if self.rollback is not None:
            return {}  # what was trained since the checkpoint is undone: nothing to commit
        with self._lock:
            if any(o > self._asked.get(p, -1) for p, o in points.items()):
                self.revoke_commits += 1  # past what the worker committed (and checkpointed)
        return points

    def on_lost(self, shard_index: int, partitions: list[int]) -> None:
        if self.handover is not None:  # another member has them: train none of them here
            self.handover.block(partitions)
        with self._lock:
            # What this source trained and did not commit, of every partition it has records
            # of (a rollback undoes all of it) and of the lost ones.
            trained = self.tracker.commit_points()
            uncommitted = {
                p: trained[p]
                for p in partitions
                if p in trained
                and trained[p] > self._floor.get(p, -1)
                and self._owner.get(p, shard_index) == shard_index
            }
            first = False
            # A deleted topic's partitions are lost to no other member: nothing to undo.
            if uncommitted and self.roll_back_on_lost and not self.topic_missing:
                first = self.rollback is None
                if first:
                    self.rollback = Rollback(sorted(uncommitted), dict(trained))
                else:
                    assert self.rollback is not None
                    self.rollback.lost = sorted({*self.rollback.lost, *uncommitted})
        if uncommitted and not self.roll_back_on_lost:
            log.warning(
                "partitions %s were lost (this member was fenced or its session expired: "
                "another member may own them now) with records trained here and not "
                "committed, up to offsets %s: their next owner trains those again (a worker "
                "with --checkpoint-dir goes back to its checkpoint instead)",
                sorted(uncommitted),
                uncommitted,
            )
        self._forget(shard_index, partitions, "lost")
        if first and self.on_rollback is not None:
            self.on_rollback()

    def on_poll(
        self,
        shard_index: int,
        records: int,
        nbytes: int,
        highwater: dict[int, int],
        position: dict[int, int],
    ) -> None:
        if self.health is not None:
            self.health.beat("poller")
        m = self.metrics
        if m is None:
            return
        m.observe_poll(records, nbytes, time.time())
        for p, hw in highwater.items():
            m.set_high_watermark(p, hw)
        for p, pos in position.items():
            m.set_position(p, pos)

    def on_stable_offsets(self, shard_index: int, offsets: dict[int, int]) -> None:
        if self.metrics is not None:
            for p, off in offsets.items():
                self.metrics.set_last_stable(p, off)

    def on_commit(
        self, offsets: dict[int, int], ok: bool, seconds: float, error: str | None
    ) -> None:
        if ok:
            with self._lock:
                for p, off in offsets.items():
                    self._mine[p] = max(off, self._mine.get(p, off))
                    self._committed[p] = max(off, self._committed.get(p, off))
                    self._floor[p] = max(off, self._floor.get(p, off))
        if self.metrics is not None:
            self.metrics.observe_commit(offsets, ok, seconds)

    def on_topic_missing(self, shard_index: int, missing: bool) -> None:
        with self._lock:
            self.topic_missing = missing
            if missing and (self._mine or self._forced or self.tracker.commit_points()):
                # A topic that exists again is a new topic: offsets of the old one would
                # skip its records (past its end: out of range, a false alarm of loss), so
                # none is kept, nor taken back from the tracker when its partitions are
                # dropped or the pass ends (``_forget``, ``take_all``).
                log.warning(
                    "topic %r is missing: this worker's offsets of it no longer apply", self.topic
                )
                self._mine.clear()
                self._forced.clear()
                self._reasons.clear()
                self._resting.clear()
                self.tracker.revoke(list(self.tracker.commit_points()))
            if missing and self.rollback is not None:
                # Its records are gone with it: no other member trains them, nothing to undo.
                log.info("topic %r is missing: no rollback for its lost partitions", self.topic)
                self.rollback = None

    def on_group_committed(self, shard_index: int, offsets: dict[int, int]) -> None:
        if self.metrics is not None:
            self.metrics.seed_committed(offsets)

    def on_error(self, kind: KafkaErrorType, exc: BaseException) -> None:
        if self.metrics is not None:
            self.metrics.kafka_error(kind)

    def on_paused(self, shard_index: int, paused: int) -> None:
        with self._lock:
            self._paused[shard_index] = paused
            total = sum(self._paused.values())
        if self.metrics is not None:
            self.metrics.set_paused(total)
