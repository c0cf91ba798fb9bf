"""Coverage: per partition, how far records were handed over, and where a consumer's position
moved past them (transaction markers, aborted transactions, compacted gaps). Pure."""

from __future__ import annotations

__all__ = ["Coverage"]


class Coverage:
    """What a shard handed over per partition since it was assigned or sought.

    ``ends`` returns the partitions whose consumer position moved past the records handed
    over: offsets no record fills for us. Every record below such an end was handed over, so
    once those are done the commit point may move to it. The first position seen after an
    assignment or a seek only marks where the partition starts.

    >>> c = Coverage()
    >>> c.ends({}, {0: 10})            # first sight after an assignment: where it starts
    {}
    >>> c.ends({0: 15}, {0: 15})       # records 10..14, position right after them
    {}
    >>> c.ends({}, {0: 17})            # the position moved past two markers
    {0: 17}
    >>> c.ends({0: 20}, {0: 21})       # records 17..19 and a marker at 20
    {0: 21}
    """

    def __init__(self) -> None:
        self._covered: dict[int, int] = {}

    def ends(self, last: dict[int, int], positions: dict[int, int]) -> dict[int, int]:
        """``last``: per partition, the next offset after the records handed over now;
        ``positions``: the consumer's positions now."""
        out: dict[int, int] = {}
        for p in set(last) | set(positions):
            pos = positions.get(p)
            known = [x for x in (self._covered.get(p), last.get(p)) if x is not None]
            if not known:
                if pos is not None:
                    self._covered[p] = pos
                continue
            covered = max(known)
            if pos is not None and pos > covered:
                out[p] = covered = pos
            self._covered[p] = covered
        return out

    def forget(self, partition: int) -> None:
        """Assigned anew, sought or revoked: start over."""
        self._covered.pop(partition, None)

    def clear(self) -> None:
        self._covered.clear()
