"""RejectBreaker: stop before a wrong schema or a bad producer deploy eats the topic.

Pure (no Kafka, no TensorFlow). The decoder's verdicts over the last ``window_records``
records (block by block) are counted; when more than ``max_fraction`` of them were rejected
(and at least ``min_records`` were seen) the breaker trips and stays tripped. Until a rejected
record has been judged -- ``window_records`` later records came and the breaker did not trip,
or a pass ended with the breaker closed -- commits stay below it (``caps``), so a trip loses
nothing: the worker stops, and once the schema or the producer is fixed, a restart decodes
those records again.

Why 0.5 of 1,000 by default: a wrong schema rejects every record and a bad deploy of the main
producer most of them, which trips within the first block; sporadic corruption (a record in a
thousand, or a burst of a few hundred among good ones) never does and keeps going to the
dead-letter topic. Kafka Connect's default (``errors.tolerance=none``) stops at the first bad
record; a stream of real producers needs some tolerance, but not for everything.
"""

from __future__ import annotations

import collections
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_FRACTION", "MIN_RECORDS", "WINDOW_RECORDS", "RejectBreaker", "capped"]

DEFAULT_MAX_FRACTION = 0.5
WINDOW_RECORDS = 1000
MIN_RECORDS = 20


@dataclass(frozen=True, slots=True)
class _Block:
    records: int
    rejected: tuple[tuple[int, int, str], ...]  # (partition, offset, reason)


class RejectBreaker:
    """Trips when the rejected share of the last records passes ``max_fraction``.

    >>> b = RejectBreaker(0.5, window_records=100, min_records=10)
    >>> b.observe(10, [(0, 5, "shape")])                  # 1 in 10: fine
    False
    >>> b.caps()                                          # not judged yet: commit below it
    {0: 5}
    >>> b.observe(10, [(0, o, "shape") for o in range(10, 20)])   # 11 in 20
    True
    >>> b.summary()
    '11 of the last 20 records were rejected (more than 0.5); most often for shape (11)'
    """

    def __init__(
        self,
        max_fraction: float = DEFAULT_MAX_FRACTION,
        *,
        window_records: int = WINDOW_RECORDS,
        min_records: int = MIN_RECORDS,
    ) -> None:
        self.max_fraction = max_fraction
        self.window_records = window_records
        self.min_records = min_records
        self._lock = threading.Lock()
        self._window: collections.deque[_Block] = collections.deque()
        self._records = 0
        self._rejected = 0
        self.tripped = False

    @property
    def enabled(self) -> bool:
        return self.max_fraction < 1.0

    def observe(self, records: int, rejected: Sequence[tuple[int, int, str]]) -> bool:
        """Count one decoded block; True when this block trips the breaker."""
        if not self.enabled or not records:
            return False
        with self._lock:
            self._window.append(_Block(records, tuple(rejected)))
            self._records += records
            self._rejected += len(rejected)
            if self.tripped:
                return False  # tripped: keep every reject (their commits stay held)
            while self._window and self._records - self._window[0].records >= self.window_records:
                old = self._window.popleft()  # judged: the breaker did not trip over it
                self._records -= old.records
                self._rejected -= len(old.rejected)
            over = self._rejected > self.max_fraction * self._records
            if self._records >= self.min_records and over:
                self.tripped = True
                return True
            return False

    def undecided(self) -> bool:
        """Fewer than ``min_records`` seen and not tripped: a reject now cannot be judged yet
        (a first block of a few records all rejected may be a wrong schema)."""
        with self._lock:
            return self.enabled and not self.tripped and self._records < self.min_records

    def settle(self) -> None:
        """A pass ended with the breaker closed: the records seen so far are judged."""
        with self._lock:
            if not self.tripped:
                self._window.clear()
                self._records = self._rejected = 0

    def caps(self) -> dict[int, int]:
        """Per partition, the lowest rejected offset not judged yet: commit no further."""
        out: dict[int, int] = {}
        with self._lock:
            for block in self._window:
                for p, o, _ in block.rejected:
                    if o < out.get(p, o + 1):
                        out[p] = o
        return out

    def summary(self) -> str:
        with self._lock:
            reasons = Counter(r for b in self._window for _, _, r in b.rejected)
            records, rejected = self._records, self._rejected
        common = ", ".join(f"{r} ({n})" for r, n in reasons.most_common(3))
        return (
            f"{rejected} of the last {records} records were rejected (more than "
            f"{self.max_fraction:g}); most often for {common}"
        )


def capped(points: dict[int, int], caps: dict[int, int]) -> dict[int, int]:
    """Commit points no higher than the caps.

    >>> capped({0: 50, 1: 9}, {0: 12})
    {0: 12, 1: 9}
    """
    return {p: min(o, caps[p]) if p in caps else o for p, o in points.items()}
