"""streamer.decode.values: one feature value at a time, below decode_block: each function's
dtype and shape rules and its rejection reason, and the column assembly. test_records checks
the same rules through whole records; these name the function that decides."""

from __future__ import annotations

from typing import Any

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from streamer.decode.ragged import RaggedColumn
from streamer.decode.schema import Feature
from streamer.decode.values import (
    FeaturePlan,
    Rejected,
    assemble_fixed,
    assemble_strings,
    assemble_variable,
    cast,
    from_lists,
    from_numpy_map,
    scalar,
    string_value,
    variable_value,
)


def plan(dtype: str, shape: tuple[int, ...] = (), **kw: Any) -> FeaturePlan:
    return FeaturePlan(Feature("f", dtype, shape, **kw))


def wire(value: Any) -> Any:
    """``value`` as the decoder sees it: packed (msgpack-numpy for arrays) and unpacked with
    the decoder's own options (bin stays bytes, str keys or bin keys)."""
    return msgpack.unpackb(
        msgpack.packb(value, default=msgpack_numpy.encode), raw=False, strict_map_key=True
    )


def reason(call: Any, *args: Any) -> str:
    with pytest.raises(Rejected) as info:
        call(*args)
    return info.value.reason


# ---- FeaturePlan -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "kind", "lo", "hi", "fmax"),
    [
        ("bool", "b", 0, 0, None),
        ("int8", "i", -128, 127, None),
        ("uint16", "i", 0, 65535, None),
        ("int64", "i", -(2**63), 2**63 - 1, None),
        ("uint64", "i", 0, 2**64 - 1, None),
        ("float16", "f", 0, 0, 65504.0),
        ("float32", "f", 0, 0, float(np.finfo(np.float32).max)),
        ("float64", "f", 0, 0, None),  # msgpack floats are float64: nothing to bound
        ("string", "s", 0, 0, None),
    ],
)
def test_plan_kind_and_bounds_follow_the_dtype(
    dtype: str, kind: str, lo: int, hi: int, fmax: float | None
) -> None:
    fp = plan(dtype)
    assert (fp.kind, fp.lo, fp.hi, fp.fmax) == (kind, lo, hi, fmax)
    assert fp.raw_fast == (kind in "if")  # strings and bools never take the raw fast path


@pytest.mark.parametrize(
    ("dtype", "list_min", "list_max"),
    [
        ("int8", True, True),
        ("int64", False, True),  # msgpack ints reach -2**63 only: no min() needed
        ("uint64", True, False),  # ... and 2**64 - 1 at most: no max() needed
        ("float32", True, True),
        ("float64", False, False),
    ],
)
def test_plan_skips_only_the_list_bound_checks_msgpack_already_guarantees(
    dtype: str, list_min: bool, list_max: bool
) -> None:
    fp = plan(dtype, (-1,), max_len=4)
    assert (fp.list_min, fp.list_max, fp.fast_list) == (list_min, list_max, True)


def test_plan_of_kinds_and_shapes() -> None:
    ragged = plan("float32", (-1, 3), max_len=5)
    assert (ragged.variable, ragged.special, ragged.raw_fast, ragged.fast_list) == (
        True,
        True,
        False,
        False,  # rows of 3: not a flat list of numbers
    )
    assert (ragged.inner_shape, ragged.inner_size, ragged.inner_nbytes, ragged.max_len) == (
        (3,),
        3,
        12,
        5,
    )
    words = plan("string", (2,))
    assert (words.string, words.special, words.fast_str) == (True, True, False)
    assert plan("string").fast_str and plan("float32").fast_float and plan("int16").fast_int
    assert not plan("float32", (2,)).fast_float


@pytest.mark.parametrize(
    ("feature", "item"),
    [
        (Feature("f", "float32"), None),  # no default: required
        (Feature("f", "int16", default=-2), np.int16(-2).astype("<i2").tobytes()),
        (Feature("f", "float32", (2,), default=1.5), np.full(2, 1.5, "<f4").tobytes()),
        (
            Feature("f", "int32", (-1, 2), max_len=4, default=[[1, 2], [3, 4]]),
            (np.array([1, 2, 3, 4], "<i4").tobytes(), 2),
        ),
        (Feature("f", "int64", (-1,), max_len=4, default=[]), (b"", 0)),
        (Feature("f", "string", default="n/a"), "n/a"),
        (Feature("f", "string", (2,), default=["a", "b"]), ["a", "b"]),
        (Feature("f", "string", (-1,), max_len=3, default=["a"]), (["a"], 1)),
    ],
)
def test_a_default_becomes_the_item_a_decoded_value_would_be(feature: Feature, item: Any) -> None:
    """A missing field's item has the form of a present one: raw little-endian bytes for
    numbers, ``(piece, rows)`` for a variable-length feature, str for strings."""
    assert FeaturePlan(feature).default_item == item


# ---- scalars -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "value", "expected"),
    [
        ("bool", True, "ok"),
        ("bool", 1, "dtype"),  # no number for a bool
        ("int8", -128, "ok"),
        ("int8", 127, "ok"),
        ("int8", 128, "dtype"),
        ("uint32", -1, "dtype"),
        ("uint64", 2**64 - 1, "ok"),
        ("int32", 1.0, "dtype"),  # a float is never an integer, even a whole one
        ("int32", True, "dtype"),
        ("float32", True, "dtype"),
        ("float32", 7, "ok"),  # an int is fine for a float
        ("float16", 65519.0, "ok"),  # rounds to the largest float16
        ("float16", 65520.0, "dtype"),  # would round to inf
        ("float16", -70000, "dtype"),
        ("float32", 1e39, "dtype"),
        ("float64", 1e308, "ok"),
    ],
)
def test_scalar_takes_only_values_that_fit_the_dtype(dtype: str, value: Any, expected: str) -> None:
    fp = plan(dtype)
    if expected == "ok":
        assert scalar(fp, value) == value
    else:
        assert reason(scalar, fp, value) == expected


# ---- cast --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "array", "expected"),
    [
        ("bool", np.array([True, False]), [True, False]),
        ("int64", np.array([1, -2], np.int8), [1, -2]),  # safe
        ("int8", np.array([127, -128], np.int64), [127, -128]),  # narrowed, in range
        ("uint8", np.array([255], np.uint64), [255]),
        ("float32", np.array([1.5, -2.0]), [1.5, -2.0]),
        ("float16", np.array([1, 2], np.int64), [1.0, 2.0]),
    ],
)
def test_cast_converts_what_fits(dtype: str, array: np.ndarray, expected: list[Any]) -> None:
    out = cast(plan(dtype), array)
    assert out.dtype == np.dtype(dtype) and out.tolist() == expected


@pytest.mark.parametrize(
    ("dtype", "array"),
    [
        ("bool", np.array([0, 1], np.uint8)),  # bytes are not booleans
        ("int32", np.array([True])),
        ("float32", np.array([True])),
        ("int32", np.array([1.0])),  # a float array is never an integer one
        ("int8", np.array([128], np.int64)),
        ("uint32", np.array([-1], np.int64)),
        ("int64", np.array([2**63], np.uint64)),
        ("float16", np.array([1e5])),
        ("float32", np.array([-1e39])),
        ("float16", np.array([70000], np.int64)),
    ],
)
def test_cast_refuses_what_would_change_as_dtype(dtype: str, array: np.ndarray) -> None:
    assert reason(cast, plan(dtype), array) == "dtype"


def test_cast_keeps_nan_and_inf_for_the_finite_check_after_it() -> None:
    """Only a finite value that overflows is refused here; NaN and ±Inf pass as they are
    (decode_block refuses them for finite-only features, and keeps them where allowed)."""
    out = cast(plan("float16"), np.array([np.nan, np.inf, -np.inf]))
    assert np.isnan(out[0]) and out[1:].tolist() == [np.inf, -np.inf]


def test_an_empty_array_of_a_wider_integer_dtype_is_zero_rows() -> None:
    """A msgpack-numpy array of no elements for a variable-length int feature is a record with
    no rows, whatever integer dtype it was written in (as it is for int8 or '>i8')."""
    fp = plan("int64", (-1,), max_len=4)
    piece, rows = variable_value(fp, wire(np.array([], np.uint64)))
    assert rows == 0 and len(piece) == 0


# ---- fixed-shape values ------------------------------------------------------------------------


def test_from_lists_builds_the_features_array() -> None:
    out = from_lists(plan("int16", (2, 3)), [[1, 2, 3], [-4, 5, 32767]])
    assert out.dtype == np.int16 and out.tolist() == [[1, 2, 3], [-4, 5, 32767]]
    floats = from_lists(plan("float32", (3,)), [1, 2.5, -3])
    assert floats.dtype == np.float32 and floats.tolist() == [1.0, 2.5, -3.0]
    flags = from_lists(plan("bool", (2,)), [True, False])
    assert flags.dtype == np.bool_ and flags.tolist() == [True, False]


@pytest.mark.parametrize(
    ("dtype", "shape", "value", "expected"),
    [
        ("float32", (3,), [1.0, 2.0], "shape"),
        ("float32", (2, 2), [[1.0, 2.0], [3.0]], "shape"),
        ("float32", (2, 2), [[1.0, 2.0], 3.0], "shape"),
        ("float32", (2,), [[1.0], [2.0]], "shape"),  # one level too deep
        ("float32", (), [1.0], "shape"),  # a list for a scalar
        ("int8", (2,), [1, 200], "dtype"),
        ("int8", (2,), [1, 2.0], "dtype"),
        ("bool", (2,), [True, 0], "dtype"),
        ("float32", (2,), [1.0, True], "dtype"),
        ("float16", (2,), [1.0, 1e6], "dtype"),
        ("float32", (2,), [1.0, "2"], "schema"),
        ("float32", (2,), [1.0, None], "schema"),
        ("float32", (2,), [1.0, {"a": 1}], "shape"),
        ("float32", (2,), [1.0, msgpack.Timestamp(0)], "format"),
    ],
)
def test_from_lists_rejections_name_what_was_wrong(
    dtype: str, shape: tuple[int, ...], value: list[Any], expected: str
) -> None:
    assert reason(from_lists, plan(dtype, shape), value) == expected


def test_from_numpy_map_takes_the_raw_bytes_when_the_dtype_matches() -> None:
    """The same dtype, little-endian: the data itself (no copy into an array); either key
    spelling (msgpack-numpy writes bin keys, other producers str)."""
    data = np.array([1.5, 2.5], "<f4").tobytes()
    fp = plan("float32", (2,))
    assert from_numpy_map(fp, wire(np.array([1.5, 2.5], np.float32))) == data
    str_keys = {"nd": True, "type": "<f4", "kind": "", "shape": [2], "data": data}
    assert from_numpy_map(fp, str_keys) == data


def test_from_numpy_map_casts_other_dtypes_and_byte_orders() -> None:
    big = from_numpy_map(plan("int32", (3,)), wire(np.array([1, -2, 3], ">i4")))
    assert isinstance(big, np.ndarray) and big.dtype == np.int32 and big.tolist() == [1, -2, 3]
    wide = from_numpy_map(
        plan("float32", (2, 2)), wire(np.arange(4, dtype=np.float64).reshape(2, 2))
    )
    assert wide.tolist() == [[0, 1], [2, 3]] and wide.dtype == np.float32  # type: ignore[union-attr]
    one = from_numpy_map(plan("float64"), wire(np.float32(0.5)))  # a 0-d numpy scalar
    assert one.tolist() == 0.5 and one.shape == ()  # type: ignore[union-attr]


def _envelope(**changes: Any) -> dict[str, Any]:
    env = {"nd": True, "type": "<i4", "kind": "", "shape": [2], "data": b"\x01\0\0\0\x02\0\0\0"}
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize(
    ("envelope", "expected"),
    [
        (_envelope(shape=[3]), "shape"),
        (_envelope(shape=[1, 2]), "shape"),
        (_envelope(shape=["2"]), "shape"),
        (_envelope(nd=False), "shape"),  # a 0-d scalar for a [2] feature
        (_envelope(data=b"\x01\0\0\0"), "shape"),  # too few bytes for the shape
        (_envelope(data="text"), "schema"),
        (_envelope(data=None), "schema"),
        (_envelope(nd=1), "schema"),
        (_envelope(type=None), "schema"),
        (_envelope(type="<c16"), "dtype"),  # complex: not an allowed dtype
        (_envelope(type="<U1"), "dtype"),
        (_envelope(type=[["a", "<i4"]], kind="V"), "dtype"),  # structured
        (_envelope(kind="O"), "dtype"),  # pickled objects
        ({"some": "map"}, "schema"),
    ],
)
def test_from_numpy_map_rejections_name_what_was_wrong(
    envelope: dict[str, Any], expected: str
) -> None:
    assert reason(from_numpy_map, plan("int32", (2,)), envelope) == expected


def test_from_numpy_map_refuses_bool_bytes_other_than_0_and_1() -> None:
    fp = plan("bool", (2,))
    ok = {"nd": True, "type": "|b1", "kind": "", "shape": [2], "data": b"\x01\x00"}
    assert from_numpy_map(fp, ok) == b"\x01\x00"
    assert reason(from_numpy_map, fp, {**ok, "data": b"\x01\x02"}) == "dtype"


def test_from_numpy_map_refuses_a_string_feature() -> None:
    assert reason(from_numpy_map, plan("string"), wire(np.float32(1.0))) == "dtype"


# ---- strings -----------------------------------------------------------------------------------


def test_string_value_takes_str_or_bin_and_flattens_shaped_lists() -> None:
    assert string_value(plan("string"), "abc") == "abc"
    assert string_value(plan("string"), b"\xff") == b"\xff"
    grid = plan("string", (2, 2))
    assert string_value(grid, [["a", b"b"], ["c", "d"]]) == ["a", b"b", "c", "d"]


@pytest.mark.parametrize(
    ("shape", "value", "expected"),
    [
        ((), ["a"], "shape"),
        ((), 5, "dtype"),
        ((), None, "schema"),
        ((), msgpack.Timestamp(0), "format"),
        ((), {"x": 1}, "schema"),
        ((), wire(np.array([1.0])), "dtype"),  # an array of numbers for a string
        ((2,), "ab", "shape"),  # one string where a list belongs
        ((2,), ["a"], "shape"),
        ((2,), ["a", 1], "dtype"),
        ((2,), ["a", None], "schema"),
        ((2,), ["a", ["b"]], "shape"),
        ((2, 2), [["a", "b"], ["c"]], "shape"),
    ],
)
def test_string_value_rejections_name_what_was_wrong(
    shape: tuple[int, ...], value: Any, expected: str
) -> None:
    assert reason(string_value, plan("string", shape), value) == expected


# ---- variable-length values --------------------------------------------------------------------


def test_variable_value_of_a_list_is_its_leaves_and_row_count() -> None:
    fp = plan("int16", (-1,), max_len=3)
    assert variable_value(fp, [1, -2, 3]) == ([1, -2, 3], 3)
    assert variable_value(fp, []) == ([], 0)
    pairs = plan("float32", (-1, 2), max_len=3)
    assert variable_value(pairs, [[1.0, 2.0], [3.0, 4.5]]) == ([1.0, 2.0, 3.0, 4.5], 2)
    words = plan("string", (-1,), max_len=2)
    assert variable_value(words, ["a", b"b"]) == (["a", b"b"], 2)


def test_variable_value_casts_a_float_list_beyond_the_dtype_to_decide_exactly() -> None:
    """Past float16's largest value, the list is cast whole: a value that rounds to the
    largest one is kept (rounded), one that becomes inf is refused."""
    fp = plan("float16", (-1,), max_len=4)
    piece, rows = variable_value(fp, [1.0, 65519.0])
    assert isinstance(piece, np.ndarray) and piece.dtype == np.float16
    assert (piece.tolist(), rows) == ([1.0, 65504.0], 2)
    assert reason(variable_value, fp, [1.0, 65520.0]) == "dtype"


def test_variable_value_takes_raw_bytes_of_whole_rows() -> None:
    fp = plan("int32", (-1, 2), max_len=2)
    data = np.arange(4, dtype="<i4").tobytes()
    assert variable_value(fp, data) == (data, 2)
    assert variable_value(fp, b"") == (b"", 0)
    assert reason(variable_value, fp, data[:-4]) == "shape"  # a row and a half
    assert reason(variable_value, fp, data + data[:8]) == "shape"  # 3 rows > max_len 2
    flags = plan("bool", (-1,), max_len=3)
    assert reason(variable_value, flags, b"\x00\x01\x05") == "dtype"


def test_variable_value_takes_msgpack_numpy_arrays_of_rows() -> None:
    fp = plan("int32", (-1, 2), max_len=3)
    same = np.array([[1, 2], [3, 4]], "<i4")
    assert variable_value(fp, wire(same)) == (same.tobytes(), 2)
    piece, rows = variable_value(fp, wire(np.array([[1, 2]], ">i8")))
    assert rows == 1 and piece.dtype == np.int32 and piece.tolist() == [1, 2]
    assert reason(variable_value, fp, wire(np.array([1, 2], "<i4"))) == "shape"  # no row axis
    assert reason(variable_value, fp, wire(np.zeros((2, 3), "<i4"))) == "shape"
    assert reason(variable_value, fp, wire(np.zeros((4, 2), "<i4"))) == "shape"  # > max_len
    assert reason(variable_value, fp, wire(np.int32(1))) == "shape"  # a 0-d scalar


@pytest.mark.parametrize(
    ("dtype", "value", "expected"),
    [
        ("int8", [1, 2, 3, 4], "shape"),  # longer than max_len 3
        ("int8", [1, 300], "dtype"),
        ("int8", [1, True], "dtype"),
        ("int8", [1.0], "dtype"),
        ("bool", [True, 1], "dtype"),
        ("float32", [1.0, "x"], "schema"),
        ("float32", [[1.0]], "shape"),
        ("float32", 1.5, "shape"),  # one value where a list belongs
        ("float32", None, "schema"),
        ("float32", "1,2", "schema"),
        ("float32", msgpack.Timestamp(0), "format"),
        ("string", "abc", "shape"),
        ("string", b"abc", "shape"),
        ("string", [1], "dtype"),
        ("string", ["a", msgpack.Timestamp(0)], "format"),
        ("string", {"x": 1}, "schema"),
    ],
)
def test_variable_value_rejections_name_what_was_wrong(
    dtype: str, value: Any, expected: str
) -> None:
    assert reason(variable_value, plan(dtype, (-1,), max_len=3), value) == expected


# ---- assembly ----------------------------------------------------------------------------------


def test_assemble_fixed_joins_raw_bytes_into_one_array() -> None:
    fp = plan("int16", (2,))
    column = [np.array(r, "<i2").tobytes() for r in ([1, 2], [3, -4], [5, 6])]
    out = assemble_fixed(fp, column, False, 3)
    assert out.dtype == np.int16 and out.tolist() == [[1, 2], [3, -4], [5, 6]]
    assert out.flags.writeable  # the trainer may write into it


def test_assemble_fixed_mixes_bytes_scalars_and_arrays_in_row_order() -> None:
    scalars = assemble_fixed(plan("float32"), [1.5, 2, np.float32(3.0)], True, 3)
    assert scalars.dtype == np.float32 and scalars.tolist() == [1.5, 2.0, 3.0]
    one = assemble_fixed(plan("int32"), [np.array(7, "<i4").tobytes(), 8], True, 2)
    assert one.tolist() == [7, 8]
    fp = plan("uint8", (2,))
    column = [b"\x01\x02", np.array([3, 4], np.uint8), b"\x05\x06"]
    assert assemble_fixed(fp, column, True, 3).tolist() == [[1, 2], [3, 4], [5, 6]]


def test_assemble_strings_keeps_str_and_bytes_as_objects() -> None:
    flat = assemble_strings(plan("string"), ["a", b"b"], 2)
    assert flat.dtype == object and flat.tolist() == ["a", b"b"]
    grid = assemble_strings(plan("string", (2,)), [["a", "b"], ["c", b"d"]], 2)
    assert grid.shape == (2, 2) and grid.tolist() == [["a", "b"], ["c", b"d"]]
    # A list of equal-length strings must stay a column of objects, not become a 2-d array.
    same = assemble_strings(plan("string"), ["ab", "cd"], 2)
    assert same.shape == (2,)


def _rows(col: RaggedColumn) -> list[list[Any]]:
    ends = np.cumsum(col.row_lengths).tolist()
    return [col.values[a:b].tolist() for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def test_assemble_variable_joins_every_kind_of_piece_in_row_order() -> None:
    fp = plan("int32", (-1, 2), max_len=4)
    column = [
        (np.array([1, 2, 3, 4], "<i4").tobytes(), 2),  # raw bytes
        ([5, 6], 1),  # a checked list
        (np.array([7, 8], np.int64), 1),  # a cast array
        (b"", 0),
    ]
    out = assemble_variable(fp, column)
    assert out.values.dtype == np.int32 and out.row_lengths.dtype == np.int64
    assert _rows(out) == [[[1, 2], [3, 4]], [[5, 6]], [[7, 8]], []]


@pytest.mark.parametrize(
    "column",
    [
        [(b"\x01\0\x02\0", 2), (b"", 0)],
        [([1, 2], 2), ([], 0)],
    ],
    ids=["bytes", "lists"],
)
def test_assemble_variable_of_one_kind_of_piece(column: list[tuple[Any, int]]) -> None:
    out = assemble_variable(plan("int16", (-1,), max_len=4), column)
    assert out.values.dtype == np.int16 and _rows(out) == [[1, 2], []]


def test_assemble_variable_of_nothing_keeps_the_row_shape() -> None:
    out = assemble_variable(plan("float32", (-1, 3), max_len=4), [])
    assert out.values.shape == (0, 3) and out.values.dtype == np.float32
    assert out.row_lengths.shape == (0,)
    words = assemble_variable(plan("string", (-1,), max_len=4), [(["a", b"b"], 2), ([], 0)])
    assert words.values.dtype == object and _rows(words) == [["a", b"b"], []]
