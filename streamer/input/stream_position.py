"""StreamPosition: the stream position's one home: where the run started, what was committed,
and what is done now."""

from __future__ import annotations

import threading

__all__ = ["StreamPosition"]


class StreamPosition:
    """Per partition, the next offset to read, from three sources in order of recency.

    ``restored``: where this run started (a checkpoint's offsets); ``committed``: what was
    committed since (kept across passes, whose trackers start empty); the tracker's commit
    points: what is done now. Checkpoints and exports save ``current()``; the embedded
    simulator's shards start from it.

    >>> pos = StreamPosition({0: 100, 1: 50})
    >>> pos.commit({0: 120})
    >>> pos.current({1: 60})
    {0: 120, 1: 60}
    >>> StreamPosition({0: 7}).current()
    {0: 7}
    """

    def __init__(self, restored: dict[int, int] | None = None) -> None:
        self._lock = threading.Lock()
        self._restored = dict(restored or {})
        self._known: dict[int, int] = {}  # committed since, or done

    @property
    def restored(self) -> dict[int, int]:
        """Where this run started (empty without a checkpoint, or when it did not apply)."""
        with self._lock:
            return dict(self._restored)

    def commit(self, points: dict[int, int]) -> None:
        """These points were sent to Kafka."""
        with self._lock:
            self._known.update(points)

    def roll_back(self, positions: dict[int, int]) -> None:
        """The model went back to a checkpoint with these positions: they are all that is
        known now (what was committed since is in the checkpoint, or ahead of it nowhere)."""
        with self._lock:
            self._restored = {}
            self._known = dict(positions)

    def current(self, done: dict[int, int] | None = None) -> dict[int, int]:
        """Every partition's position: what is known, overlaid with ``done`` (the tracker's
        commit points now), which becomes known."""
        with self._lock:
            self._known.update(done or {})
            return {**self._restored, **self._known}
