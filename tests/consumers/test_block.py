"""RecordBlock: columns, ends (offsets past the records: transaction markers), and the process
shard's wire format for blocks (consumers/ring.py: a header and out-of-band buffers)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from consumers.block import RecordBlock
from consumers.ring import RingReader, RingSpec, RingWriter, pack_block


def _block(ends: dict[int, int] | None = None) -> RecordBlock:
    return RecordBlock.from_columns(
        "t", [b"a", b"bb", b"", b"dddd"], [0, 1, 0, 1], [5, 7, 6, 8], [10, 11, 12, 13], 3, ends
    )


def test_next_offsets_take_the_ends_past_the_records() -> None:
    assert _block().next_offsets() == {0: 7, 1: 9}
    # Partition 1's position passed a commit marker at 9; partition 2 only passed markers.
    block = _block({1: 10, 2: 4})
    assert block.next_offsets() == {0: 7, 1: 10, 2: 4}
    assert block.partitions() == [0, 1, 2]


def _round_trip(block: RecordBlock) -> tuple[bytes, RecordBlock]:
    """Through a real ring (both sides in this process): the message and the block back."""
    reader = RingReader(4, 1 << 20)
    spec = reader.spec  # the child's copies of the descriptors, as a spawn would make them
    writer = RingWriter(RingSpec(os.dup(spec.memfd), os.dup(spec.free_fd), 4, 1 << 20))
    reader.after_start()
    try:
        message = writer.message(block, lambda: False)
        assert message is not None
        return message, reader.block(message)[0]
    finally:
        writer.close()
        reader.close()


def test_without_partitions_drops_records_and_ends() -> None:
    block = _block({1: 10, 2: 4})
    rest = block.without_partitions({1})
    assert rest is not None
    assert rest.offset.tolist() == [5, 6] and rest.ends == {2: 4} and rest.serial == 3
    only_ends = block.without_partitions({0, 1})
    assert only_ends is not None and len(only_ends) == 0 and only_ends.ends == {2: 4}
    assert block.without_partitions({0, 1, 2}) is None
    assert block.without_partitions({9}) is block


def test_the_pipe_format_round_trips_every_block() -> None:
    for block in (
        _block(),
        _block({1: 10}),
        RecordBlock.from_columns(
            "t", [], [], [], [], 2, {0: 12}
        ),  # a poll that only passed markers
        RecordBlock.from_columns("t", [b"x" * 100_000], [3], [2**40], [-1]),
    ):
        _, back = _round_trip(block)
        assert back.values == block.values
        for col in ("partition", "offset", "timestamp_ms"):
            np.testing.assert_array_equal(getattr(back, col), getattr(block, col))
            assert getattr(back, col).dtype == getattr(block, col).dtype
        assert (back.topic, back.serial, back.ends, back.nbytes) == (
            block.topic,
            block.serial,
            block.ends,
            block.nbytes,
        )


class _Prepared:
    """A stand-in for the owner's decode: keeps the rows it was given, wants row values."""

    def __init__(self, rows: list[int], needs: list[int]) -> None:
        self.rows = rows
        self.needs_values = needs

    def select(self, keep: np.ndarray) -> _Prepared:
        kept = [r for r, k in zip(self.rows, keep, strict=True) if k]
        renumber = np.cumsum(keep) - 1
        return _Prepared(kept, [int(renumber[i]) for i in self.needs_values if keep[i]])


def test_a_prepared_block_travels_without_the_values_its_owner_does_not_need() -> None:
    block = RecordBlock.from_columns("t", [b"aaa", b"bad", b"ccc"], [0, 1, 0], [5, 9, 6], [1, 2, 3])
    block = dataclasses.replace(block, prepared=_Prepared([0, 1, 2], needs=[1]))
    header, buffers = pack_block(block)
    wire = header + b"".join(bytes(b) for b in buffers)
    assert b"aaa" not in wire and b"bad" in wire
    _, back = _round_trip(block)
    assert back.values == [b"", b"bad", b""] and back.nbytes == block.nbytes
    assert back.offset.tolist() == [5, 9, 6] and back.prepared.needs_values == [1]
    # A revocation keeps the prepared part in step with the rows.
    rest = back.without_partitions({1})
    assert rest is not None and rest.prepared.rows == [0, 2] and rest.prepared.needs_values == []
