"""BlockQueue: a shard's bounded queue of RecordBlocks; claimed under the revocation lock.

Used by thread shards (filled by the poller thread) and by the process shard's parent (filled
by the reader of the child's pipe). Every block is either claimed by the owner before its
partitions are revoked, so the owner's commit point at revocation accounts for it, or dropped
with the revocation: ``get(claim=...)`` runs the owner's claim under ``lock``, and whoever
revokes takes the same lock (``with queue.lock:``) while it drops blocks and asks the owner for
its commit point.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from consumers.block import RecordBlock

__all__ = ["BlockQueue"]

Claim = Callable[[RecordBlock], RecordBlock]


class BlockQueue:
    """Bounded (by ``max_blocks``, for backpressure: the producer side asks ``full``).

    >>> q = BlockQueue(2)
    >>> q.put(RecordBlock.from_columns("t", [b"a", b"b"], [0, 1], [5, 7], [0, 0]))
    >>> q.drop({1})           # partition 1 revoked: the lowest offset dropped, to rewind to
    {1: 7}
    >>> block = q.get(0.1)
    >>> block.offset.tolist(), q.queued_records, q.get(0.0)
    ([5], 0, None)
    """

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        #: Guards the queue; revocation and claims run under it (see the module docstring).
        self.lock = threading.Condition(threading.RLock())
        self._blocks: collections.deque[RecordBlock] = collections.deque()
        self._records = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def queued_records(self) -> int:
        return self._records

    @property
    def full(self) -> bool:
        return len(self._blocks) >= self.max_blocks

    @property
    def low(self) -> bool:
        """At most half full: partitions paused when it was full may resume (hysteresis: a
        pause drops what the client prefetched, and a resume costs a fetch round trip)."""
        return len(self._blocks) <= self.max_blocks // 2

    def wait_for_room(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the queue is not ``full``; True when it is not."""
        with self.lock:
            return self.lock.wait_for(lambda: not self.full, timeout)

    def put(self, block: RecordBlock) -> None:
        """Append a block (never blocks: the producer side holds or pauses when ``full``)."""
        with self.lock:
            self._blocks.append(block)
            self._records += len(block)
            self.lock.notify_all()

    def get(
        self,
        timeout: float,
        claim: Claim | None = None,
        *,
        ended: Callable[[], bool] = lambda: False,
    ) -> RecordBlock | None:
        """The next block (what ``claim`` returns for it), or None after ``timeout`` seconds
        or once ``ended()`` (checked under the lock, after every wake-up) says no more come."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not self._blocks:
                if ended():
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.lock.wait(remaining)
            block = self._blocks.popleft()
            self._records -= len(block)
            self.lock.notify_all()
            return claim(block) if claim is not None else block

    def drop(self, partitions: set[int]) -> dict[int, int]:
        """Drop the records (and ends) of ``partitions``; returns the lowest offset dropped per
        partition (a partition that comes back must be fetched again from there)."""
        low: dict[int, int] = {}
        with self.lock:
            kept: collections.deque[RecordBlock] = collections.deque()
            self._records = 0
            for block in self._blocks:
                for p, off in lowest_offsets(block, partitions).items():
                    low[p] = min(off, low.get(p, off))
                rest = block.without_partitions(partitions)
                if rest is not None:
                    kept.append(rest)
                    self._records += len(rest)
            self._blocks = kept
            self.lock.notify_all()
        return low

    def clear(self) -> None:
        with self.lock:
            self._blocks.clear()
            self._records = 0
            self.lock.notify_all()

    def wake(self) -> None:
        """Wake ``get`` callers so they look at ``ended()`` again."""
        with self.lock:
            self.lock.notify_all()


def lowest_offsets(block: RecordBlock, partitions: set[int]) -> dict[int, int]:
    """The lowest offset of each of ``partitions`` in ``block`` (those it has records of)."""
    out: dict[int, int] = {}
    for p in partitions:
        mask = block.partition == p
        if mask.any():
            out[p] = int(block.offset[mask].min())
    return out
