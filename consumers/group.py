"""Group membership logic of a pass's shards: the join barrier and the rejoin watch (pure).

Both take an injected clock, so their rules are unit-tested without Kafka.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Barrier", "JoinBarrier", "RejoinWatch"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class Barrier(Protocol):
    """What a shard reports its group generation to (a JoinBarrier, or a child's proxy of one)."""

    released: bool

    def report(self, shard_index: int, generation: int | None) -> bool:
        """``generation`` None: rebalancing. True once the shard may fetch."""
        ...


class JoinBarrier:
    """Holds the shards of one pass paused until all of them joined the same group generation.

    Shards are created one after the other; without this the first one to join is assigned
    every partition, starts fetching, and each later join revokes and re-fetches (a rebalance
    round each). Released once every shard reported the same stable generation for
    ``settle_seconds`` (a leader that assigned from stale metadata rejoins within a heartbeat), or
    after ``timeout_seconds`` (another worker may keep the group rebalancing).

    >>> now = [0.0]
    >>> barrier = JoinBarrier(2, settle_seconds=1.0, clock=lambda: now[0])
    >>> barrier.report(0, 5), barrier.report(1, 5)
    (False, False)
    >>> now[0] = 1.5
    >>> barrier.report(0, 5)
    True
    """

    def __init__(
        self,
        parties: int,
        *,
        settle_seconds: float = 1.5,
        timeout_seconds: float = 30.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.parties = parties
        self.settle_seconds = settle_seconds
        self._clock = clock
        self._generations: dict[int, int | None] = {}
        self._lock = threading.Lock()
        self._deadline = clock() + timeout_seconds
        self._agreed_since: float | None = None
        self.released = False

    def report(self, shard_index: int, generation: int | None) -> bool:
        """Shard ``shard_index`` is stable in ``generation`` (None: rebalancing); True once
        released. Ask again while not released: the settle time passes between reports."""
        now = self._clock()
        with self._lock:
            if self.released:
                return True
            if self._generations.get(shard_index, -2) != generation:
                self._agreed_since = None
            self._generations[shard_index] = generation
            gens = set(self._generations.values())
            if len(self._generations) == self.parties and len(gens) == 1 and None not in gens:
                if self._agreed_since is None:
                    self._agreed_since = now
                elif now - self._agreed_since >= self.settle_seconds:
                    self.released = True
            if not self.released and now > self._deadline:
                log.warning(
                    "shards did not settle on one group generation in time; starting anyway"
                )
                self.released = True
            return self.released


class RejoinWatch:
    """Tells when a group member has not been stable for too long.

    Seen with kafka-python 3.0.12 against Kafka 4.x: a member revoked for a rebalance right
    after its first assignment sometimes never completes the rejoin (no assignment, no error)
    until its consumer is recreated. A legitimate rebalance waits at most for a departed
    static member's session to expire, so the limit is the session timeout plus a margin.
    ``observe`` returns what to do: ``"ok"``, ``"nudge"`` (unstable for ``nudge_after_seconds``: ask
    the client to take up a join it may have left pending) or ``"stuck"`` (recreate it).

    >>> now = [0.0]
    >>> watch = RejoinWatch(stuck_after_seconds=10.0, clock=lambda: now[0])
    >>> watch.observe(False), watch.unstable
    ('ok', True)
    >>> now[0] = 2.0; watch.observe(False)
    'nudge'
    >>> now[0] = 11.0; watch.observe(False)
    'stuck'
    >>> watch.observe(True), watch.unstable
    ('ok', False)
    """

    def __init__(
        self,
        *,
        stuck_after_seconds: float,
        nudge_after_seconds: float = 1.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.stuck_after_seconds = stuck_after_seconds
        self.nudge_after_seconds = nudge_after_seconds
        self._clock = clock
        self._unstable_since: float | None = None

    @property
    def unstable(self) -> bool:
        """The member was not stable when last observed (its pass is joining, not idle)."""
        return self._unstable_since is not None

    def observe(self, stable: bool) -> str:
        now = self._clock()
        if stable:
            self._unstable_since = None
            return "ok"
        if self._unstable_since is None:
            self._unstable_since = now
            return "ok"
        waited = now - self._unstable_since
        if waited >= self.stuck_after_seconds:
            return "stuck"
        return "nudge" if waited >= self.nudge_after_seconds else "ok"

    def reset(self) -> None:
        self._unstable_since = None
