"""ShuffleWindow: mixes decoded rows across blocks and partitions with numpy, no per-record Python."""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["ShuffleWindow"]


class ShuffleWindow:
    """A window of up to ``capacity`` decoded rows; each block in pushes as many random rows out.

    Columns are parallel arrays (features and the partition/offset/timestamp metadata), so a
    row's offsets always travel with its features and the low-watermark commit stays exact.

    >>> w = ShuffleWindow(4, seed=0)
    >>> out = w.push([np.arange(3)])      # window not full: nothing out yet
    >>> len(out[0]), len(w.push([np.arange(3, 6)])[0]), len(w.flush()[0])
    (0, 2, 4)
    """

    def __init__(self, capacity: int, seed: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._rng = np.random.default_rng(seed)
        self._pool: list[np.ndarray] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return 0 if self._pool is None else len(self._pool[0])

    def push(self, columns: list[np.ndarray]) -> list[np.ndarray]:
        """Add a block's rows; return random rows so that at most ``capacity`` stay behind."""
        with self._lock:
            pool = self._merge(columns)
            n = len(pool[0])
            emit = n - self.capacity
            if emit <= 0:
                self._pool = pool
                return [c[:0] for c in pool]
            order = self._rng.permutation(n)
            out_idx, keep_idx = order[:emit], order[emit:]
            self._pool = [c[keep_idx] for c in pool]
            return [c[out_idx] for c in pool]

    def flush(self, like: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Every row still in the window, shuffled (at the end of a pass, or while idle)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            if like is None:
                raise ValueError("flush of an empty window needs column templates")
            return [c[:0] for c in like]
        order = self._rng.permutation(len(pool[0]))
        return [c[order] for c in pool]

    def _merge(self, columns: list[np.ndarray]) -> list[np.ndarray]:
        if self._pool is None:
            return list(columns)
        return [np.concatenate((a, b)) for a, b in zip(self._pool, columns, strict=True)]
