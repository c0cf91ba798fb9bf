"""RecordBlock: the unit that moves from Kafka into tf.data (many records, column arrays)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["RecordBlock"]


@dataclass(frozen=True, slots=True)
class RecordBlock:
    """Values of many records of one topic with their partition, offset and timestamp columns.

    >>> b = RecordBlock.from_columns("t", [b"a", b"b"], [0, 0], [5, 6], [1000, 1001])
    >>> len(b), b.next_offsets()
    (2, {0: 7})
    """

    topic: str
    values: list[bytes]
    partition: npt.NDArray[np.int32]
    offset: npt.NDArray[np.int64]
    timestamp_ms: npt.NDArray[np.int64]
    nbytes: int = field(default=0)
    #: The emitting shard's assignment serial (consumers.Shard.serial) when it was polled:
    #: a block polled before a rebalance is told apart from one polled after it.
    serial: int = field(default=0)

    @classmethod
    def from_columns(
        cls,
        topic: str,
        values: list[bytes],
        partition: list[int] | npt.NDArray[np.int32],
        offset: list[int] | npt.NDArray[np.int64],
        timestamp_ms: list[int] | npt.NDArray[np.int64],
        serial: int = 0,
    ) -> RecordBlock:
        return cls(
            topic=topic,
            values=values,
            partition=np.asarray(partition, dtype=np.int32),
            offset=np.asarray(offset, dtype=np.int64),
            timestamp_ms=np.asarray(timestamp_ms, dtype=np.int64),
            nbytes=sum(len(v) for v in values),
            serial=serial,
        )

    def __len__(self) -> int:
        return len(self.values)

    def partitions(self) -> list[int]:
        return sorted({int(p) for p in np.unique(self.partition)})

    def next_offsets(self) -> dict[int, int]:
        """Per partition, the offset after the last record in this block."""
        out: dict[int, int] = {}
        for p in np.unique(self.partition):
            out[int(p)] = int(self.offset[self.partition == p].max()) + 1
        return out

    def without_partitions(self, revoked: set[int]) -> RecordBlock | None:
        """This block less the records of ``revoked`` partitions (None when nothing is left)."""
        if not revoked:
            return self
        keep = ~np.isin(self.partition, np.fromiter(revoked, dtype=np.int32))
        if keep.all():
            return self
        if not keep.any():
            return None
        idx = np.flatnonzero(keep)
        return RecordBlock.from_columns(
            self.topic,
            [self.values[i] for i in idx],
            self.partition[idx],
            self.offset[idx],
            self.timestamp_ms[idx],
            self.serial,
        )
