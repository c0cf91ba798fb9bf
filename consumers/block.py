"""RecordBlock: the unit that moves from Kafka into tf.data (many records, column arrays)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Original", "Prepared", "RecordBlock"]


@dataclass(frozen=True, slots=True)
class Original:
    """One record as its producer wrote it: what a block does not carry (the hot path moves
    values only; a dead letter is read back whole: ``RecordReader``). ``value`` is None for a
    tombstone; ``headers`` are (name, bytes) pairs; ``timestamp`` in ms."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int


class Prepared(Protocol):
    """What an owner made of a block's values where they were polled (a shard child decodes
    its own blocks: the owner's ``prepare``); it travels instead of the values.

    ``needs_values``: the rows whose raw values the owner still wants (a decoder's rejects,
    for the dead-letter topic and the log); ``select(keep)``: the same for the rows where
    ``keep`` is True (a revocation drops the rows of partitions that moved).
    """

    needs_values: list[int]

    def select(self, keep: npt.NDArray[np.bool_]) -> Prepared: ...


@dataclass(frozen=True, slots=True)
class RecordBlock:
    """Values of many records of one topic with their partition, offset and timestamp columns.

    >>> b = RecordBlock.from_columns("t", [b"a", b"b"], [0, 0], [5, 6], [1000, 1001])
    >>> len(b), b.next_offsets()
    (2, {0: 7})

    ``ends`` carries, per partition, the consumer's position after the poll when it is past
    the block's last record: offsets that hold no record for us (transaction commit and abort
    markers, aborted transactions under ``read_committed``, compacted-away records). Every
    offset of such a partition below its end was in this block or an earlier block of the
    same shard, so once those are done the commit point may move to the end. A block may hold
    ends and no record at all (a poll that only passed markers).

    >>> gap = RecordBlock.from_columns("t", [], [], [], [], ends={0: 9})
    >>> len(gap), gap.partitions(), gap.next_offsets()
    (0, [0], {0: 9})
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
    #: Per partition, the consumer's position after this block where it is past the block's
    #: last record (see the class docstring); empty in the common case.
    ends: dict[int, int] = field(default_factory=dict)
    #: What the owner's ``prepare`` made of the values in the shard's process (``Prepared``);
    #: then ``values`` holds only the rows it still needs (the others are ``b""``).
    prepared: Any = None
    #: The owner's table of its partitions' assignments when it claimed the block (its
    #: hand-over filter drops rows of an assignment that ended: streamer.input.handover).
    epochs: Any = None

    @classmethod
    def from_columns(
        cls,
        topic: str,
        values: list[bytes],
        partition: list[int] | npt.NDArray[np.int32],
        offset: list[int] | npt.NDArray[np.int64],
        timestamp_ms: list[int] | npt.NDArray[np.int64],
        serial: int = 0,
        ends: dict[int, int] | None = None,
    ) -> RecordBlock:
        return cls(
            topic=topic,
            values=values,
            partition=np.asarray(partition, dtype=np.int32),
            offset=np.asarray(offset, dtype=np.int64),
            timestamp_ms=np.asarray(timestamp_ms, dtype=np.int64),
            nbytes=sum(len(v) for v in values),
            serial=serial,
            ends=dict(ends or {}),
        )

    def __len__(self) -> int:
        return len(self.values)

    def partitions(self) -> list[int]:
        """The partitions this block has records or an end of."""
        return sorted({int(p) for p in np.unique(self.partition)} | set(self.ends))

    def next_offsets(self) -> dict[int, int]:
        """Per partition, the offset after the last record in this block (or its end)."""
        out: dict[int, int] = dict(self.ends)
        for p in np.unique(self.partition):
            last = int(self.offset[self.partition == p].max()) + 1
            out[int(p)] = max(last, out.get(int(p), last))
        return out

    def without_partitions(self, revoked: set[int]) -> RecordBlock | None:
        """This block less the records and ends of ``revoked`` partitions (None when nothing
        is left)."""
        if not revoked:
            return self
        keep = ~np.isin(self.partition, np.fromiter(revoked, dtype=np.int32))
        ends = {p: e for p, e in self.ends.items() if p not in revoked}
        if keep.all() and len(ends) == len(self.ends):
            return self
        if not keep.any() and not ends:
            return None
        return self.rows(keep, ends)

    def rows(self, keep: npt.NDArray[np.bool_], ends: dict[int, int]) -> RecordBlock:
        """This block's records where ``keep`` is True, with ``ends`` (a prepared block's
        preparation is selected alike; its byte count, of values that did not travel, is
        scaled to the rows kept)."""
        idx = np.flatnonzero(keep)
        out = RecordBlock.from_columns(
            self.topic,
            [self.values[i] for i in idx],
            self.partition[idx],
            self.offset[idx],
            self.timestamp_ms[idx],
            self.serial,
            ends,
        )
        if self.prepared is None:
            return out
        nbytes = self.nbytes * len(idx) // max(len(self), 1)
        return dataclasses.replace(out, nbytes=nbytes, prepared=self.prepared.select(keep))
