"""OffsetTracker: the per-partition low watermark of done records, which decides what to commit."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from itertools import pairwise

import numpy as np
import numpy.typing as npt

__all__ = ["OffsetTracker"]

_Offsets = npt.NDArray[np.int64]

# Below any Kafka offset: the floor of a partition that was neither seeded nor registered.
_NO_FLOOR = -(2**63)
# Smallest buffer allocated; a window emptied with a buffer above _KEEP_CAPACITY frees it.
_MIN_CAPACITY = 1024
_KEEP_CAPACITY = 1 << 16


class _Partition:
    """The registered offsets of one partition at or above its commit point.

    ``off[lo:hi]`` is the window: strictly ascending offsets, with ``pend`` True for those
    registered and not done. When the window is not empty its head is pending and is the
    commit point; everything below the head is done (or was never registered). An empty
    window means the point is ``end``: the highest registered offset + 1, or the seed.
    Offsets are appended to the buffers in place (amortised growth), so a block that arrives
    in ascending order above ``end`` costs one slice copy; anything else takes a merge.
    """

    __slots__ = ("end", "hi", "lo", "off", "pend", "registered", "taken")

    def __init__(self) -> None:
        self.off: _Offsets = np.empty(0, dtype=np.int64)
        self.pend: npt.NDArray[np.bool_] = np.empty(0, dtype=np.bool_)
        self.lo = 0
        self.hi = 0
        self.end = _NO_FLOOR
        self.registered = False
        self.taken: int | None = None

    def point(self) -> int:
        return int(self.off[self.lo]) if self.hi > self.lo else self.end

    def in_flight(self) -> int:
        return int(np.count_nonzero(self.pend[self.lo : self.hi]))

    def register(self, offsets: _Offsets) -> None:
        self.registered = True
        if not offsets.size:
            return
        if offsets[0] >= self.end and (
            offsets.size == 1 or bool((offsets[1:] > offsets[:-1]).all())
        ):
            self._append(offsets)
            self.end = int(offsets[-1]) + 1
            return
        # Out of order, duplicated or re-delivered: keep only offsets at or above the point
        # that the window does not hold yet (pending stays pending, done stays done).
        new = np.unique(offsets)
        new = new[new >= self.point()]
        window = self.off[self.lo : self.hi]
        if window.size and new.size:
            pos = np.minimum(np.searchsorted(window, new), window.size - 1)
            new = new[window[pos] != new]
        if not new.size:
            return
        merged = np.concatenate((window, new))
        pending = np.concatenate((self.pend[self.lo : self.hi], np.ones(new.size, np.bool_)))
        order = np.argsort(merged, kind="stable")
        self.off = merged[order]
        self.pend = pending[order]
        self.lo = 0
        self.hi = merged.size
        self.end = max(self.end, int(self.off[-1]) + 1)

    def ack(self, offsets: _Offsets) -> None:
        n = self.hi - self.lo
        if not n or not offsets.size:
            return
        window = self.off[self.lo : self.hi]
        pos = np.minimum(np.searchsorted(window, offsets), n - 1)
        pending = self.pend[self.lo : self.hi]
        pending[pos[window[pos] == offsets]] = False
        if not pending[0]:
            self._advance()

    def extend(self, next_offset: int) -> None:
        """Offsets below ``next_offset`` hold no other record for us (markers, gaps)."""
        self.registered = True
        if next_offset > self.end:
            self.end = next_offset

    def seed(self, next_offset: int) -> None:
        self.taken = next_offset if self.taken is None else max(self.taken, next_offset)
        if next_offset <= self.point():
            return
        self.lo += int(np.searchsorted(self.off[self.lo : self.hi], next_offset))
        self.end = max(self.end, next_offset)
        self._advance()

    def _advance(self) -> None:
        """Move the head to the first pending offset (or empty the window)."""
        pending = self.pend[self.lo : self.hi]
        if pending.size:
            first = int(pending.argmax())
            if pending[first]:
                self.lo += first
                return
        self.lo = self.hi = 0
        if self.off.size > _KEEP_CAPACITY:
            self.off = np.empty(0, dtype=np.int64)
            self.pend = np.empty(0, dtype=np.bool_)

    def _append(self, offsets: _Offsets) -> None:
        k = offsets.size
        if self.hi + k > self.off.size:
            n = self.hi - self.lo
            capacity = max(_MIN_CAPACITY, 2 * (n + k))
            if capacity > self.off.size:
                off = np.empty(capacity, dtype=np.int64)
                pend = np.empty(capacity, dtype=np.bool_)
            else:
                off, pend = self.off, self.pend  # slide the window down (numpy handles overlap)
            off[:n] = self.off[self.lo : self.hi]
            pend[:n] = self.pend[self.lo : self.hi]
            self.off, self.pend, self.lo, self.hi = off, pend, 0, n
        self.off[self.hi : self.hi + k] = offsets
        self.pend[self.hi : self.hi + k] = True
        self.hi += k


def _by_partition(partition: npt.ArrayLike, offset: npt.ArrayLike) -> list[tuple[int, _Offsets]]:
    """Split parallel (partition, offset) columns into per-partition offsets, order kept."""
    parts = np.asarray(partition)
    offs = np.asarray(offset)
    if parts.ndim != 1 or offs.ndim != 1 or parts.shape != offs.shape:
        raise ValueError(
            "partition and offset must be 1-D arrays of equal length, "
            f"got shapes {parts.shape} and {offs.shape}"
        )
    if not parts.size:
        return []
    for name, arr in (("partition", parts), ("offset", offs)):
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    offs = offs.astype(np.int64, copy=False)
    first = parts[0]
    if (parts == first).all():
        return [(int(first), offs)]
    order = np.argsort(parts, kind="stable")
    parts = parts[order]
    offs = offs[order]
    cuts = (np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist()
    bounds = [0, *cuts, parts.size]
    return [(int(parts[a]), offs[a:b]) for a, b in pairwise(bounds)]


class OffsetTracker:
    """Per partition of one topic, the next offset that is safe to commit (a low watermark).

    >>> t = OffsetTracker()
    >>> t.register(np.array([0, 0, 0, 1], np.int32), np.array([10, 11, 12, 7], np.int64))
    >>> t.ack(np.array([0, 1], np.int32), np.array([11, 7], np.int64))
    >>> t.commit_points()
    {0: 10, 1: 8}
    >>> t.ack([0, 0], [10, 12])
    >>> t.take_commit_points(), t.take_commit_points(), t.in_flight()
    ({0: 13, 1: 8}, {}, 0)

    ``register`` records that a block's records entered the pipeline, ``ack`` that records are
    done (trained, dead-lettered or dropped on purpose). The commit point of a partition is
    its lowest registered offset not yet done, or the highest registered offset + 1 when all
    are done (Kafka's "next offset to read"), so out-of-order acks can never commit past an
    untrained record.

    Rules:

    - The point never moves backwards until ``revoke`` forgets the partition. An offset
      registered below the current point (a re-delivery of a record that is already done, or
      a gap offset arriving late) is ignored: it is not in flight and its ack is ignored.
    - An offset is registered once: registering it again while it is pending or after it is
      done changes nothing, so the first ack of any copy makes it done. This keeps the
      at-least-once guarantee (the record was trained once) while a re-delivered copy is
      still in the pipeline; such copies are not counted by ``in_flight``.
    - Acks of offsets that are not registered (unknown partition, a gap, after ``revoke``)
      are ignored.
    - Offsets that were never registered (compaction gaps, transaction markers) do not hold
      the point back.

    Thread-safe: one lock guards all state, and array splitting happens outside it. A
    register that races a ``revoke`` recreates the partition; callers commit only the
    partitions they own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[int, _Partition] = {}

    def register(self, partition: npt.ArrayLike, offset: npt.ArrayLike) -> None:
        """Record that these (partition, offset) records were emitted into the pipeline.

        >>> t = OffsetTracker()
        >>> t.register([3, 3], [100, 101])
        >>> t.commit_points()
        {3: 100}
        """
        groups = _by_partition(partition, offset)
        with self._lock:
            for p, offs in groups:
                state = self._parts.get(p)
                if state is None:
                    state = self._parts[p] = _Partition()
                state.register(offs)

    def ack(self, partition: npt.ArrayLike, offset: npt.ArrayLike) -> None:
        """Mark these records done; unknown ones are ignored.

        >>> t = OffsetTracker()
        >>> t.register([0, 0], [5, 6])
        >>> t.ack([0, 0, 9], [6, 99, 1])
        >>> t.commit_points()
        {0: 5}
        """
        groups = _by_partition(partition, offset)
        with self._lock:
            for p, offs in groups:
                state = self._parts.get(p)
                if state is not None:
                    state.ack(offs)

    def extend(self, ends: Mapping[int, int]) -> None:
        """Per partition, every record below ``ends[p]`` was registered already.

        A consumer's position moves past offsets that hold no record for us: transaction
        commit and abort markers, aborted transactions under read_committed, compacted gaps.
        Once the registered records are done, the commit point is the end, so a partition
        whose log ends with a marker is committed to its log end.

        >>> t = OffsetTracker()
        >>> t.register([0, 0], [10, 11])
        >>> t.extend({0: 13})            # offset 12 is a transaction's commit marker
        >>> t.commit_points()
        {0: 10}
        >>> t.ack([0, 0], [10, 11])
        >>> t.commit_points()
        {0: 13}
        """
        with self._lock:
            for p, end in ends.items():
                state = self._parts.get(int(p))
                if state is None:
                    state = self._parts[int(p)] = _Partition()
                state.extend(int(end))

    def revoke(self, partitions: Iterable[int]) -> dict[int, int]:
        """Forget these partitions; return the commit points of those that had registrations.

        >>> t = OffsetTracker()
        >>> t.register([0, 1], [5, 8])
        >>> t.revoke([1, 2]), t.commit_points()
        ({1: 8}, {0: 5})
        """
        out: dict[int, int] = {}
        with self._lock:
            for p in partitions:
                state = self._parts.pop(int(p), None)
                if state is not None and state.registered:
                    out[int(p)] = state.point()
        return out

    def seed(self, partition: int, next_offset: int) -> None:
        """Start ``partition`` at a known committed offset: nothing below it is reported.

        Offsets below ``next_offset`` count as done, now and when registered later; a seed at
        or below the current point changes nothing. The seed itself is not reported by
        ``take_commit_points`` (it is already committed), nor by ``commit_points`` until the
        partition has a registration.

        >>> t = OffsetTracker()
        >>> t.seed(0, 40)
        >>> t.register([0, 0, 0], [38, 39, 40])
        >>> t.commit_points(), t.in_flight()
        ({0: 40}, 1)
        """
        with self._lock:
            state = self._parts.get(int(partition))
            if state is None:
                state = self._parts[int(partition)] = _Partition()
            state.seed(int(next_offset))

    def commit_points(self) -> dict[int, int]:
        """For each partition with registrations, the next offset to commit."""
        with self._lock:
            return {p: s.point() for p, s in self._items()}

    def take_commit_points(self) -> dict[int, int]:
        """Like ``commit_points``, but only the partitions whose point advanced since last take.

        >>> t = OffsetTracker()
        >>> t.register([0, 1], [5, 8])
        >>> t.take_commit_points()
        {0: 5, 1: 8}
        >>> t.ack([1], [8])
        >>> t.take_commit_points()
        {1: 9}
        """
        out: dict[int, int] = {}
        with self._lock:
            for p, state in self._items():
                point = state.point()
                if state.taken is None or point > state.taken:
                    out[p] = state.taken = point
        return out

    def in_flight(self, partition: int | None = None) -> int:
        """Records registered and not yet done, of one partition or of all."""
        with self._lock:
            if partition is not None:
                state = self._parts.get(int(partition))
                return 0 if state is None else state.in_flight()
            return sum(s.in_flight() for s in self._parts.values())

    def _items(self) -> Iterator[tuple[int, _Partition]]:
        return ((p, s) for p, s in sorted(self._parts.items()) if s.registered)
