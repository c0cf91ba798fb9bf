"""streamer.cluster.padding: fixed-size batches cut from queued blocks, with weight-0 padding,
driven by a fake clock and queue (no waiting). test_multiworker covers the real-time cases."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.cluster.padding import END, Batch, PaddedBatcher, empty_block
from streamer.decode.ragged import Column, RaggedColumn
from streamer.decode.schema import Schema

#: x: fixed [2] float32; tags: ragged int64 [-1]; name: string; y: float32 label.
SCHEMA = Schema.from_dict(
    {
        "label": "y",
        "features": {
            "x": {"dtype": "float32", "shape": [2]},
            "tags": {"dtype": "int64", "shape": [-1]},
            "name": {"dtype": "string"},
            "y": {"dtype": "float32"},
        },
    }
)


def block(offsets: list[int], part: int = 0) -> list[Column]:
    """Rows named by their offset: x = [o, -o], tags = o repeated o % 3 times, name = b"o"."""
    off = np.array(offsets, np.int64)
    lengths = off % 3
    return [
        np.stack([off, -off], axis=1).astype(np.float32),
        RaggedColumn(np.repeat(off, lengths), lengths.astype(np.int64)),
        np.array([str(o).encode() for o in offsets], dtype=object),
        off.astype(np.float32),
        np.full(len(off), part, np.int32),
        off,
        off * 1000,
    ]


def rows(batch: Batch) -> list[tuple[Any, ...]]:
    """Each row of the batch as (x, tags, name, y, partition, offset, timestamp)."""
    x, tags, name, y, part, off, ts = batch.columns
    assert isinstance(tags, RaggedColumn)
    starts = np.concatenate([[0], np.cumsum(tags.row_lengths)])
    return [
        (
            tuple(x[i].tolist()),  # type: ignore[index]
            tags.values[starts[i] : starts[i + 1]].tolist(),
            name[i],  # type: ignore[index]
            float(y[i]),  # type: ignore[index]
            int(part[i]),  # type: ignore[index]
            int(off[i]),  # type: ignore[index]
            int(ts[i]),  # type: ignore[index]
        )
        for i in range(batch.size)
    ]


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeQueue:
    """A queue whose blocking get moves the fake clock instead of waiting: each item arrives
    ``after`` seconds later; with none left, get waits out its timeout and raises Empty."""

    def __init__(self, clock: Clock, items: list[tuple[float, Any]] | None = None) -> None:
        self.clock = clock
        self.items = list(items or [])
        self.calls: list[tuple[str, float | None]] = []

    def get(self, timeout: float | None = None) -> Any:
        assert timeout is not None and timeout > 0, "a blocking get without a deadline"
        self.calls.append(("get", timeout))
        if self.items and self.items[0][0] <= timeout:
            after, item = self.items.pop(0)
            self.clock.now += after
            return item
        self.clock.now += timeout
        if self.items:
            self.items[0] = (self.items[0][0] - timeout, self.items[0][1])
        raise queue.Empty

    def get_nowait(self) -> Any:
        self.calls.append(("nowait", None))
        if self.items and self.items[0][0] <= 0:
            return self.items.pop(0)[1]
        raise queue.Empty


def test_empty_block_has_the_decodes_dtypes_and_inner_shapes() -> None:
    schema = Schema.from_dict(
        {
            "label": "y",
            "features": {
                "img": {"dtype": "uint8", "shape": [3, 2]},
                "pairs": {"dtype": "float16", "shape": [-1, 2]},
                "padded": {"dtype": "int32", "shape": [-1], "pad_to": 4},
                "words": {"dtype": "string", "shape": [-1]},
                "flag": {"dtype": "bool"},
                "y": {"dtype": "float64"},
            },
        }
    )
    img, pairs, padded, words, flag, y, part, off, ts = empty_block(schema)
    assert isinstance(img, np.ndarray) and (img.shape, img.dtype) == ((0, 3, 2), np.uint8)
    for col, inner, dtype in ((pairs, (0, 2), np.float16), (padded, (0,), np.int32)):
        assert isinstance(col, RaggedColumn)
        assert (col.values.shape, col.values.dtype) == (inner, dtype)
        assert (col.row_lengths.shape, col.row_lengths.dtype) == ((0,), np.int64)
    assert isinstance(words, RaggedColumn) and words.values.dtype == object
    assert flag.dtype == np.bool_ and y.dtype == np.float64  # type: ignore[union-attr]
    assert [c.dtype for c in (part, off, ts)] == [np.int32, np.int64, np.int64]  # type: ignore[union-attr]
    assert all(len(c) == 0 for c in (part, off, ts))  # type: ignore[arg-type]


def test_batch_reports_its_size_padding_and_real_rows_metadata() -> None:
    clock = Clock()
    b = PaddedBatcher(SCHEMA, 5, pad_after=1.0, clock=clock)
    batch = b.next(FakeQueue(clock, [(0.0, block([7, 8, 9], part=2)), (0.0, END)]))
    assert (batch.size, batch.real, batch.padded) == (5, 3, 2)
    assert batch.weight.dtype == np.float32 and batch.weight.tolist() == [1, 1, 1, 0, 0]
    part, off, ts = batch.metadata()
    assert (part.tolist(), off.tolist(), ts.tolist()) == ([2, 2, 2], [7, 8, 9], [7000, 8000, 9000])


def test_padding_rows_copy_the_batchs_first_row_with_metadata_minus_one() -> None:
    """A model sees padding like its real inputs (a copy, ragged row and string included);
    the metadata of padding is -1 so it can never be taken for a record."""
    clock = Clock()
    b = PaddedBatcher(SCHEMA, 4, pad_after=1.0, clock=clock)
    got = rows(b.next(FakeQueue(clock, [(0.0, block([5, 6])), (0.0, END)])))
    first = got[0]
    assert got[:2] == [
        ((5.0, -5.0), [5, 5], b"5", 5.0, 0, 5, 5000),
        ((6.0, -6.0), [], b"6", 6.0, 0, 6, 6000),
    ]
    assert got[2:] == [(*first[:4], -1, -1, -1)] * 2


def test_a_batch_with_no_record_copies_a_row_of_the_last_batch_that_had_some() -> None:
    clock = Clock()
    b = PaddedBatcher(SCHEMA, 2, pad_after=1.0, clock=clock)
    b.next(FakeQueue(clock, [(0.0, block([4, 5]))]))
    empty = b.next(FakeQueue(clock))
    assert empty.real == 0 and not empty.weight.any()
    assert rows(empty) == [((4.0, -4.0), [4], b"4", 4.0, -1, -1, -1)] * 2


def test_before_any_record_padding_is_zeros_empty_strings_and_empty_rows() -> None:
    clock = Clock()
    batch = PaddedBatcher(SCHEMA, 3, pad_after=1.0, clock=clock).next(FakeQueue(clock))
    assert rows(batch) == [((0.0, 0.0), [], b"", 0.0, -1, -1, -1)] * 3
    x, tags, *_ = batch.columns
    assert x.dtype == np.float32 and isinstance(tags, RaggedColumn)  # type: ignore[union-attr]
    assert tags.values.dtype == np.int64 and tags.row_lengths.dtype == np.int64


def test_the_idle_window_counts_from_the_call_not_from_each_block() -> None:
    """Blocks trickling in never stretch the wait: each get waits only what is left of the
    window, and the batch goes out padded when it is over."""
    clock = Clock(100.0)
    q = FakeQueue(clock, [(0.3, block([1])), (0.1, block([2])), (5.0, block([3]))])
    b = PaddedBatcher(SCHEMA, 8, pad_after=0.5, clock=clock)
    batch = b.next(q)
    assert [round(t, 6) for kind, t in q.calls if kind == "get"] == [0.5, 0.2, 0.1]
    assert batch.real == 2 and batch.waited == pytest.approx(0.5)
    assert clock.now == pytest.approx(100.5)
    assert len(q.items) == 1  # the late block stays queued for the next batch


def test_without_waiting_only_what_is_queued_now_is_taken() -> None:
    """wait=False (other workers are full): never a blocking get, not even with time left."""
    clock = Clock()
    q = FakeQueue(clock, [(0.0, block([1, 2])), (0.0, block([3])), (0.2, block([4]))])
    batch = PaddedBatcher(SCHEMA, 8, pad_after=10.0, clock=clock).next(q, wait=False)
    assert [kind for kind, _ in q.calls] == ["nowait"] * 3
    assert batch.metadata()[1].tolist() == [1, 2, 3] and batch.waited == 0.0


def test_a_full_carry_reads_nothing_from_the_queue() -> None:
    """Rows left over from a big block make the next batch without touching the input."""
    clock = Clock()
    b = PaddedBatcher(SCHEMA, 2, pad_after=1.0, clock=clock)
    b.next(FakeQueue(clock, [(0.0, block([1, 2, 3, 4, 5]))]))
    assert b.pending == 3
    q = FakeQueue(clock, [(0.0, block([9]))])
    batch = b.next(q)
    assert q.calls == [] and batch.metadata()[1].tolist() == [3, 4] and b.pending == 1


def test_blocks_without_rows_are_skipped() -> None:
    """An empty block (every record rejected) adds nothing and does not end the batch."""
    clock = Clock()
    q = FakeQueue(clock, [(0.0, block([])), (0.0, block([1])), (0.0, block([])), (0.0, END)])
    b = PaddedBatcher(SCHEMA, 3, pad_after=1.0, clock=clock)
    batch = b.next(q)
    assert batch.real == 1 and b.ended and b.pending == 0
    assert rows(batch)[0] == ((1.0, -1.0), [1], b"1", 1.0, 0, 1, 1000)


def test_after_the_end_the_queue_is_not_read_again() -> None:
    """END is the input's last word: later batches are padding at once, and anything put on
    the queue after it is never read."""
    clock = Clock()
    b = PaddedBatcher(SCHEMA, 4, pad_after=1.0, clock=clock)
    last = b.next(FakeQueue(clock, [(0.0, block([1, 2, 3])), (0.0, END)]))
    assert last.real == 3 and b.ended
    q = FakeQueue(clock, [(0.0, block([7]))])
    after = b.next(q)
    assert (after.real, after.waited, q.calls) == (0, 0.0, [])
    assert after.metadata()[1].tolist() == [] and len(q.items) == 1


def test_an_error_on_the_queue_is_raised_and_the_rows_before_it_are_kept() -> None:
    clock = Clock()
    b = PaddedBatcher(SCHEMA, 4, pad_after=1.0, clock=clock)
    q = FakeQueue(clock, [(0.0, block([1, 2])), (0.0, KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt):
        b.next(q)
    assert b.pending == 2
    assert b.next(FakeQueue(clock, [(0.0, END)])).metadata()[1].tolist() == [1, 2]


def rows_of(o: int) -> tuple[Any, ...]:
    """The row ``block`` makes for offset ``o``, as ``rows`` reads it back."""
    return ((float(o), float(-o)), [o] * (o % 3), str(o).encode(), float(o), 0, o, o * 1000)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=12), st.integers(1, 7))
def test_every_row_comes_out_once_in_order_in_batches_of_exactly_batch_size(
    sizes: list[int], batch_size: int
) -> None:
    """Whatever the blocks: every batch has batch_size rows, real ones first; the real rows,
    batch after batch, are the input's rows in order, each whole (its ragged and string
    values with it); after the end, batches are all padding."""
    q: queue.Queue[Any] = queue.Queue()
    offsets: list[int] = []
    for n in sizes:
        q.put(block(list(range(len(offsets), len(offsets) + n))))
        offsets += range(len(offsets), len(offsets) + n)
    q.put(END)
    b = PaddedBatcher(SCHEMA, batch_size, pad_after=0.0)  # no window: nothing ever waits
    out: list[tuple[Any, ...]] = []
    for _ in range(len(offsets) // batch_size + 2):
        batch = b.next(q)
        assert batch.size == batch_size and batch.real + batch.padded == batch_size
        assert batch.weight.tolist() == [1.0] * batch.real + [0.0] * batch.padded
        got = rows(batch)
        assert all(r[4:] == (-1, -1, -1) for r in got[batch.real :])
        out += got[: batch.real]
    assert b.ended and b.pending == 0 and q.empty()
    assert out == [rows_of(o) for o in offsets]
