"""CommitBook: one shard's commit requests, what is known committed, and sending commits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from consumers.clients.base import ConsumerClient
from consumers.hooks import ShardHooks

__all__ = ["CommitBook"]

log = logging.getLogger(__name__)


class CommitBook:
    """The owner asks (``request``); the poller thread sends (``flush``). Guarded by ``lock``
    (the shard's), since rebalance callbacks read and forget it too.

    Requests at or below what is known committed are dropped, so an owner may send every commit
    point each time (none is lost to a rebalance in between) at no cost.

    >>> book = CommitBook(0, ShardHooks(), threading.RLock(), owned=lambda: {0, 1})
    >>> book.set_committed({0: 10, 7: 3})       # 7 is not ours: not noted
    >>> book.request({0: 10, 1: 5})
    >>> book.take()
    {1: 5}
    """

    def __init__(
        self,
        shard_index: int,
        hooks: ShardHooks,
        lock: threading.Condition | threading.RLock,
        *,
        owned: Callable[[], set[int]],
    ) -> None:
        self.shard_index = shard_index
        self.hooks = hooks
        self._lock = lock
        #: The partitions the shard owns now (read under ``lock``): only theirs are noted.
        self._owned = owned
        self._requests: dict[int, int] = {}  # asked for, not sent yet
        #: Per partition, the offset known committed (our commits, the group's).
        self._committed: dict[int, int] = {}
        self._failures = 0
        self._warned_at = -1e9

    def request(self, offsets: dict[int, int]) -> None:
        with self._lock:
            for p, off in offsets.items():
                if off > self._requests.get(p, -1) and off > self._committed.get(p, -1):
                    self._requests[p] = off

    def take(self) -> dict[int, int]:
        """The requests of owned partitions, removed from the book (others are dropped)."""
        with self._lock:
            owned = self._owned()
            out = {p: o for p, o in self._requests.items() if p in owned}
            self._requests.clear()
        return out

    def committed(self, partition: int) -> int | None:
        with self._lock:
            return self._committed.get(partition)

    def set_committed(self, offsets: dict[int, int]) -> None:
        """Note offsets known committed (never backwards) of the partitions owned now."""
        with self._lock:
            owned = self._owned()
            for p, off in offsets.items():
                if p in owned:
                    self._committed[p] = max(off, self._committed.get(p, -1))

    def forget(self, partitions: set[int] | list[int], *, requests: bool = True) -> dict[int, int]:
        """Forget partitions (assigned anew, or gone); returns what was known committed."""
        with self._lock:
            known = {p: self._committed.pop(p) for p in partitions if p in self._committed}
            if requests:
                for p in partitions:
                    self._requests.pop(p, None)
        return known

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def send(
        self,
        client: ConsumerClient,
        commits: dict[int, int],
        *,
        sync: bool,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit through ``client``: synchronously (raises on failure) or with a callback."""
        t0 = time.monotonic()
        log.debug("shard %d: commit %s (sync=%s)", self.shard_index, commits, sync)
        if sync:
            try:
                client.commit(commits, timeout_ms=timeout_ms)
            except Exception as exc:
                self.hooks.on_commit(commits, False, time.monotonic() - t0, type(exc).__name__)
                self.hooks.on_error("commit", exc)
                raise
            self.set_committed(commits)
            self.hooks.on_commit(commits, True, time.monotonic() - t0, None)
            return

        def done(offsets: dict[int, int], error: BaseException | None) -> None:
            if error is None:
                self.set_committed(offsets)
            err = None if error is None else type(error).__name__
            self.hooks.on_commit(offsets, error is None, time.monotonic() - t0, err)
            if error is not None:
                self.hooks.on_error("commit", error)
                self._warn_failed(offsets, err)

        client.commit(commits, callback=done)

    def _warn_failed(self, commits: dict[int, int], err: str | None) -> None:
        """Log a failed commit: the first at once, then one line per 10 s with a count.

        While the coordinator is unreachable every commit request fails at once; the failures
        are counted in metrics (kafka_errors{type="commit"}) and the log must stay readable.
        """
        now = time.monotonic()
        self._failures += 1
        if now - self._warned_at < 10.0:
            return
        log.warning(
            "shard %d: commit of %s failed: %s (%d failed commits since the last warning; "
            "the offsets are committed again later, nothing is lost)",
            self.shard_index,
            commits,
            err,
            self._failures,
        )
        self._warned_at = now
        self._failures = 0
