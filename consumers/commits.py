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

_RETRY_FIRST_S = 0.5  # a failed commit is asked for again after this, doubling
_RETRY_MAX_S = 5.0


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
        #: After a failed commit (the coordinator moving: a broker died), its offsets are
        #: asked for again, not before this time (backoff doubling to _RETRY_MAX_S).
        self._retry_at = 0.0
        self._backoff = 0.0
        #: Async commits sent whose answer has not come: a synchronous flush (a consumer
        #: closing) sends them again, since kafka-python's close does not wait for them.
        self._inflight: dict[int, int] = {}

    def request(self, offsets: dict[int, int]) -> None:
        with self._lock:
            for p, off in offsets.items():
                if off > self._requests.get(p, -1) and off > self._committed.get(p, -1):
                    self._requests[p] = off

    def take(self, *, force: bool = False) -> dict[int, int]:
        """The requests of owned partitions, removed from the book (others are dropped);
        nothing while a failed commit's backoff runs, unless ``force`` (a synchronous flush,
        which also takes the async commits still unanswered).
        """
        with self._lock:
            if not force and time.monotonic() < self._retry_at:
                return {}
            owned = self._owned()
            out = {p: o for p, o in self._requests.items() if p in owned}
            self._requests.clear()
            if force:
                for p, o in self._inflight.items():
                    if p in owned and o > max(out.get(p, -1), self._committed.get(p, -1)):
                        out[p] = o
                self._inflight.clear()
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
                self._failed(commits)
                raise
            self._succeeded(commits)
            self.hooks.on_commit(commits, True, time.monotonic() - t0, None)
            return

        with self._lock:
            for p, o in commits.items():
                self._inflight[p] = max(o, self._inflight.get(p, -1))

        def done(offsets: dict[int, int], error: BaseException | None) -> None:
            with self._lock:
                for p, o in offsets.items():
                    if self._inflight.get(p, o + 1) <= o:
                        del self._inflight[p]
            if error is None:
                self._succeeded(offsets)
            else:
                self._failed(offsets)
            err = None if error is None else type(error).__name__
            self.hooks.on_commit(offsets, error is None, time.monotonic() - t0, err)
            if error is not None:
                self.hooks.on_error("commit", error)
                self._warn_failed(offsets, err)

        client.commit(commits, callback=done)

    def _succeeded(self, offsets: dict[int, int]) -> None:
        self.set_committed(offsets)
        with self._lock:
            self._backoff = 0.0
            self._retry_at = 0.0

    def _failed(self, offsets: dict[int, int]) -> None:
        """Ask for a failed commit again (after a backoff) unless a newer one is waiting.

        A checkpoint's commit that met a coordinator moving to another broker was lost until
        the next checkpoint; if the pass ended first, the next one started from the older
        commit and trained everything since again. The commit now follows the coordinator.
        """
        self.request(offsets)
        with self._lock:
            self._backoff = min(_RETRY_MAX_S, max(_RETRY_FIRST_S, 2 * self._backoff))
            self._retry_at = time.monotonic() + self._backoff

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
