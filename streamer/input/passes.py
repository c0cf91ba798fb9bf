"""PassRules: when a pass ends (record budget, clock, idle shards) and a replay's range.

Pure: no TensorFlow, no Kafka; the clock is injected.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from consumers.block import RecordBlock

__all__ = ["PassRules"]


class PassRules:
    """The rules of the passes of one source.

    A pass ends after ``pass_records`` records, after ``pass_seconds``, when a shard saw no
    record for ``idle_timeout_seconds`` (not counting time spent joining the group), or, in a
    replay, when its shard's partitions reached their stop offsets.

    >>> now = [0.0]
    >>> rules = PassRules(pass_records=100, pass_seconds=60.0, idle_timeout_seconds=5.0,
    ...                   clock=lambda: now[0])
    >>> rules.begin(); rules.take(60), rules.take(60), rules.budget_left()
    (True, False, False)
    >>> rules.begin(); now[0] = 61.0; rules.out_of_time()
    True
    """

    def __init__(
        self,
        *,
        pass_records: int | None = None,
        pass_seconds: float | None = None,
        idle_timeout_seconds: float = 10.0,
        stop_offsets: dict[int, int] | None = None,
        start_offsets: dict[int, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pass_records = pass_records
        self.pass_seconds = pass_seconds
        self.idle_timeout_seconds = idle_timeout_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._budget: int | None = None
        self._started = clock()
        #: A replay's end: per partition, the offset it stops before.
        self.stop_offsets = stop_offsets
        self._reached: set[int] = set()
        if stop_offsets is not None:
            start = start_offsets or {}
            self._reached = {p for p, end in stop_offsets.items() if start.get(p, 0) >= end}

    def begin(self) -> None:
        """A new pass: full budget, the clock from now."""
        with self._lock:
            self._budget = self.pass_records
            self._started = self.clock()

    def take(self, n: int) -> bool:
        """Charge ``n`` records to the pass; False once the budget is spent."""
        with self._lock:
            if self._budget is None:
                return True
            self._budget -= n
            return self._budget > 0

    def budget_left(self) -> bool:
        with self._lock:
            return self._budget is None or self._budget > 0

    def out_of_time(self) -> bool:
        return self.pass_seconds is not None and self.clock() - self._started >= self.pass_seconds

    def idle(self, since: float) -> bool:
        return self.clock() - since >= self.idle_timeout_seconds

    # ---- a replay's range ----------------------------------------------------------------------

    @property
    def bounded(self) -> bool:
        return self.stop_offsets is not None

    def reached(self) -> frozenset[int]:
        """The partitions whose stop offset was reached."""
        with self._lock:
            return frozenset(self._reached)

    @property
    def finished(self) -> bool:
        """A bounded run (replay) has emitted every record of its range."""
        if self.stop_offsets is None:
            return False
        with self._lock:
            return self._reached >= set(self.stop_offsets)

    def clip(self, block: RecordBlock) -> RecordBlock | None:
        """Drop the records at or past the stop offsets; note partitions that got there.

        >>> rules = PassRules(stop_offsets={0: 6})
        >>> b = RecordBlock.from_columns("t", [b"a", b"b", b"c"], [0, 0, 0], [4, 5, 6], [0, 0, 0])
        >>> rules.clip(b).offset.tolist(), rules.finished
        ([4, 5], True)
        """
        assert self.stop_offsets is not None
        stops = self.stop_offsets
        limit = np.zeros(len(block), dtype=np.int64)
        for p in np.unique(block.partition):
            limit[block.partition == p] = stops.get(int(p), 0)
        keep = block.offset < limit
        with self._lock:
            for p, nxt in block.next_offsets().items():
                if nxt >= stops.get(p, 0):
                    self._reached.add(p)
        ends = {p: min(e, stops.get(p, 0)) for p, e in block.ends.items()}
        if keep.all() and ends == block.ends:
            return block
        if not keep.any() and not ends:
            return None
        return block.rows(keep, ends)
