"""NonFiniteSteps: steps whose loss or gradients were not finite, their batches and the limit.

Pure (numpy only). A skipped step's update was never applied (``streamer.train.trainer``). Its records
are held, not acknowledged: when a later step is applied they count as done (a lone bad batch
does not stop the stream; the log line names its partitions and offsets for a replay), and
when ``limit`` steps in a row are skipped the model is diverging: the worker stops without
acknowledging them, so the commit point stays below them and a fixed restart trains them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["NonFiniteSteps", "describe_offsets"]


def describe_offsets(partition: npt.NDArray[np.integer], offset: npt.NDArray[np.integer]) -> str:
    """Each partition's offset range in a batch, as ``p:first-last``.

    >>> describe_offsets(np.array([1, 0, 1, 1]), np.array([7, 3, 5, 9]))
    '0:3-3 1:5-9'
    """
    parts = []
    for p in np.unique(partition):
        rows = offset[partition == p]
        parts.append(f"{int(p)}:{int(rows.min())}-{int(rows.max())}")
    return " ".join(parts)


@dataclass
class NonFiniteSteps:
    """The current run of skipped steps and the batches they held.

    >>> guard = NonFiniteSteps(limit=2)
    >>> guard.skipped(np.array([0]), np.array([5]))
    False
    >>> [o.tolist() for _, o in guard.applied()]     # a good step: the held batch is done
    [[5]]
    >>> guard.skipped(np.array([0]), np.array([6])), guard.skipped(np.array([0]), np.array([7]))
    (False, True)
    """

    limit: int
    total: int = 0
    in_a_row: int = 0
    _held: list[tuple[npt.NDArray[np.integer], npt.NDArray[np.integer]]] = field(
        default_factory=list
    )

    def skipped(self, partition: npt.NDArray[np.integer], offset: npt.NDArray[np.integer]) -> bool:
        """Count a skipped step and hold its batch; True when the limit is reached."""
        self.total += 1
        self.in_a_row += 1
        self._held.append((partition, offset))
        return self.in_a_row >= self.limit

    def applied(self) -> list[tuple[npt.NDArray[np.integer], npt.NDArray[np.integer]]]:
        """A step was applied: the run ends; returns the held batches (now done)."""
        held, self._held = self._held, []
        self.in_a_row = 0
        return held

    @property
    def held_records(self) -> int:
        return sum(len(o) for _, o in self._held)
