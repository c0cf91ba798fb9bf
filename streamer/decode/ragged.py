"""Columns of rows with numpy: ragged ones as (flat values, row lengths), taken and joined whole.

A decoded column is either a numpy array with one row per record, or a ``RaggedColumn``: the
rows of every record laid end to end in ``values`` and how many belong to each record in
``row_lengths`` (int64), which is what ``tf.RaggedTensor.from_row_lengths`` takes. The helpers
here select, join and count rows of either kind with a few numpy calls, never a Python loop
over records, so the shuffle window and the source treat both alike.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "Column",
    "RaggedColumn",
    "concat_rows",
    "empty_rows",
    "mask_rows",
    "num_rows",
    "take_rows",
]


class RaggedColumn(NamedTuple):
    """Variable-length rows: ``values[starts[i] : starts[i] + row_lengths[i]]`` is record i's.

    >>> col = RaggedColumn(np.arange(5), np.array([2, 0, 3]))
    >>> take_rows(col, np.array([2, 0])).values.tolist()
    [2, 3, 4, 0, 1]
    """

    values: npt.NDArray[Any]
    row_lengths: npt.NDArray[np.int64]


Column: TypeAlias = npt.NDArray[Any] | RaggedColumn


def num_rows(column: Column) -> int:
    """Records in ``column``."""
    if isinstance(column, RaggedColumn):
        return len(column.row_lengths)
    return len(column)


def take_rows(column: Column, index: npt.NDArray[np.integer[Any]]) -> Column:
    """The records at ``index`` (in that order), as ``array[index]`` does for a plain column."""
    if not isinstance(column, RaggedColumn):
        return column[index]
    lengths = column.row_lengths
    chosen = lengths[index]
    total = int(chosen.sum())
    if total == 0:
        return RaggedColumn(column.values[:0], chosen)
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    # Position of every value taken: its record's start, plus its place within the record.
    out_starts = np.zeros(len(chosen), dtype=np.int64)
    np.cumsum(chosen[:-1], out=out_starts[1:])
    flat = np.arange(total, dtype=np.int64) + np.repeat(starts[index] - out_starts, chosen)
    return RaggedColumn(column.values[flat], chosen)


def mask_rows(column: Column, mask: npt.NDArray[np.bool_]) -> Column:
    """The records where ``mask`` is True, in order (cheaper than ``take_rows`` for many)."""
    if not isinstance(column, RaggedColumn):
        return column[mask]
    return RaggedColumn(
        column.values[np.repeat(mask, column.row_lengths)], column.row_lengths[mask]
    )


def concat_rows(first: Column, second: Column) -> Column:
    """The records of ``first`` followed by those of ``second`` (columns of the same kind)."""
    if isinstance(first, RaggedColumn) and isinstance(second, RaggedColumn):
        return RaggedColumn(
            np.concatenate((first.values, second.values)),
            np.concatenate((first.row_lengths, second.row_lengths)),
        )
    if isinstance(first, RaggedColumn) or isinstance(second, RaggedColumn):
        raise TypeError("concat_rows: a ragged column joined with a plain one")
    return np.concatenate((first, second))


def empty_rows(column: Column) -> Column:
    """No records, with the dtype and inner shape of ``column``."""
    if isinstance(column, RaggedColumn):
        return RaggedColumn(column.values[:0], column.row_lengths[:0])
    return column[:0]
