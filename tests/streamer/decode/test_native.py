"""The compiled fast path of decode_block against the reference (a differential test): the
same input gives the same columns, the same kept rows and the same rejects, reason for reason,
over the bad-input corpus, Hypothesis' records in every encoding, mutated records and msgpack
token soup. Also: the extension is built here, it takes the records it should (a fast path
that fell back on everything would pass the rest), and it lets other threads run."""

from __future__ import annotations

import os
import struct
import threading
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.decode import native
from streamer.decode.records import DecodedBlock, decode_block, decode_block_python, encode_record
from streamer.decode.schema import Feature, Schema
from streamer.input.simulator import SimulatorTask
from tests.streamer.decode.test_records import TOKENS, check_invariants

SCHEMA = Schema(
    (
        Feature("a", "int8"),
        Feature("n", "int64"),
        Feature("u", "uint64"),
        Feature("x", "float32", (4,)),
        Feature("d", "float64"),
        Feature("k", "bool", (3,)),
        Feature("m", "int16", (2, 2)),
        Feature("s", "float32", allow_non_finite=True),
        Feature("w", "float32", default=1.5),
        Feature("v", "uint8", (2,)),
    ),
    max_record_bytes=1024,
    max_array_len=16,
    max_map_len=16,
    max_depth=4,
)
SIMULATOR = SimulatorTask().schema()

#: CI (.ci/run) sets REQUIRE_NATIVE_DECODER=1: there the extension must be built, and no test
#: here skips. Elsewhere (an install without a C compiler) the reference runs alone.
REQUIRED = os.environ.get("REQUIRE_NATIVE_DECODER") == "1"
needs_native = pytest.mark.skipif(
    not native.AVAILABLE and not REQUIRED,
    reason=f"the compiled decoder is not built here: {native.NOT_AVAILABLE_WHY}",
)


def _same(schema: Schema, values: list[Any]) -> DecodedBlock:
    """decode_block (native first) and the reference give the same block."""
    got = decode_block(schema, values)
    want = decode_block_python(schema, values)
    check_invariants(schema, values, got)
    assert got.kept.tolist() == want.kept.tolist()
    assert got.rejected == want.rejected
    for name in schema.feature_names:
        g, w = got.features[name], want.features[name]
        assert isinstance(g, np.ndarray) and isinstance(w, np.ndarray)
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert g.tobytes() == w.tobytes(), name  # bit for bit: NaNs, signed zeros and all
    return got


@needs_native
def test_it_is_built() -> None:
    """pip install builds it wherever a C compiler is (CI, the README's commands)."""
    assert native.AVAILABLE, native.NOT_AVAILABLE_WHY
    assert native.decoder_name(SIMULATOR) == "native"
    assert native.native_plan(SCHEMA) is not None


@needs_native
def test_schemas_it_does_not_take_go_to_the_reference() -> None:
    for features in (
        (Feature("t", "string"),),
        (Feature("r", "int64", (-1,), max_len=4),),
        (Feature("h", "float16", (2,)),),
    ):
        schema = Schema((*features, Feature("y", "float32")))
        assert native.native_plan(schema) is None
        assert native.decoder_name(schema) == "python"
        assert "fixed-shape numeric features only" in str(native.why_python(schema))


@needs_native
def test_the_simulators_records_are_all_taken_by_the_fast_path() -> None:
    values = SimulatorTask().records(500, np.random.default_rng(0), 256)
    plan = native.native_plan(SIMULATOR)
    assert plan is not None
    taken, _ = plan.decode(values)
    assert taken.all()
    _same(SIMULATOR, values)


@needs_native
def test_every_encoding_of_good_records_is_taken_and_equal() -> None:
    rng = np.random.default_rng(1)
    sample = {
        "a": -7,
        "n": -(2**40),
        "u": 2**64 - 1,
        "x": rng.standard_normal(4).astype(np.float32),
        "d": 1e300,
        "k": np.array([True, False, True]),
        "m": np.array([[1, -2], [300, -32768]], np.int16),
        "s": 0.1,
        "w": 2.5,
        "v": np.array([0, 255], np.uint8),
    }
    as_lists = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in sample.items()}
    values = [
        encode_record(SCHEMA, sample),  # bin
        msgpack.packb({**as_lists, "m": sample["m"].tobytes()}),  # lists, m as bin
        msgpack.packb({**as_lists, "m": sample["m"].tobytes(), "extra": "ok", "z": None}),
        msgpack.packb({**as_lists, "m": sample["m"].tobytes(), "x": [1, 2, -3, 16777216]}),
        msgpack.packb({**as_lists, "m": sample["m"].tobytes(), "b": b"\x00\xff"}),
    ]
    plan = native.native_plan(SCHEMA)
    assert plan is not None
    taken, _ = plan.decode(values)
    assert taken.all(), taken
    block = _same(SCHEMA, values)
    assert len(block) == len(values)


#: Records the fast path leaves to the reference: rejects of every reason, defaults, NaN,
#: nested lists, msgpack-numpy maps, containers among the extra keys, edge numbers.
def _edge_values() -> list[bytes]:
    good = {
        "a": 1, "n": 2, "u": 3, "x": [1.0, 2.0, 3.0, 4.0], "d": 0.5, "k": [True, False, True],
        "m": b"\x00" * 8, "s": 1.0, "w": 0.0, "v": [1, 2],
    }  # fmt: skip
    packed = msgpack.packb(good)
    out = [packed]
    variants: list[dict[str, Any]] = [
        {"w": None},
        {"s": float("nan")},
        {"s": float("inf")},
        {"d": float("nan")},
        {"x": [1.0, float("nan"), 3.0, 4.0]},
        {"x": struct.pack("<4f", 1.0, float("inf"), 0.0, 0.0)},
        {"x": [1e39, 0.0, 0.0, 0.0]},
        {"x": [3.4028235e38, 0.0, 0.0, 0.0]},
        {"x": [16777217, 0, 0, 0]},
        {"x": [1.0, 2.0, 3.0]},
        {"x": [[1.0, 2.0], [3.0, 4.0]]},
        {"m": [[1, 2], [3, 4]]},
        {"m": [[1, 2], [3, 40000]]},
        {"a": 128},
        {"a": -129},
        {"a": 1.0},
        {"a": True},
        {"n": 2**63},
        {"u": -1},
        {"v": [1, 256]},
        {"k": [1, 0, 1]},
        {"k": b"\x00\x02\x01"},
        {"k": b"\x00\x01\x01"},
        {"d": 7},
        {"d": 2**60},
        {"s": 2**30},
        {"x": msgpack_numpy.encode(np.zeros(4, np.float32))},
        {"x": msgpack_numpy.encode(np.zeros(4, np.float64))},
        {"z": [1, 2]},
        {"z": {"q": 1}},
        {"z": msgpack.ExtType(3, b"ab")},
        {"z": msgpack.Timestamp(1, 2)},
        {"a": msgpack.Timestamp(1, 2)},
        {"a": "1"},
        {"x": "abcd"},
        {"x": b"\x00" * 15},
    ]
    out += [msgpack.packb({**good, **v}, datetime=False) for v in variants]
    missing = dict(good)
    del missing["w"]  # the default
    out.append(msgpack.packb(missing))
    del missing["a"]  # no default: schema
    out.append(msgpack.packb(missing))
    out += [
        packed[:-1],  # truncated
        packed + b"\x00",  # extra data
        b"",
        b"\xc1",
        b"\x90",
        packed.replace(b"\xa1a", b"\xa1n", 1),  # a key twice
        packed.replace(b"\xa1a", b"\xc4\x01a", 1),  # a bin key
        packed.replace(b"\xa1a", b"\xa1\xff", 1),  # a key that is not UTF-8
        msgpack.packb({**good, "note": "é"}),
        msgpack.packb({**good, "note": "é"}).replace("é".encode(), b"\xed\xa0"),  # surrogate
        msgpack.packb({str(i): i for i in range(20)}),  # more keys than max_map_len
    ]
    return out


@needs_native
def test_edge_records_are_the_references() -> None:
    values: list[Any] = _edge_values()
    values += [None, bytearray(values[0]), memoryview(values[0])]
    block = _same(SCHEMA, values)
    assert block.kept.tolist()[:1] == [0] and len(block.rejected) > 20


@needs_native
def test_a_caller_bug_is_still_named_by_its_index() -> None:
    good = _edge_values()[0]
    with pytest.raises(TypeError, match=r"values\[2\] is str"):
        decode_block(SCHEMA, [good, good, "abc"])  # type: ignore[list-item]


number_st = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(-300, 300),
    st.floats(),
    st.floats(width=32),
    st.booleans(),
    st.none(),
)
value_st = st.one_of(
    number_st,
    st.lists(number_st, min_size=0, max_size=5),
    st.lists(st.lists(number_st, min_size=2, max_size=2), min_size=2, max_size=2),
    st.binary(max_size=34),
    st.sampled_from([b"\x00" * 16, b"\x01\x00\x01", b"\x00" * 8, b"\x01\x02", b"\x00" * 4]),
    st.text(max_size=3),
)
key_st = st.sampled_from(["a", "n", "u", "x", "d", "k", "m", "s", "w", "v", "z", "extra"])


@needs_native
@settings(max_examples=1500, deadline=None)
@given(st.lists(st.dictionaries(key_st, value_st, max_size=12), max_size=10))
def test_arbitrary_records_are_the_references(records: list[dict[str, Any]]) -> None:
    _same(SCHEMA, [msgpack.packb(r) for r in records])


sample_st = st.fixed_dictionaries(
    {
        "a": st.integers(-128, 127),
        "n": st.integers(-(2**63), 2**63 - 1),
        "u": st.integers(0, 2**64 - 1),
        "x": st.lists(st.floats(width=32, allow_nan=False), min_size=4, max_size=4),
        "d": st.floats(allow_nan=False),
        "k": st.lists(st.booleans(), min_size=3, max_size=3),
        "m": st.binary(min_size=8, max_size=8),
        "s": st.floats(width=32),
        "w": st.floats(width=32, allow_nan=False),
        "v": st.lists(st.integers(0, 255), min_size=2, max_size=2),
    },
    optional={
        "extra": st.one_of(
            st.integers(-(2**63), 2**64 - 1), st.text(max_size=4), st.binary(max_size=4)
        )
    },
)


@needs_native
@settings(max_examples=500, deadline=None)
@given(st.lists(sample_st, min_size=1, max_size=8), st.data())
def test_mutated_records_are_the_references(
    samples: list[dict[str, Any]], data: st.DataObject
) -> None:
    values = [msgpack.packb(s) for s in samples]
    for i, value in enumerate(values):
        op = data.draw(st.sampled_from(["keep", "keep", "truncate", "append", "flip", "insert"]))
        if op == "truncate":
            values[i] = value[: data.draw(st.integers(0, len(value) - 1))]
        elif op == "append":
            values[i] = value + data.draw(st.binary(min_size=1, max_size=8))
        elif op == "flip":
            raw = bytearray(value)
            for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=3)):
                raw[pos] ^= data.draw(st.integers(1, 255))
            values[i] = bytes(raw)
        elif op == "insert":
            pos = data.draw(st.integers(0, len(value)))
            values[i] = value[:pos] + data.draw(st.binary(min_size=1, max_size=6)) + value[pos:]
    _same(SCHEMA, values)


soup_st = st.lists(
    st.sampled_from([*TOKENS, b"\xa1n", b"\xa1u", b"\xa1x", b"\xa1m", b"\xa1v", b"\x8a"]),
    max_size=30,
).map(b"".join)


@needs_native
@settings(max_examples=2000, deadline=None)
@given(st.lists(st.one_of(soup_st, st.binary(max_size=48)), max_size=10))
def test_token_soup_is_the_references(values: list[bytes]) -> None:
    _same(SCHEMA, values)
    _same(SIMULATOR, values)


@needs_native
def test_the_bad_input_corpus_is_the_references() -> None:
    from tests.reliability.test_bad_input import CORPUS

    good = SimulatorTask().records(3, np.random.default_rng(2))
    values: list[Any] = [v for v, _ in CORPUS.values()]
    _same(SIMULATOR, [*good, *values, *good])


@needs_native
def test_the_gil_is_released_while_it_parses() -> None:
    """Another thread runs during one call: a decode that held the GIL would stop it."""
    values = SimulatorTask().records(2000, np.random.default_rng(3), 256) * 25  # 50,000
    plan = native.native_plan(SIMULATOR)
    assert plan is not None
    ticks = 0
    inside = threading.Event()
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        inside.wait()
        while not done.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        before = ticks
        inside.set()
        taken, _ = plan.decode(values)  # holds the GIL only around the parse
        during = ticks - before
    finally:
        done.set()
        counter.join()
    assert taken.all()
    assert during > 0, "no other thread ran during the decode"


@needs_native
def test_it_can_be_turned_off() -> None:
    assert native.native_plan(SIMULATOR, "python") is None
    assert native.decoder_name(SIMULATOR, "python") == "python"
    assert native.why_python(SIMULATOR, "python") == "--decoder python"
    assert native.native_plan(SIMULATOR) is not None  # the default is auto


@needs_native
def test_a_schema_of_more_features_than_a_taken_record_may_hold_keys_is_the_references() -> None:
    many = Schema(tuple(Feature(f"f{i}", "int8") for i in range(65)))
    assert native.native_plan(many) is None
    some = Schema(tuple(Feature(f"f{i}", "int8") for i in range(64)))
    plan = native.native_plan(some)
    assert plan is not None
    taken, _ = plan.decode([msgpack.packb({f"f{i}": i for i in range(64)})])
    assert taken.tolist() == [True]
