"""Tests of streamer.decode.records: every accepted encoding, every rejection reason, and fuzzing."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamer.decode.records import (
    REASONS,
    DecodedBlock,
    RaggedColumn,
    decode_block,
    decode_block_python,
    encode_record,
)
from streamer.decode.schema import ALLOWED_DTYPES, Feature, Schema

SCHEMA = Schema(
    (
        Feature("x", "float32", (4,)),
        Feature("m", "int16", (2, 3)),
        Feature("y", "float32"),
        Feature("n", "int64"),
        Feature("b", "bool"),
        Feature("bv", "bool", (3,)),
    ),
    label="y",
)


def _sample(i: int) -> dict[str, Any]:
    return {
        "x": np.arange(4, dtype=np.float32) + i,
        "m": (np.arange(6, dtype=np.int16) - 3 * i).reshape(2, 3),
        "y": np.float32(i / 4),
        "n": np.int64(i * 1_000_000_007),
        "b": np.bool_(i % 2),
        "bv": np.array([i % 2, 1, 0], dtype=bool),
    }


def _good(i: int) -> bytes:
    return encode_record(SCHEMA, _sample(i))


def _plain(i: int) -> dict[str, Any]:
    """The sample as msgpack-ready Python values: bin for arrays, numbers for scalars."""
    return msgpack.unpackb(_good(i))


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj)


def check_invariants(schema: Schema, values: list[Any], block: DecodedBlock) -> None:
    """The contract: every index kept or rejected once, known reasons, arrays match the schema."""
    kept = block.kept.tolist()
    rejected = [index for index, _ in block.rejected]
    assert block.kept.dtype == np.int64
    assert kept == sorted(kept)
    assert rejected == sorted(rejected)
    assert sorted(kept + rejected) == list(range(len(values)))
    assert all(reason in REASONS for _, reason in block.rejected)
    assert sum(block.reason_counts().values()) == len(rejected)
    assert len(block) == len(kept)
    assert set(block.features) == set(schema.feature_names)
    for f in schema.features:
        col = block.features[f.name]
        if f.is_variable:
            assert isinstance(col, RaggedColumn)
            lengths = col.row_lengths
            assert lengths.dtype == np.int64 and lengths.shape == (len(kept),)
            # Caps respected: no record has more rows than max_len, whatever came in.
            assert lengths.min(initial=0) >= 0 and lengths.max(initial=0) <= (f.max_len or 0)
            arr = col.values
            assert arr.shape == (int(lengths.sum()), *f.inner_shape)
        else:
            assert isinstance(col, np.ndarray)
            arr = col
            assert arr.shape == (len(kept), *f.shape)
        assert arr.dtype == f.dtype
        assert arr.flags.c_contiguous
        if f.dtype == np.dtype(bool):
            assert arr.view(np.uint8).max(initial=0) <= 1
        if f.is_string:
            assert all(type(v) in (str, bytes) for v in arr.reshape(-1))
        if f.finite_only:
            assert np.isfinite(arr).all(), f.name


def _assert_rows(block: DecodedBlock, samples: list[dict[str, Any]]) -> None:
    assert len(block) == len(samples)
    for f in SCHEMA.features:
        expected = np.stack([np.asarray(s[f.name], dtype=f.dtype) for s in samples])
        np.testing.assert_array_equal(block.features[f.name], expected)


# -- good records ----------------------------------------------------------------------------


def test_encode_record_round_trip() -> None:
    values = [_good(i) for i in range(5)]
    block = decode_block(SCHEMA, values)
    check_invariants(SCHEMA, values, block)
    assert block.kept.tolist() == [0, 1, 2, 3, 4]
    assert block.rejected == []
    assert block.reason_counts() == {}
    _assert_rows(block, [_sample(i) for i in range(5)])


def test_encode_record_uses_bin_for_arrays_and_numbers_for_scalars() -> None:
    plain = _plain(3)
    assert plain["x"] == (np.arange(4, dtype="<f4") + 3).tobytes()
    assert isinstance(plain["m"], bytes)
    assert plain["y"] == 0.75
    assert plain["n"] == 3_000_000_021
    assert plain["b"] is True


def test_empty_block() -> None:
    block = decode_block(SCHEMA, [])
    check_invariants(SCHEMA, [], block)
    assert block.features["m"].shape == (0, 2, 3)


def test_numbers_and_nested_lists() -> None:
    record = {
        "x": [0.5, 1, -2, 3.25],  # ints are fine for a float feature
        "m": [[1, 2, 3], [-4, 5, 32767]],
        "y": 7,
        "n": -(2**63),
        "b": False,
        "bv": [True, False, True],
    }
    block = decode_block(SCHEMA, [_pack(record)])
    check_invariants(SCHEMA, [0], block)
    expected = {**record, "x": np.array([0.5, 1, -2, 3.25], np.float32)}
    _assert_rows(block, [expected])


def test_msgpack_numpy_arrays_and_scalars() -> None:
    sample = _sample(2)
    packed = msgpack_numpy.packb(sample)
    assert isinstance(msgpack.unpackb(packed)["x"], dict)
    block = decode_block(SCHEMA, [packed])
    _assert_rows(block, [sample])


def test_msgpack_numpy_with_str_keys_and_other_byte_orders_and_casts() -> None:
    def envelope(arr: npt.NDArray[Any]) -> dict[str, Any]:
        return {
            "nd": True,
            "type": arr.dtype.str,
            "kind": "",
            "shape": list(arr.shape),
            "data": arr.tobytes(),
        }

    record = {
        "x": envelope(np.array([1, 2, 3, 4], dtype=">f8")),  # big-endian float64 -> float32
        "m": envelope(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int8)),  # safe int cast
        "y": {"nd": False, "type": "<i4", "data": np.int32(9).tobytes()},
        "n": envelope(np.array(2**40, dtype=np.uint64)),  # 0-d, uint64 fits int64
        "b": {b"nd": False, b"type": b"|b1", b"data": b"\x01"},  # type as bin
        "bv": envelope(np.array([True, False, False])),
    }
    block = decode_block(SCHEMA, [_pack(record)])
    check_invariants(SCHEMA, [0], block)
    assert block.rejected == []
    expected = {
        "x": [1, 2, 3, 4],
        "m": [[1, 2, 3], [4, 5, 6]],
        "y": 9,
        "n": 2**40,
        "b": True,
        "bv": [True, False, False],
    }
    _assert_rows(block, [expected])


def test_mixed_encodings_in_one_block_keep_row_order() -> None:
    samples = [_sample(i) for i in range(6)]
    values = [
        _good(0),
        msgpack_numpy.packb(samples[1]),
        _pack({k: np.asarray(v).tolist() for k, v in samples[2].items()}),
        _good(3),
        msgpack_numpy.packb(samples[4]),
        _good(5),
    ]
    block = decode_block(SCHEMA, values)
    check_invariants(SCHEMA, values, block)
    _assert_rows(block, samples)


def test_extra_keys_are_ignored() -> None:
    record = {**_plain(1), "note": "from sim-3", "meta": {"a": [1, 2, {"b": None}]}}
    block = decode_block(SCHEMA, [_pack(record)])
    _assert_rows(block, [_sample(1)])


def test_bytearray_and_memoryview_values() -> None:
    values: list[Any] = [bytearray(_good(0)), memoryview(_good(1))]
    block = decode_block(SCHEMA, values)
    _assert_rows(block, [_sample(0), _sample(1)])


def test_bytes_subclass_values() -> None:
    class Payload(bytes):
        pass

    block = decode_block(SCHEMA, [Payload(_good(3))])
    _assert_rows(block, [_sample(3)])


def test_a_bug_in_the_decoder_is_not_turned_into_a_rejection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streamer.decode.records

    def broken(*args: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(streamer.decode.records, "_convert", broken)
    with pytest.raises(KeyError, match="bug"):
        decode_block_python(SCHEMA, [_good(0)])


def test_non_bytes_value_is_a_caller_bug() -> None:
    with pytest.raises(TypeError, match=r"values\[1\] is str"):
        decode_block(SCHEMA, [_good(0), "abc"])  # type: ignore[list-item]


def test_nan_and_inf_are_dtype_rejects_in_every_encoding() -> None:
    schema = Schema(
        (Feature("v", "float16", (3,)), Feature("s", "float32"), Feature("r", "float32", (-1,)))
    )
    nan, inf = float("nan"), float("inf")
    ok = np.array([1, 2, 3], np.float16)
    values = [
        _pack({"v": [nan, 1.0, 2.0], "s": 1.0, "r": []}),  # a list
        _pack({"v": ok.tobytes(), "s": -inf, "r": []}),  # a msgpack float
        _pack({"v": np.array([1, inf, 3], np.float16).tobytes(), "s": 1.0, "r": []}),  # raw bin
        _pack({"v": ok.tobytes(), "s": 1.0, "r": [1.0, nan]}),  # a variable-length list
        _pack({"v": ok.tobytes(), "s": 2.0, "r": [1.0, 2.0]}),
    ]
    block = decode_block(schema, values)
    check_invariants(schema, values, block)
    assert block.rejected == [(0, "dtype"), (1, "dtype"), (2, "dtype"), (3, "dtype")]
    assert block.kept.tolist() == [4]
    assert block.features["r"].row_lengths.tolist() == [2]  # type: ignore[union-attr]


def test_nan_and_inf_pass_through_features_that_allow_them() -> None:
    schema = Schema(
        (
            Feature("v", "float16", (3,), allow_non_finite=True),
            Feature("s", "float32", allow_non_finite=True),
        )
    )
    nan, inf = float("nan"), float("inf")
    values = [_pack({"v": [nan, inf, -inf], "s": nan}), _pack({"v": [1, 2, 3], "s": -inf})]
    block = decode_block(schema, values)
    check_invariants(schema, values, block)
    assert block.rejected == []
    np.testing.assert_array_equal(block.features["v"][0], [nan, inf, -inf])
    assert np.isnan(block.features["s"][0])
    assert block.features["s"][1] == -inf


def test_a_key_twice_in_a_record_is_format() -> None:
    """msgpack keeps the last of two equal keys: two producers' fields could shadow each other."""
    schema = Schema((Feature("y", "float32"),))
    twice = b"\x82\xa1y" + msgpack.packb(1.0) + b"\xa1y" + msgpack.packb(2.0)
    block = decode_block(schema, [twice, _pack({"y": 1.0})])
    assert block.rejected == [(0, "format")] and block.kept.tolist() == [1]


def test_output_arrays_are_writable() -> None:
    block = decode_block(SCHEMA, [_good(0), _good(1)])
    for arr in block.features.values():
        assert arr.flags.writeable


def test_depth_limit_counts_the_record_map_as_one() -> None:
    schema = Schema((Feature("m", "int8", (1, 1)),), max_depth=3)
    ok = _pack({"m": [[1]], "extra": [[2]]})
    deep = _pack({"m": [[1]], "extra": [[[2]]]})
    block = decode_block(schema, [ok, deep])
    assert block.kept.tolist() == [0]
    assert block.rejected == [(1, "too_deep")]


def test_extra_keys_are_checked_on_every_record_of_a_block() -> None:
    # Records past the first with the same extra keys take a shorter check: it still sees a
    # too-deep extra value, and a different key set (a bytes key) gets the full check.
    schema = Schema((Feature("x", "float32", (2,)), Feature("y", "float32")), max_depth=3)
    x = np.array([1, 2], np.float32).tobytes()
    ok = _pack({"x": x, "y": 1.0, "pad": b"\x00" * 8})
    ok_list = _pack({"x": x, "y": 1.0, "pad": [[1]]})
    deep = _pack({"x": x, "y": 1.0, "pad": [[[1]]]})
    bytes_key = _pack({"x": x, "y": 1.0, b"pad": b"\x00"})
    block = decode_block(schema, [ok, ok_list, deep, ok, bytes_key, ok])
    assert block.kept.tolist() == [0, 1, 3, 5]
    assert block.rejected == [(2, "too_deep"), (4, "format")]


# -- bad records -----------------------------------------------------------------------------


def _with(i: int, **changes: Any) -> bytes:
    record = _plain(i)
    record.update(changes)
    return _pack(record)


def _without(i: int, key: str) -> bytes:
    record = _plain(i)
    del record[key]
    return _pack(record)


def _np_env(arr: npt.NDArray[Any], **changes: Any) -> dict[bytes, Any]:
    env: dict[bytes, Any] = {
        b"nd": True,
        b"type": arr.dtype.str,
        b"kind": b"",
        b"shape": list(arr.shape),
        b"data": arr.tobytes(),
    }
    env.update({k.encode(): v for k, v in changes.items()})
    return env


def _nest(depth: int) -> bytes:
    """Raw msgpack of ``depth`` nested one-element arrays around a 0."""
    return b"\x91" * depth + b"\x00"


def _deep_list(depth: int) -> list[Any]:
    """``depth`` nested one-element lists around a 1 (inside a record: depth + 1 levels)."""
    out: list[Any] = [1]
    for _ in range(depth - 1):
        out = [out]
    return out


BAD: dict[str, tuple[Any, str]] = {
    "random bytes": (b"\xc1\x00\x17garbage", "format"),
    "reserved byte 0xc1": (b"\xc1", "format"),
    "not a map: array": (_pack([1, 2, 3]), "format"),
    "not a map: int": (_pack(7), "format"),
    "not a map: nil": (b"\xc0", "format"),
    "bytes key": (_pack({**_plain(1), b"k": 1}), "format"),
    "int key": (b"\x81\x01\x02", "format"),
    "nil key": (b"\x81\xc0\x02", "format"),
    "unknown ext type": (_with(1, e=msgpack.ExtType(5, b"abc")), "format"),
    "ext type as feature": (_with(1, y=msgpack.ExtType(1, b"")), "format"),
    "timestamp as feature": (_with(1, y=msgpack.Timestamp(1, 0)), "format"),
    "invalid timestamp ext": (b"\x81\xa1e\xc7\x03\xffabc", "format"),
    "empty value": (b"", "truncated"),
    "tombstone": (None, "truncated"),
    "truncated by one": (_good(1)[:-1], "truncated"),
    "truncated to the header": (_good(1)[:1], "truncated"),
    "bin header past the end": (b"\x81\xa1x\xc6\x00\x00\x10\x00", "truncated"),
    "trailing data": (_good(1) + b"\x00", "extra_data"),
    "two records": (_good(1) + _good(2), "extra_data"),
    "record too large": (_with(1, pad=b"\x00" * SCHEMA.max_record_bytes), "too_large"),
    "array too long": (_with(1, pad=[0] * (SCHEMA.max_array_len + 1)), "too_large"),
    "map too long": (_with(1, pad={str(i): 0 for i in range(SCHEMA.max_map_len + 1)}), "too_large"),
    "huge array header": (b"\x81\xa1x\xdd\xff\xff\xff\xff", "too_large"),
    "huge map header": (b"\xdf\xff\xff\xff\xff", "too_large"),
    "too deep (ours)": (b"\x81\xa1z" + _nest(SCHEMA.max_depth), "too_deep"),
    "too deep (msgpack stack)": (b"\x81\xa1z" + _nest(5000), "too_deep"),
    "too deep in a feature": (_with(1, x=_deep_list(SCHEMA.max_depth)), "too_deep"),
    "missing feature": (_without(1, "n"), "schema"),
    "missing label": (_without(1, "y"), "schema"),
    "empty map": (_pack({}), "schema"),
    "null feature": (_with(1, x=None), "schema"),
    "null scalar": (_with(1, y=None), "schema"),
    "str feature": (_with(1, y="0.5"), "schema"),
    "map that is not msgpack-numpy": (_with(1, x={"a": 1}), "schema"),
    "msgpack-numpy without data": (_with(1, x={b"nd": True, b"type": "<f4"}), "schema"),
    "null inside a list": (_with(1, x=[1.0, None, 2.0, 3.0]), "schema"),
    "str inside a list": (_with(1, x=[1.0, "a", 2.0, 3.0]), "schema"),
    "float for int": (_with(1, n=1.0), "dtype"),
    "bool for int": (_with(1, n=True), "dtype"),
    "int for bool": (_with(1, b=1), "dtype"),
    "bool for float": (_with(1, y=False), "dtype"),
    "int out of int64 range": (_with(1, n=2**63), "dtype"),
    "int out of int16 range in a list": (_with(1, m=[[1, 2, 3], [4, 5, 40000]]), "dtype"),
    "float in an int list": (_with(1, m=[[1, 2, 3], [4, 5, 6.5]]), "dtype"),
    "bool in an int list": (_with(1, m=[[1, 2, 3], [4, 5, True]]), "dtype"),
    "int in a bool list": (_with(1, bv=[True, 1, False]), "dtype"),
    "finite float beyond float32": (_with(1, y=1e39), "dtype"),
    "finite float beyond float32 in a list": (_with(1, x=[1.0, 2.0, -1e300, 0.0]), "dtype"),
    "raw bool byte 2": (_with(1, bv=b"\x01\x02\x00"), "dtype"),
    "msgpack-numpy float64 for int": (_with(1, m=_np_env(np.zeros((2, 3)))), "dtype"),
    "msgpack-numpy int64 out of int16 range": (
        _with(1, m=_np_env(np.full((2, 3), 70000, dtype=np.int64))),
        "dtype",
    ),
    "msgpack-numpy float64 overflowing float32": (
        _with(1, x=_np_env(np.array([0, 1, 2, 1e300]))),
        "dtype",
    ),
    "msgpack-numpy complex": (_with(1, x=_np_env(np.zeros(4, dtype=np.complex64))), "dtype"),
    "msgpack-numpy str": (_with(1, x=_np_env(np.array(["abcd"] * 4))), "dtype"),
    "msgpack-numpy object kind": (
        _with(1, x=_np_env(np.zeros(4, dtype=np.float32), kind=b"O")),
        "dtype",
    ),
    "msgpack-numpy structured": (
        _with(1, x=_np_env(np.zeros(4, dtype=np.float32), kind=b"V", type=[["a", "<f4"]])),
        "dtype",
    ),
    "msgpack-numpy int for bool": (
        _with(1, b={b"nd": False, b"type": "|i1", b"data": b"\x01"}),
        "dtype",
    ),
    "msgpack-numpy bad bool byte": (
        _with(1, bv=_np_env(np.zeros(3, dtype=bool), data=b"\x00\x07\x01")),
        "dtype",
    ),
    "bin too short": (_with(1, x=b"\x00" * 15), "shape"),
    "bin too long": (_with(1, x=b"\x00" * 17), "shape"),
    "bin for a scalar, wrong size": (_with(1, y=b"\x00" * 8), "shape"),
    "list too short": (_with(1, x=[1.0, 2.0, 3.0]), "shape"),
    "list too long": (_with(1, x=[1.0] * 5), "shape"),
    "flat list for a matrix": (_with(1, m=[1, 2, 3, 4, 5, 6]), "shape"),
    "transposed matrix": (_with(1, m=[[1, 2], [3, 4], [5, 6]]), "shape"),
    "ragged matrix": (_with(1, m=[[1, 2, 3], [4, 5]]), "shape"),
    "matrix with a scalar row": (_with(1, m=[[1, 2, 3], 4]), "shape"),
    "list nested too deep for its shape": (_with(1, x=[[1.0], [2.0], [3.0], [4.0]]), "shape"),
    "number for an array": (_with(1, x=1.0), "shape"),
    "list for a scalar": (_with(1, y=[1.0]), "shape"),
    "msgpack-numpy wrong shape": (_with(1, m=_np_env(np.zeros((3, 2), dtype=np.int16))), "shape"),
    "msgpack-numpy shape of bools": (
        _with(1, bv=_np_env(np.zeros(3, dtype=bool), shape=[True, True, True])),
        "shape",
    ),
    "msgpack-numpy data too short": (
        _with(1, x=_np_env(np.zeros(4, dtype=np.float32), data=b"\x00" * 12)),
        "shape",
    ),
    "msgpack-numpy huge shape, small data": (
        _with(1, x=_np_env(np.zeros(4, dtype=np.float32), shape=[10**12])),
        "shape",
    ),
    "msgpack-numpy scalar for an array": (
        _with(1, x={b"nd": False, b"type": "<f4", b"data": b"\x00" * 4}),
        "shape",
    ),
}
# msgpack cannot write invalid UTF-8 as str, so patch the bytes of a str written as bin.
BAD["invalid utf-8 str"] = (
    _with(1, note="\x01\x02").replace(b"\xa4note\xa2\x01\x02", b"\xa4note\xa2\xff\xfe"),
    "format",
)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_record_rejected_while_good_ones_arrive(case: str) -> None:
    bad, reason = BAD[case]
    values = [_good(0), bad, _good(2), bad, _good(4)]
    block = decode_block(SCHEMA, values)
    check_invariants(SCHEMA, values, block)
    assert block.rejected == [(1, reason), (3, reason)]
    assert block.kept.tolist() == [0, 2, 4]
    assert block.reason_counts() == {reason: 2}
    _assert_rows(block, [_sample(0), _sample(2), _sample(4)])


def test_every_reason_is_exercised() -> None:
    assert {reason for _, reason in BAD.values()} == set(REASONS)


def test_all_bad_records_in_one_block() -> None:
    cases = sorted(BAD)
    values = [BAD[c][0] for c in cases]
    block = decode_block(SCHEMA, values)
    check_invariants(SCHEMA, values, block)
    assert block.rejected == [(i, BAD[c][1]) for i, c in enumerate(cases)]
    assert len(block) == 0


def test_record_failing_on_its_last_feature_leaves_no_partial_row() -> None:
    # bin for x and m, a number for y, then the bool fails: earlier columns must drop their items.
    values = [_good(0), _with(1, bv=b"\x05\x00\x00"), msgpack_numpy.packb(_sample(2))]
    block = decode_block(SCHEMA, values)
    assert block.rejected == [(1, "dtype")]
    _assert_rows(block, [_sample(0), _sample(2)])


def test_a_structural_problem_wins_over_a_feature_problem() -> None:
    # The same record has a missing feature and a too-deep extra key: too_deep is reported.
    record = _plain(1)
    del record["x"]
    record["z"] = _deep_list(SCHEMA.max_depth)
    block = decode_block(SCHEMA, [_pack(record)])
    assert block.rejected == [(0, "too_deep")]


def test_timestamp_in_an_extra_key_is_ignored() -> None:
    block = decode_block(SCHEMA, [_with(1, when=msgpack.Timestamp(1, 2))])
    _assert_rows(block, [_sample(1)])


# -- exhaustive dtype round trips ------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALLOWED_DTYPES)
@pytest.mark.parametrize("shape", [(), (3,), (2, 1, 2)])
def test_every_dtype_and_encoding_round_trips(dtype: str, shape: tuple[int, ...]) -> None:
    schema = Schema((Feature("v", dtype, shape),))
    rng = np.random.default_rng(7)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        arr = rng.integers(0, 2, size=shape).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        arr = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    else:
        arr = rng.standard_normal(size=shape).astype(dt)
    values = [
        encode_record(schema, {"v": arr}),
        msgpack_numpy.packb({"v": arr}),
        msgpack_numpy.packb({"v": arr[()] if not shape else arr}),
        _pack({"v": arr.tolist()}),
    ]
    block = decode_block(schema, values)
    check_invariants(schema, values, block)
    assert block.rejected == []
    for row in block.features["v"]:
        assert row.tobytes() == arr.tobytes()


def test_encode_record_refuses_what_decode_would_reject() -> None:
    with pytest.raises(ValueError, match="lacks feature 'y'"):
        encode_record(SCHEMA, {k: v for k, v in _sample(0).items() if k != "y"})
    with pytest.raises(ValueError, match="does not name"):
        encode_record(SCHEMA, {**_sample(0), "zz": 1})
    with pytest.raises(ValueError, match="shape"):
        encode_record(SCHEMA, {**_sample(0), "x": np.zeros(5, np.float32)})
    with pytest.raises(ValueError, match="do not fit"):
        encode_record(SCHEMA, {**_sample(0), "n": 1.5})
    with pytest.raises(ValueError, match="do not fit"):
        encode_record(SCHEMA, {**_sample(0), "m": np.full((2, 3), 40000)})
    with pytest.raises(ValueError, match="do not fit"):
        encode_record(SCHEMA, {**_sample(0), "b": 1})
    with pytest.raises(ValueError, match="do not fit"):
        encode_record(SCHEMA, {**_sample(0), "y": "text"})
    with pytest.raises(ValueError, match="do not fit"):
        encode_record(SCHEMA, {**_sample(0), "y": 1e39})


# -- Hypothesis ------------------------------------------------------------------------------

FUZZ_SCHEMA = Schema(
    (Feature("a", "int8"), Feature("f", "float16", (2,)), Feature("k", "bool", (1, 2))),
    max_record_bytes=512,
    max_array_len=16,
    max_map_len=16,
    max_depth=4,
)

values_st = st.lists(st.one_of(st.none(), st.binary(max_size=96)), max_size=24)

leaf_st = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.just(msgpack.Timestamp(3, 4)),
)
object_st = st.recursive(
    leaf_st,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.sampled_from(["a", "f", "k", "nd", "x"]), children, max_size=5),
        st.dictionaries(st.sampled_from([b"nd", b"type", b"data", b"shape"]), children, max_size=4),
    ),
    max_leaves=12,
)
near_valid_st = {
    "a": st.one_of(st.integers(-128, 127), st.integers(-200, 200), st.floats(), object_st),
    "f": st.one_of(
        st.lists(st.floats(width=16), min_size=2, max_size=2),
        st.lists(st.one_of(st.floats(), st.integers(-(2**17), 2**17)), min_size=1, max_size=3),
        st.binary(min_size=4, max_size=4),
        st.binary(min_size=3, max_size=5),
        object_st,
    ),
    "k": st.one_of(
        st.lists(st.lists(st.booleans(), min_size=2, max_size=2), min_size=1, max_size=1),
        st.lists(st.lists(st.one_of(st.booleans(), st.integers(0, 1)), max_size=3), max_size=2),
        st.binary(min_size=2, max_size=2),
        object_st,
    ),
}
record_st = st.one_of(
    st.dictionaries(st.sampled_from(["a", "f", "k", "z"]), object_st, max_size=4),
    st.fixed_dictionaries(near_valid_st, optional={"z": object_st}),
)


def _decode_and_check(schema: Schema, values: list[Any]) -> DecodedBlock:
    block = decode_block(schema, values)
    check_invariants(schema, values, block)
    return block


@settings(max_examples=500, deadline=None)
@given(values_st)
def test_arbitrary_bytes_never_raise(values: list[bytes | None]) -> None:
    _decode_and_check(FUZZ_SCHEMA, values)


@settings(max_examples=500, deadline=None)
@given(st.lists(record_st, max_size=8))
def test_arbitrary_msgpack_records_never_raise(records: list[dict[str, Any]]) -> None:
    _decode_and_check(FUZZ_SCHEMA, [_pack(r) for r in records])


# Fragments of msgpack (headers, keys, numbers, caps-busting lengths, ext types): joined at
# random they make structured garbage that reaches far deeper into the decoder than noise.
TOKENS = [
    # map and array headers, some beyond the caps
    *(b"\x80", b"\x81", b"\x82", b"\x83", b"\x8f", b"\xde\x00\x02", b"\xdf\xff\xff\xff\xff"),
    *(b"\x90", b"\x91", b"\x92", b"\x93", b"\xdc\x00\x02", b"\xdd\x00\x01\x00\x00"),
    # feature keys, msgpack-numpy keys and type strings, bins of useful sizes
    *(b"\x81\xa1a", b"\xa1a", b"\xa1f", b"\xa1k", b"\xa2nd", b"\xc4\x02nd", b"\xc4\x04type"),
    *(b"\xc4\x04data", b"\xc4\x05shape", b"\xa3<f2", b"\xa3|b1", b"\xa3<f8", b"\xa3|O8"),
    *(b"\xc4\x00", b"\xc4\x01\x01", b"\xc4\x02\x01\x00", b"\xc4\x04\x00<\x00|"),
    b"\xc6\x7f\xff\xff\xff",
    # numbers at the edges of the dtypes, nil, bools, the reserved byte, strs
    *(b"\x00", b"\x01", b"\x7f", b"\xff", b"\xd0\x80", b"\xcc\xff", b"\xcf" + b"\xff" * 8),
    *(b"\xd3\x80" + b"\x00" * 7, b"\xca\x7f\x80\x00\x00", b"\xcb\x7f\xf8" + b"\x00" * 6),
    *(b"\xcb\x47\xef" + b"\xff" * 6, b"\xc0", b"\xc2", b"\xc3", b"\xc1", b"\xa0", b"\xa2\xff\xfe"),
    # ext types: unknown, timestamp (valid and not)
    *(b"\xd4\x05\x00", b"\xd6\xff\x00\x00\x00\x01", b"\xc7\x03\xffabc", b"\xd5\x01ab"),
]
soup_st = st.lists(st.sampled_from(TOKENS), max_size=24).map(b"".join)


TINY_SCHEMA = Schema((Feature("a", "int8"),), max_record_bytes=64, max_depth=3)


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.one_of(soup_st, st.binary(max_size=64)), max_size=12))
def test_fuzz_msgpack_token_soup_never_raises(values: list[bytes]) -> None:
    _decode_and_check(FUZZ_SCHEMA, values)
    _decode_and_check(TINY_SCHEMA, values)


sample_st = st.fixed_dictionaries(
    {
        "a": st.integers(-128, 127).map(np.int8),
        # Valid samples are finite: NaN and Inf are rejects (tested on their own).
        "f": hnp.arrays(
            np.float16, (2,), elements=st.floats(width=16, allow_nan=False, allow_infinity=False)
        ),
        "k": hnp.arrays(np.bool_, (1, 2)),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(sample_st, min_size=1, max_size=8), st.data())
def test_mutated_records_never_raise(samples: list[dict[str, Any]], data: st.DataObject) -> None:
    values = [encode_record(FUZZ_SCHEMA, s) for s in samples]
    expected: dict[int, str] = {}
    for i, value in enumerate(values):
        op = data.draw(st.sampled_from(["keep", "truncate", "append", "flip", "insert"]))
        if op == "truncate":
            values[i] = value[: data.draw(st.integers(0, len(value) - 1))]
            expected[i] = "truncated"  # msgpack is prefix-free: no strict prefix is complete
        elif op == "append":
            values[i] = value + data.draw(st.binary(min_size=1, max_size=16))
            expected[i] = "extra_data"
        elif op == "flip":
            raw = bytearray(value)
            for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=4)):
                raw[pos] ^= data.draw(st.integers(1, 255))
            values[i] = bytes(raw)
        elif op == "insert":
            pos = data.draw(st.integers(0, len(value)))
            values[i] = value[:pos] + data.draw(st.binary(min_size=1, max_size=8)) + value[pos:]
    block = _decode_and_check(FUZZ_SCHEMA, values)
    reasons = dict(block.rejected)
    for i, reason in expected.items():
        assert reasons.get(i) == reason
    for row, i in enumerate(block.kept.tolist()):
        if values[i] == encode_record(FUZZ_SCHEMA, samples[i]):
            for name in FUZZ_SCHEMA.feature_names:
                got = block.features[name][row]
                assert got.tobytes() == np.asarray(samples[i][name]).tobytes()


@settings(max_examples=300, deadline=None)
@given(st.lists(sample_st, max_size=10), st.sampled_from(["bin", "numpy", "list"]))
def test_valid_samples_round_trip_exactly(samples: list[dict[str, Any]], how: str) -> None:
    if how == "bin":
        values = [encode_record(FUZZ_SCHEMA, s) for s in samples]
    elif how == "numpy":
        values = [msgpack_numpy.packb(s) for s in samples]
    else:
        values = [_pack({k: np.asarray(v).tolist() for k, v in s.items()}) for s in samples]
    block = _decode_and_check(FUZZ_SCHEMA, values)
    assert block.rejected == []
    for name in FUZZ_SCHEMA.feature_names:
        for row, s in zip(block.features[name], samples, strict=True):
            want = np.asarray(s[name])
            if how == "list" and want.dtype.kind == "f":  # NaN payloads may be normalised
                np.testing.assert_array_equal(row, want)
            else:
                assert row.tobytes() == want.tobytes()


# -- variable-length, padded, string and optional features -------------------------------------

KINDS = Schema(
    (
        Feature("ids", "int64", (-1,), max_len=5),
        Feature("pairs", "float32", (-1, 2), max_len=3, default=[]),
        Feature("padded", "int16", (-1,), max_len=4, pad_to=2),
        Feature("user", "string"),
        Feature("tags", "string", (-1,), max_len=3, default=["none"]),
        Feature("names", "string", (2,), default="?"),
        Feature("flags", "bool", (-1,), max_len=3, default=[]),
        Feature("score", "float32", default=0.5),
        Feature("y", "float32"),
    ),
    label="y",
)


def _kinds(i: int, **changes: Any) -> dict[str, Any]:
    """A valid record of KINDS as plain Python values (what a producer packs)."""
    record: dict[str, Any] = {
        "ids": list(range(i % 6)),
        "pairs": [[float(i), -1.5]] * (i % 4),
        "padded": [i, i + 1, i + 2][: 1 + i % 3],
        "user": f"user-{i}",
        "tags": ["a", "b\u00e9"][: i % 3],
        "names": ["n", f"m{i}"],
        "flags": [True, False, True][: i % 4],
        "score": i / 8,
        "y": float(i),
    }
    record.update(changes)
    return {k: v for k, v in record.items() if v is not _DROP}


_DROP = object()


def _ragged(block: DecodedBlock, name: str) -> list[list[Any]]:
    col = block.features[name]
    assert isinstance(col, RaggedColumn)
    splits = np.cumsum(col.row_lengths)[:-1]
    return [part.tolist() for part in np.split(col.values, splits)] if len(col.row_lengths) else []


def test_every_kind_decodes_to_columns_and_ragged_pairs() -> None:
    records = [_kinds(i) for i in range(7)]
    values = [_pack(r) for r in records]
    block = decode_block(KINDS, values)
    check_invariants(KINDS, values, block)
    assert block.rejected == []
    for name in ("ids", "pairs", "padded", "tags", "flags"):
        # Strings come back as they were sent: str from msgpack str, bytes from bin.
        assert _ragged(block, name) == [r[name] for r in records], name
    assert block.features["user"].tolist() == [r["user"] for r in records]
    assert block.features["names"].tolist() == [r["names"] for r in records]
    assert block.features["score"].tolist() == [r["score"] for r in records]
    pairs = block.features["pairs"]
    assert isinstance(pairs, RaggedColumn)
    assert pairs.values.dtype == np.float32 and pairs.values.shape[1:] == (2,)


def test_variable_length_bin_and_msgpack_numpy_and_casts() -> None:
    ids = np.array([5, -7, 2**40], dtype="<i8")
    pairs = np.array([[1, 2], [3, 4]], dtype=np.float64)  # cast to float32
    record = _kinds(
        0,
        ids=ids.tobytes(),
        pairs=msgpack_numpy.encode(pairs),
        padded=_np_env(np.array([1, 2, 3], dtype=np.int8)),  # safe int cast
        flags=b"\x01\x00",
        user=b"\xff\x00 raw bytes",
    )
    empty = _kinds(1, ids=b"", pairs=_np_env(np.zeros((0, 2), dtype="<f4")), padded=[])
    block = decode_block(KINDS, [_pack(record), _pack(empty)])
    check_invariants(KINDS, [0, 1], block)
    assert block.rejected == []
    assert _ragged(block, "ids") == [ids.tolist(), []]
    assert _ragged(block, "pairs") == [pairs.tolist(), []]
    assert _ragged(block, "padded") == [[1, 2, 3], []]
    assert _ragged(block, "flags") == [[True, False], [True]]
    assert block.features["user"].tolist() == [b"\xff\x00 raw bytes", "user-1"]


def test_missing_or_nil_optional_fields_get_defaults_and_unknown_fields_are_ignored() -> None:
    values = [
        _pack(_kinds(2, pairs=_DROP, tags=_DROP, names=_DROP, flags=_DROP, score=_DROP)),
        _pack(_kinds(2, pairs=None, tags=None, names=None, flags=None, score=None)),
        _pack(_kinds(2, added_later={"nested": [1, "x"]}, note="new field")),
    ]
    block = decode_block(KINDS, values)
    check_invariants(KINDS, values, block)
    assert block.rejected == []
    assert _ragged(block, "pairs") == [[], [], [[2.0, -1.5], [2.0, -1.5]]]
    assert _ragged(block, "tags") == [["none"], ["none"], ["a", "b\u00e9"]]
    assert _ragged(block, "flags") == [[], [], [True, False]]
    assert block.features["names"].tolist() == [["?", "?"], ["?", "?"], ["n", "m2"]]
    assert block.features["score"].tolist() == [0.5, 0.5, 0.25]


def test_required_fields_of_the_new_kinds_are_still_required() -> None:
    values = [_pack(_kinds(1, ids=_DROP)), _pack(_kinds(1, user=None)), _pack(_kinds(1))]
    block = decode_block(KINDS, values)
    assert block.rejected == [(0, "schema"), (1, "schema")]


def test_default_of_a_fixed_numeric_feature_mixes_with_numbers() -> None:
    schema = Schema((Feature("a", "int8", default=-3), Feature("v", "float16", (2,), default=1)))
    values = [_pack({"a": 4, "v": [1.5, 2]}), _pack({}), _pack({"v": b"\x00<\x00<"})]
    block = decode_block(schema, values)
    check_invariants(schema, values, block)
    assert block.features["a"].tolist() == [4, -3, -3]
    assert block.features["v"].tolist() == [[1.5, 2.0], [1.0, 1.0], [1.0, 1.0]]


_CAP = KINDS.max_array_len

#: name -> (record, reason) for the new kinds; each replaces one field of a good record.
BAD_KINDS: dict[str, tuple[bytes, str]] = {
    "list over its cap": (_pack(_kinds(1, ids=list(range(6)))), "shape"),
    "list over msgpack's array cap": (_pack(_kinds(1, ids=[0] * (_CAP + 1))), "too_large"),
    "bin over its cap": (_pack(_kinds(1, ids=b"\x00" * 8 * 6)), "shape"),
    "bin of part of a row": (_pack(_kinds(1, ids=b"\x00" * 12)), "shape"),
    "bin of part of an inner row": (_pack(_kinds(1, pairs=b"\x00" * 12)), "shape"),
    "msgpack-numpy over its cap": (
        _pack(_kinds(1, ids=_np_env(np.zeros(6, dtype="<i8")))),
        "shape",
    ),
    "msgpack-numpy huge rows, small data": (
        _pack(_kinds(1, ids=_np_env(np.zeros(2, dtype="<i8"), shape=[10**15]))),
        "shape",
    ),
    "msgpack-numpy wrong inner shape": (
        _pack(_kinds(1, pairs=_np_env(np.zeros((1, 3), dtype="<f4")))),
        "shape",
    ),
    "msgpack-numpy scalar for a list": (
        _pack(_kinds(1, ids={b"nd": False, b"type": "<i8", b"data": b"\x00" * 8})),
        "shape",
    ),
    "ragged inner shape mismatch": (_pack(_kinds(1, pairs=[[1.0, 2.0], [3.0]])), "shape"),
    # A whole-record problem wins over the feature's own (checked once the list is refused).
    "too deep in an id list": (_pack(_kinds(1, ids=_deep_list(KINDS.max_depth))), "too_deep"),
    "good ids, a too deep extra key": (
        _pack(_kinds(1, extra=_deep_list(KINDS.max_depth))),
        "too_deep",
    ),
    "good ids, a bytes key": (_pack({**_kinds(1), b"k": 1}), "format"),
    "flat list for rows": (_pack(_kinds(1, pairs=[1.0, 2.0])), "shape"),
    "nested list for a list of ids": (_pack(_kinds(1, ids=[[1], [2]])), "shape"),
    "number for a list": (_pack(_kinds(1, ids=3)), "shape"),
    "float in an id list": (_pack(_kinds(1, ids=[1, 2.5])), "dtype"),
    "bool in an id list": (_pack(_kinds(1, ids=[1, True])), "dtype"),
    "id out of range": (_pack(_kinds(1, padded=[1, 40000])), "dtype"),
    "int in a bool list": (_pack(_kinds(1, flags=[True, 1])), "dtype"),
    "raw bool byte 2 in a list": (_pack(_kinds(1, flags=b"\x01\x02")), "dtype"),
    "float beyond float32 in rows": (_pack(_kinds(1, pairs=[[1.0, 1e39]])), "dtype"),
    "str in an id list": (_pack(_kinds(1, ids=[1, "2"])), "schema"),
    "str for an id list": (_pack(_kinds(1, ids="1,2")), "schema"),
    "map for an id list": (_pack(_kinds(1, ids={"a": 1})), "schema"),
    "timestamp in an id list": (_pack(_kinds(1, ids=[msgpack.Timestamp(1, 0)])), "format"),
    "number for a string": (_pack(_kinds(1, user=7)), "dtype"),
    "bool for a string": (_pack(_kinds(1, user=True)), "dtype"),
    "list for a string": (_pack(_kinds(1, user=["u"])), "shape"),
    "map for a string": (_pack(_kinds(1, user={"u": 1})), "schema"),
    "timestamp for a string": (_pack(_kinds(1, user=msgpack.Timestamp(1, 0))), "format"),
    "string for a list of strings": (_pack(_kinds(1, tags="a")), "shape"),
    "number in a list of strings": (_pack(_kinds(1, tags=["a", 1])), "dtype"),
    "nil in a list of strings": (_pack(_kinds(1, tags=["a", None])), "schema"),
    "list of strings over its cap": (_pack(_kinds(1, tags=["a"] * 4)), "shape"),
    "too few strings": (_pack(_kinds(1, names=["a"])), "shape"),
    "msgpack-numpy strings": (
        _pack(_kinds(1, names=msgpack_numpy.encode(np.array(["a", "b"])))),
        "dtype",
    ),
    # msgpack cannot write invalid UTF-8 as str: patch a str's bytes.
    "string that is not UTF-8": (
        _pack(_kinds(1, user="\x01\x02")).replace(b"\xa4user\xa2\x01\x02", b"\xa4user\xa2\xff\xfe"),
        "format",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_KINDS))
def test_bad_values_of_the_new_kinds_are_rejected_between_good_ones(case: str) -> None:
    bad, reason = BAD_KINDS[case]
    values = [_pack(_kinds(0)), bad, _pack(_kinds(2)), bad, _pack(_kinds(4))]
    block = decode_block(KINDS, values)
    check_invariants(KINDS, values, block)
    assert block.rejected == [(1, reason), (3, reason)]
    assert _ragged(block, "ids") == [[], [0, 1], [0, 1, 2, 3]]


def test_encode_record_writes_the_new_kinds() -> None:
    sample = {
        "ids": np.array([3, 1], dtype=np.int64),
        "padded": np.zeros(0, dtype=np.int16),
        "user": "u",
        "tags": [b"x"],
        "names": ["a", "b"],
        "y": 2.0,
    }
    value = encode_record(KINDS, sample)
    assert set(msgpack.unpackb(value)) == set(sample)  # optional ones left out
    block = decode_block(KINDS, [value])
    assert block.rejected == []
    assert _ragged(block, "ids") == [[3, 1]] and _ragged(block, "tags") == [[b"x"]]
    assert _ragged(block, "pairs") == [[]] and block.features["score"].tolist() == [0.5]
    with pytest.raises(ValueError, match="shape"):
        encode_record(KINDS, {**sample, "ids": np.zeros(6, dtype=np.int64)})
    with pytest.raises(ValueError, match="where a string belongs"):
        encode_record(KINDS, {**sample, "user": 3})
    with pytest.raises(ValueError, match="lacks feature 'ids'"):
        encode_record(KINDS, {k: v for k, v in sample.items() if k != "ids"})


# Hypothesis: the new kinds with small caps, valid values round-trip and anything else is
# rejected with a reason, never more rows than max_len.

VAR_FUZZ = Schema(
    (
        Feature("i", "int8", (-1,), max_len=4),
        Feature("p", "float16", (-1, 2), max_len=3, default=[]),
        Feature("s", "string"),
        Feature("t", "string", (-1,), max_len=3, default=[]),
        Feature("b", "bool", (-1,), max_len=2, pad_to=1, default=[True]),
    ),
    max_record_bytes=512,
    max_array_len=8,
    max_map_len=16,
    max_depth=4,
)

var_sample_st = st.fixed_dictionaries(
    {
        "i": st.lists(st.integers(-128, 127), max_size=4),
        "p": st.lists(
            st.lists(
                st.floats(width=16, allow_nan=False, allow_infinity=False), min_size=2, max_size=2
            ),
            max_size=3,
        ),
        "s": st.one_of(st.text(max_size=6), st.binary(max_size=6)),
        "t": st.lists(st.text(max_size=3), max_size=3),
        "b": st.lists(st.booleans(), max_size=2),
    }
)
var_record_st = st.one_of(
    st.dictionaries(st.sampled_from(["i", "p", "s", "t", "b", "z"]), object_st, max_size=5),
    st.fixed_dictionaries(
        {
            "i": st.one_of(
                st.lists(st.integers(-300, 300), max_size=9),
                st.binary(max_size=40),
                object_st,
            ),
            "s": st.one_of(st.text(max_size=4), st.binary(max_size=4), object_st),
        },
        optional={
            "p": st.one_of(
                st.lists(st.lists(st.floats(), min_size=1, max_size=3), max_size=5),
                st.binary(max_size=20),
                object_st,
            ),
            "t": st.lists(st.one_of(st.text(max_size=2), st.integers(-(2**63), 2**63)), max_size=5),
            "b": st.one_of(st.lists(st.booleans(), max_size=4), st.binary(max_size=3), object_st),
        },
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(var_record_st, max_size=8))
def test_fuzz_new_kinds_never_raise_and_respect_the_caps(records: list[dict[str, Any]]) -> None:
    values = [_pack(r) for r in records]
    _decode_and_check(VAR_FUZZ, values)


@settings(max_examples=800, deadline=None)
@given(st.lists(st.one_of(soup_st, st.binary(max_size=64)), max_size=12))
def test_fuzz_new_kinds_token_soup_never_raises(values: list[bytes]) -> None:
    _decode_and_check(VAR_FUZZ, values)


@settings(max_examples=300, deadline=None)
@given(st.lists(var_sample_st, max_size=8), st.sampled_from(["list", "bin"]))
def test_valid_new_kind_samples_round_trip_exactly(samples: list[dict[str, Any]], how: str) -> None:
    records = []
    for s in samples:
        record = dict(s)
        if how == "bin":
            record["i"] = np.array(s["i"], dtype=np.int8).tobytes()
            record["p"] = np.array(s["p"], dtype="<f2").reshape(-1, 2).tobytes()
            record["b"] = np.array(s["b"], dtype=bool).tobytes()
        records.append(record)
    values = [_pack(r) for r in records]
    block = _decode_and_check(VAR_FUZZ, values)
    assert block.rejected == []
    assert _ragged(block, "i") == [s["i"] for s in samples]
    got_p = _ragged(block, "p")
    for got, s in zip(got_p, samples, strict=True):
        want = np.array(s["p"], dtype=np.float16).reshape(-1, 2)
        np.testing.assert_array_equal(np.array(got, dtype=np.float16).reshape(-1, 2), want)
    assert block.features["s"].tolist() == [s["s"] for s in samples]
    assert _ragged(block, "t") == [s["t"] for s in samples]
    assert _ragged(block, "b") == [s["b"] for s in samples]


@pytest.mark.parametrize("dtype", [d for d in ALLOWED_DTYPES if d != "bool"])
def test_flat_lists_of_every_numeric_dtype_keep_the_dtype_rules(dtype: str) -> None:
    # Lists of numbers are checked inline (types, then min/max only where msgpack's own
    # integer range does not already fit the dtype): every edge of every dtype.
    dt = np.dtype(dtype)
    # NaN and Inf are the edges of a float dtype that allows them (else they are dtype).
    schema = Schema((Feature("v", dtype, (-1,), max_len=4, allow_non_finite=dt.kind == "f"),))
    if dt.kind in "iu":
        info = np.iinfo(dt)
        edges = [int(info.min), int(info.max), 0]
        below, above = int(info.min) - 1, int(info.max) + 1
        outside = [v for v in (below, above) if -(2**63) <= v <= 2**64 - 1]
        wrong = [1.0, True]
    else:
        fmax = float(np.finfo(dt).max)
        edges = [-fmax, fmax, 0, 1, float("nan"), float("inf")]
        outside = [] if dt.itemsize == 8 else [fmax * 4, -fmax * 4]
        wrong = [True]
    good = [_pack({"v": edges[:2]}), _pack({"v": []}), _pack({"v": edges[2:][:4]})]
    bad = [_pack({"v": [0, v]}) for v in outside] + [_pack({"v": [0, v]}) for v in wrong]
    nan_first = _pack({"v": [float("nan"), *outside]}) if outside and dt.kind == "f" else None
    if nan_first is not None:
        bad.append(nan_first)
    block = decode_block(schema, good + bad)
    check_invariants(schema, good + bad, block)
    assert block.kept.tolist() == [0, 1, 2]
    assert [reason for _, reason in block.rejected] == ["dtype"] * len(bad)
    got = _ragged(block, "v")
    np.testing.assert_array_equal(np.array(got[0], dtype=dt), np.array(edges[:2], dtype=dt))
    np.testing.assert_array_equal(np.array(got[2], dtype=dt), np.array(edges[2:][:4], dtype=dt))


def test_explain_reject_names_the_feature_expected_and_found() -> None:
    from streamer.decode.records import explain_reject

    schema = Schema(
        (
            Feature("x", "float32", (8,)),
            Feature("ids", "int64", (-1,), max_len=3),
            Feature("y", "float32"),
        )
    )
    ok = {"x": np.zeros(8, np.float32).tobytes(), "ids": [1], "y": 1.0}
    cases = {
        "shape: x expected [8] float32 (32 bytes as bin), got 64 bytes (bin)": {
            **ok,
            "x": np.zeros(16, np.float32).tobytes(),
        },
        "schema: y expected [] float32, got nothing (the field is missing and has no default)": {
            k: v for k, v in ok.items() if k != "y"
        },
        "shape: ids expected [0..3] int64, got a list of shape [5]": {**ok, "ids": [1] * 5},
        "schema: y expected [] float32, got a string": {**ok, "y": "one"},
        "dtype: y holds NaN or Inf (allow_non_finite = true lets them in)": {**ok, "y": math.inf},
    }
    for expected, record in cases.items():
        assert explain_reject(schema, _pack(record)) == expected
    assert explain_reject(schema, b"\xc1").startswith("format: ")
    assert explain_reject(schema, None).startswith("truncated: ")
    assert explain_reject(schema, _pack(ok)) == "accepted"


def test_a_float_just_beyond_the_dtype_is_the_same_as_a_scalar_and_in_a_list() -> None:
    """Refused when it would become inf, in every encoding; one that rounds to the largest
    value is taken, rounded (a scalar was refused and the same value in a list taken)."""
    top = float(np.finfo(np.float32).max)
    rounds_down = float(np.nextafter(top, np.inf))  # float64: just above, rounds to top
    scalar = Schema((Feature("a", "float32"),))
    vector = Schema((Feature("a", "float32", (1,)),))
    for value, kept in ((rounds_down, True), (3.4028236e38, False), (-1e39, False)):
        one = decode_block(scalar, [_pack({"a": value})])
        listed = decode_block(vector, [_pack({"a": [value]})])
        assert len(one) == len(listed) == int(kept), value
        if kept:
            assert one.features["a"].tolist() == [top]
            assert listed.features["a"].tolist() == [[top]]
        else:
            assert one.rejected == listed.rejected == [(0, "dtype")]
