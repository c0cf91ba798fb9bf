"""streamer.decode.ragged: rows of plain and ragged columns taken, masked, joined and emptied
whole, checked against a list-of-rows reference (the shuffle window's tests cover the window)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.decode.ragged import (
    Column,
    RaggedColumn,
    concat_rows,
    empty_rows,
    mask_rows,
    num_rows,
    take_rows,
)


def _ragged(
    rows: list[list[Any]], dtype: Any = np.int64, inner: tuple[int, ...] = ()
) -> RaggedColumn:
    """A ragged column from its rows (each a list of values of shape ``inner``)."""
    flat = [v for row in rows for v in row]
    values = (
        np.array(flat, dtype=dtype).reshape((-1, *inner)) if flat else np.zeros((0, *inner), dtype)
    )
    return RaggedColumn(values, np.array([len(r) for r in rows], dtype=np.int64))


def _rows(col: Column) -> list[list[Any]]:
    """The column back as a list of rows (the reference the helpers are checked against)."""
    assert isinstance(col, RaggedColumn)
    out, at = [], 0
    for n in col.row_lengths.tolist():
        out.append(col.values[at : at + n].tolist())
        at += n
    assert at == len(col.values), "row lengths do not add up to the values"
    return out


def test_num_rows_counts_records_not_values() -> None:
    """A ragged column's record count is its row lengths' count, not its values'."""
    col = _ragged([[1, 2, 3], [], [4]])
    assert num_rows(col) == 3 and len(col.values) == 4
    assert num_rows(np.zeros((5, 2))) == 5
    assert num_rows(_ragged([])) == 0


def test_take_rows_on_a_plain_column_is_fancy_indexing() -> None:
    col = np.arange(12).reshape(4, 3)
    out = take_rows(col, np.array([3, 0, 0]))
    assert isinstance(out, np.ndarray)
    assert out.tolist() == [[9, 10, 11], [0, 1, 2], [0, 1, 2]]


def test_take_rows_repeats_and_reorders_whole_ragged_rows() -> None:
    """An index may name a record twice and in any order; each comes with all its values."""
    col = _ragged([[1, 2], [], [3, 4, 5], [6]])
    out = take_rows(col, np.array([2, 0, 2, 1, 3]))
    assert isinstance(out, RaggedColumn)
    assert _rows(out) == [[3, 4, 5], [1, 2], [3, 4, 5], [], [6]]
    assert out.row_lengths.dtype == np.int64


def test_take_rows_takes_negative_indices_as_numpy_does() -> None:
    col = _ragged([[1], [2, 3], [4, 5, 6]])
    assert _rows(take_rows(col, np.array([-1, -3]))) == [[4, 5, 6], [1]]


def test_take_rows_of_empty_rows_keeps_dtype_and_inner_shape() -> None:
    """Only empty records taken (or none at all): no values, but the column's dtype and row
    shape, so that it still joins with others."""
    col = _ragged([[[1.0, 2.0]], [], []], dtype=np.float32, inner=(2,))
    for index in (np.array([1, 2, 1]), np.array([], dtype=np.int64)):
        out = take_rows(col, index)
        assert isinstance(out, RaggedColumn)
        assert out.values.shape == (0, 2) and out.values.dtype == np.float32
        assert out.row_lengths.tolist() == [0] * len(index)


def test_take_rows_beyond_the_column_is_an_index_error() -> None:
    with pytest.raises(IndexError):
        take_rows(_ragged([[1], [2]]), np.array([2]))


def test_mask_rows_keeps_the_marked_records_in_order() -> None:
    col = _ragged([["a"], [], ["b", "c"], ["d"]], dtype=object)
    mask = np.array([True, True, False, True])
    out = mask_rows(col, mask)
    assert isinstance(out, RaggedColumn)
    assert _rows(out) == [["a"], [], ["d"]]
    assert out.values.dtype == object
    plain = mask_rows(np.array([10, 20, 30, 40]), mask)
    assert isinstance(plain, np.ndarray) and plain.tolist() == [10, 20, 40]


def test_mask_rows_of_nothing_is_an_empty_column_of_the_same_kind() -> None:
    col = _ragged([[[1, 2]], [[3, 4], [5, 6]]], inner=(2,))
    out = mask_rows(col, np.zeros(2, dtype=bool))
    assert isinstance(out, RaggedColumn)
    assert out.values.shape == (0, 2) and num_rows(out) == 0


def test_concat_rows_joins_plain_and_ragged_columns() -> None:
    joined = concat_rows(_ragged([[1], []]), _ragged([[2, 3]]))
    assert isinstance(joined, RaggedColumn) and _rows(joined) == [[1], [], [2, 3]]
    plain = concat_rows(np.array([[1, 2]]), np.array([[3, 4], [5, 6]]))
    assert isinstance(plain, np.ndarray) and plain.tolist() == [[1, 2], [3, 4], [5, 6]]


@pytest.mark.parametrize("ragged_first", [True, False])
def test_concat_rows_of_a_ragged_and_a_plain_column_is_a_type_error(ragged_first: bool) -> None:
    """Joining different kinds is a caller's bug: refused, never a column of wrong rows."""
    ragged, plain = _ragged([[1, 2]]), np.array([1, 2])
    pair = (ragged, plain) if ragged_first else (plain, ragged)
    with pytest.raises(TypeError, match="ragged column joined with a plain one"):
        concat_rows(*pair)


def test_empty_rows_keeps_the_kind_dtype_and_inner_shape() -> None:
    ragged = empty_rows(_ragged([[[1.5, 2.5]]], dtype=np.float16, inner=(2,)))
    assert isinstance(ragged, RaggedColumn)
    assert ragged.values.shape == (0, 2) and ragged.values.dtype == np.float16
    assert ragged.row_lengths.shape == (0,) and ragged.row_lengths.dtype == np.int64
    plain = empty_rows(np.ones((3, 4, 5), dtype=np.uint8))
    assert isinstance(plain, np.ndarray) and plain.shape == (0, 4, 5) and plain.dtype == np.uint8


_ROWS = st.lists(st.lists(st.integers(-1000, 1000), max_size=6), max_size=12)


@settings(max_examples=150, deadline=None)
@given(_ROWS, st.data())
def test_take_rows_matches_the_list_reference(rows: list[list[int]], data: st.DataObject) -> None:
    """Whatever the index (repeats, any order, negative), take_rows gives those records whole,
    the same as the plain column of their row numbers gives those row numbers."""
    n = len(rows)
    index = data.draw(st.lists(st.integers(-n, n - 1), max_size=15)) if n else []
    idx = np.array(index, dtype=np.int64)
    out = take_rows(_ragged(rows), idx)
    assert isinstance(out, RaggedColumn)
    assert _rows(out) == [rows[i] for i in index]
    assert take_rows(np.arange(n), idx).tolist() == [i % n for i in index]  # type: ignore[union-attr]


@settings(max_examples=150, deadline=None)
@given(_ROWS, _ROWS, st.data())
def test_mask_then_concat_matches_the_list_reference(
    first: list[list[int]], second: list[list[int]], data: st.DataObject
) -> None:
    """Masking drops exactly the unmarked records; joining keeps both sides' records in order;
    joining an empty column changes nothing."""
    mask = data.draw(st.lists(st.booleans(), min_size=len(first), max_size=len(first)))
    kept = mask_rows(_ragged(first), np.array(mask, dtype=bool))
    assert isinstance(kept, RaggedColumn)
    expected = [row for row, m in zip(first, mask, strict=True) if m]
    assert _rows(kept) == expected
    joined = concat_rows(kept, _ragged(second))
    assert isinstance(joined, RaggedColumn)
    assert _rows(joined) == expected + second
    assert num_rows(joined) == len(expected) + len(second)
    same = concat_rows(empty_rows(joined), joined)
    assert isinstance(same, RaggedColumn) and _rows(same) == _rows(joined)
