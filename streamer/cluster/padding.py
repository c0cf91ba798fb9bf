"""PaddedBatcher: fixed-size batches that never wait longer than the idle window; the rows that
did not come are weight-0 padding.

Pure (numpy only, no TensorFlow) so that it is tested alone. The input is a queue of decoded
blocks: lists of ``Column`` (the schema's features in order, then ``partition``, ``offset``,
``timestamp``), the decode's own layout; an item may also be ``END`` (the input ran out) or
an exception (raised here).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from streamer.decode.ragged import Column, RaggedColumn, mask_rows, num_rows, take_rows
from streamer.decode.schema import Schema

__all__ = ["END", "Batch", "PaddedBatcher", "empty_block"]

#: Put on the queue when the input ran out (a replay's range is done).
END: Final = "end"

Block = list[Column]


@dataclass(frozen=True, slots=True)
class Batch:
    """``size`` rows: the first ``real`` are records, the rest padding (weight 0, partition
    and offset -1). ``columns`` follow the decode's layout; ``weight`` is float32."""

    columns: Block
    real: int
    weight: npt.NDArray[np.float32]
    waited: float  # seconds spent waiting for input

    @property
    def size(self) -> int:
        return len(self.weight)

    @property
    def padded(self) -> int:
        return self.size - self.real

    def metadata(self) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]:
        """partition, offset, timestamp of the real rows."""
        part, off, ts = self.columns[-3:]
        assert isinstance(part, np.ndarray) and isinstance(off, np.ndarray)
        assert isinstance(ts, np.ndarray)
        return part[: self.real], off[: self.real], ts[: self.real]


def empty_block(schema: Schema) -> Block:
    """A block of no rows with the decode's dtypes and inner shapes (the padding source before
    any record came).

    >>> from streamer.input.simulator import SimulatorTask
    >>> [c.shape for c in empty_block(SimulatorTask().schema())]
    [(0, 16), (0,), (0,), (0,), (0,)]
    """
    out: Block = []
    for f in schema.features:
        dtype = object if f.is_string else f.dtype
        if f.is_variable:
            out.append(RaggedColumn(np.zeros((0, *f.inner_shape), dtype), np.zeros(0, np.int64)))
        else:
            out.append(np.zeros((0, *f.shape), dtype))
    out += [np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)]
    return out


def _head(column: Column, n: int) -> Column:
    if isinstance(column, RaggedColumn):
        keep = np.arange(num_rows(column)) < n
        return mask_rows(column, keep)
    return column[:n]


def _tail(column: Column, n: int) -> Column:
    if isinstance(column, RaggedColumn):
        keep = np.arange(num_rows(column)) >= n
        return mask_rows(column, keep)
    return column[n:]


def _concat(columns: Sequence[Column]) -> Column:
    first = columns[0]
    if len(columns) == 1:
        return first
    if isinstance(first, RaggedColumn):
        ragged = [c for c in columns if isinstance(c, RaggedColumn)]
        return RaggedColumn(
            np.concatenate([c.values for c in ragged]),
            np.concatenate([c.row_lengths for c in ragged]),
        )
    return np.concatenate([c for c in columns if isinstance(c, np.ndarray)])


def _zeros_like_rows(column: Column, n: int) -> Column:
    """``n`` zero rows ("" for strings, no rows for a ragged feature) of ``column``'s kind."""
    if isinstance(column, RaggedColumn):
        return RaggedColumn(column.values[:0], np.zeros(n, np.int64))
    fill: Any = b"" if column.dtype == object else 0
    return np.full((n, *column.shape[1:]), fill, dtype=column.dtype)


class PaddedBatcher:
    """Cuts the input into batches of exactly ``batch_size`` rows, padding what is missing.

    ``next(blocks, wait=True)`` takes blocks from the queue until the batch is full, or the
    idle window (``pad_after`` seconds from the call) passes, or the input ended; the rest of
    the batch is padding: copies of a real row (the first of this batch, else the first of the
    last batch that had one; zeros before any), so that a model sees inputs like its real ones,
    with weight 0. Rows beyond the batch are kept for the next one. With ``wait=False`` (the
    other workers have full batches waiting: nobody gains from this worker waiting) it takes
    only what is queued now.

    >>> q = queue.Queue(); from streamer.input.simulator import SimulatorTask
    >>> b = PaddedBatcher(SimulatorTask().schema(), 4, pad_after=0.01)
    >>> batch = b.next(q)
    >>> batch.real, batch.weight.tolist(), batch.columns[-2].tolist()
    (0, [0.0, 0.0, 0.0, 0.0], [-1, -1, -1, -1])
    """

    def __init__(
        self,
        schema: Schema,
        batch_size: int,
        *,
        pad_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch_size = batch_size
        self.pad_after = pad_after
        self._clock = clock
        self._carry: list[Block] = []
        self._carried = 0
        self._template: Block = empty_block(schema)  # one row to copy as padding (or none)
        self.ended = False

    @property
    def pending(self) -> int:
        """Rows taken from the input and not handed out yet."""
        return self._carried

    def next(self, blocks: queue.Queue[Any], *, wait: bool = True) -> Batch:
        want = self.batch_size
        start = self._clock()
        deadline = start + (self.pad_after if wait else 0.0)
        while self._carried < want and not self.ended:
            timeout = deadline - self._clock()
            try:
                item = blocks.get(timeout=timeout) if timeout > 0 else blocks.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, str) and item == END:
                self.ended = True
                break
            n = num_rows(item[-1])
            if n:
                self._carry.append(item)
                self._carried += n
        waited = self._clock() - start
        return self._cut(want, waited)

    def _cut(self, want: int, waited: float) -> Batch:
        real = min(want, self._carried)
        if real:
            joined = [_concat(cols) for cols in zip(*self._carry, strict=True)]
            taken = [_head(c, real) for c in joined]
            rest = self._carried - real
            self._carry = [[_tail(c, real) for c in joined]] if rest else []
            self._carried = rest
            self._template = [_head(c, 1) for c in taken]
        else:
            taken = [_head(c, 0) for c in self._template]
        pad = want - real
        if pad:
            if num_rows(self._template[-1]):
                fill: list[Column] = [
                    take_rows(c, np.zeros(pad, np.int64)) for c in self._template[:-3]
                ]
            else:
                fill = [_zeros_like_rows(c, pad) for c in self._template[:-3]]
            meta: list[Column] = [
                np.full(pad, -1, np.int32),
                np.full(pad, -1, np.int64),
                np.full(pad, -1, np.int64),
            ]
            taken = [_concat([a, b]) for a, b in zip(taken, [*fill, *meta], strict=True)]
        weight = np.zeros(want, np.float32)
        weight[:real] = 1.0
        return Batch(taken, real, weight, waited)
