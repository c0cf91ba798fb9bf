"""ShuffleWindow: mixes decoded rows across blocks and partitions with numpy, no per-record Python."""

from __future__ import annotations

import threading

import numpy as np

from streamer.decode.ragged import Column, concat_rows, empty_rows, mask_rows, num_rows, take_rows

__all__ = ["ShuffleWindow"]


class ShuffleWindow:
    """A window of up to ``capacity`` decoded rows; each block in pushes as many random rows out.

    Columns are parallel arrays (features and the partition/offset/timestamp metadata), so a
    row's offsets always travel with its features and the low-watermark commit stays exact.
    A variable-length feature's column is a ``RaggedColumn`` (flat values, row lengths): its
    rows move whole, with numpy gathers, like those of a plain column.

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
        self._pool: list[Column] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return 0 if self._pool is None else num_rows(self._pool[0])

    def push(self, columns: list[Column]) -> list[Column]:
        """Add a block's rows; return random rows so that at most ``capacity`` stay behind."""
        with self._lock:
            pool = self._merge(columns)
            n = num_rows(pool[0])
            emit = n - self.capacity
            if emit <= 0:
                self._pool = pool
                return [empty_rows(c) for c in pool]
            # A random subset in random order goes out; the rest stays in place (its order
            # does not matter: every later pick is uniform again), kept by a boolean mask,
            # which for ragged columns is much cheaper than gathering by index.
            out_idx = self._rng.permutation(n)[:emit]
            keep = np.ones(n, dtype=bool)
            keep[out_idx] = False
            self._pool = [mask_rows(c, keep) for c in pool]
            return [take_rows(c, out_idx) for c in pool]

    def flush(self, like: list[Column] | None = None) -> list[Column]:
        """Every row still in the window, shuffled (at the end of a pass, or while idle)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            if like is None:
                raise ValueError("flush of an empty window needs column templates")
            return [empty_rows(c) for c in like]
        order = self._rng.permutation(num_rows(pool[0]))
        return [take_rows(c, order) for c in pool]

    def _merge(self, columns: list[Column]) -> list[Column]:
        if self._pool is None:
            return list(columns)
        return [concat_rows(a, b) for a, b in zip(self._pool, columns, strict=True)]
