"""decode_block: msgpack records to one array per feature, bad records set aside with a reason.

Pure code (numpy and msgpack only) so that it can be tested alone and run inside one
``tf.numpy_function`` call per block.

Accepted encodings of a feature value:

1. msgpack ``bin`` with the raw little-endian bytes of exactly ``feature.nbytes`` bytes;
2. a msgpack number, for a scalar feature;
3. (nested) msgpack arrays of numbers of exactly the feature's shape;
4. the msgpack-numpy map (keys ``nd``, ``type``, ``kind``, ``shape``, ``data`` as bin or str).

A variable-length feature (shape ``[-1, ...]``) takes the same encodings with any number of
rows up to its ``max_len`` (bin: a whole number of rows; lists: rows of the inner shape;
msgpack-numpy: shape ``[rows, *inner]``); more rows is ``shape``, checked before any array is
built. A string feature takes msgpack ``str`` (UTF-8, validated by msgpack: invalid UTF-8
anywhere in a record is ``format``) or ``bin`` (bytes as they are), as lists of them when
shaped; a number there is ``dtype``. A missing field, or nil, takes the feature's default;
without one it is ``schema``.

Dtype rules, the same for every encoding: a bool feature takes bools only; an integer
feature takes integers only (never a bool or a float) whose values fit its dtype; a float
feature takes integers and floats (never a bool), rounded to the nearest value of its dtype,
except that a finite value beyond the dtype's range is refused (it would become inf).
Raw ``bin`` bytes of a bool feature must be 0 or 1. NaN and ±Inf in a float feature, in any
encoding, are ``dtype`` unless the feature says ``allow_non_finite = true`` (checked once per
block and column, after assembly: one ``np.isfinite`` pass).

A record whose map holds a key twice is ``format`` (msgpack would keep the last value
silently, so two producers' fields could shadow each other).

A record's keys other than the features are ignored, but they count toward the limits, and
an ext type anywhere is ``format``; msgpack builds its Timestamp ext itself, so a Timestamp
is refused (``format``) only where it is a feature's value. Whole-record problems (not a
map, non-str keys, nesting) win over a feature's ``schema``/``dtype``/``shape``.

How msgpack 1.2 (C extension) fails, and the reason each becomes: ``ExtraData`` ->
``extra_data``; ``ValueError("Unpack failed: incomplete input")`` -> ``truncated``;
``ValueError("N exceeds max_{bin,str,array,map,ext}_len")`` -> ``too_large``; ``StackError``
(its own 1024-level stack) -> ``too_deep``; ``FormatError``, ``UnicodeDecodeError``, the
strict_map_key ``ValueError``, "invalid timestamp data" and our ext_hook's refusal ->
``format``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import msgpack
import numpy as np
import numpy.typing as npt

from streamer.decode.native import native_plan
from streamer.decode.ragged import Column, RaggedColumn, mask_rows
from streamer.decode.schema import Schema
from streamer.decode.values import (
    BOOL_BYTES,
    MISSING,
    NUMBER_TYPES,
    REASONS,
    FeaturePlan,
    Reason,
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

__all__ = [
    "REASONS",
    "Column",
    "DecodedBlock",
    "RaggedColumn",
    "Reason",
    "decode_block",
    "decode_block_python",
    "encode_record",
    "explain_reject",
    "prepare_block",
]


@dataclass(frozen=True, slots=True)
class DecodedBlock:
    """The decoded records of one block.

    ``features[name]`` has shape ``[len(kept), *feature.shape]`` and the feature's dtype
    (``object`` holding str or bytes for a string feature); a variable-length feature's is a
    ``RaggedColumn``: ``values`` of shape ``[rows, *inner_shape]`` and ``row_lengths``
    (int64, one per record). Row ``r`` comes from ``values[kept[r]]``. ``rejected`` lists
    ``(index, reason)`` of the other records, in ascending index order.
    """

    features: dict[str, Column]
    kept: npt.NDArray[np.int64]
    rejected: list[tuple[int, str]]

    def __len__(self) -> int:
        return len(self.kept)

    @property
    def needs_values(self) -> list[int]:
        """The rows whose raw values are still wanted: the rejects (dead letters, the log)."""
        return [i for i, _ in self.rejected]

    def select(self, keep: npt.NDArray[np.bool_]) -> DecodedBlock:
        """The decode of the block's rows where ``keep`` is True, renumbered as that block's.

        >>> from streamer.decode.schema import Feature, Schema
        >>> s = Schema((Feature("y", "int64"),))
        >>> d = decode_block(s, [encode_record(s, {"y": 1}), b"\\xc1", encode_record(s, {"y": 3})])
        >>> e = d.select(np.array([False, True, True]))
        >>> e.features["y"].tolist(), e.kept.tolist(), e.rejected
        ([3], [1], [(0, 'format')])
        """
        renumber = np.cumsum(keep) - 1
        rows = keep[self.kept]
        features = {name: mask_rows(column, rows) for name, column in self.features.items()}
        kept = renumber[self.kept[rows]].astype(np.int64)
        rejected = [(int(renumber[i]), r) for i, r in self.rejected if keep[i]]
        return DecodedBlock(features, kept, rejected)

    def reason_counts(self) -> dict[str, int]:
        """How many records were rejected for each reason (reasons with none left out)."""
        counts: dict[str, int] = {}
        for _, reason in self.rejected:
            counts[reason] = counts.get(reason, 0) + 1
        return counts


# -- internals ------------------------------------------------------------------------------


class _ExtRejected(Exception):
    """Raised from msgpack's ext_hook: no extension type is ever turned into an object."""


def _reject_ext(code: int, data: bytes) -> NoReturn:
    raise _ExtRejected(code)


_NUMBER_TYPES: Final = NUMBER_TYPES
_STR_ONLY: Final = frozenset({str})


class _Plan:
    __slots__ = ("features", "finite", "max_depth", "max_record_bytes", "unpack")

    def __init__(self, schema: Schema) -> None:
        self.features = tuple(FeaturePlan(f) for f in schema.features)
        self.finite = tuple(fp.name for fp in self.features if fp.finite_only)
        self.max_depth = schema.max_depth
        self.max_record_bytes = schema.max_record_bytes
        self.unpack = functools.partial(
            msgpack.unpackb,
            raw=False,
            strict_map_key=True,
            use_list=True,
            timestamp=0,
            ext_hook=_reject_ext,
            max_bin_len=schema.max_record_bytes,
            max_str_len=schema.max_record_bytes,
            max_ext_len=schema.max_record_bytes,
            max_array_len=schema.max_array_len,
            max_map_len=schema.max_map_len,
        )


@functools.lru_cache(maxsize=32)
def _plan_for(schema: Schema) -> _Plan:
    return _Plan(schema)


def _unpack_reason(exc: ValueError) -> Reason:
    """Classify an error of ``msgpack.unpackb`` (C extension, msgpack 1.2.x).

    Every ValueError it raises comes from the input, so an unknown one is still ``format``.
    """
    if isinstance(exc, msgpack.ExtraData):
        return "extra_data"
    if isinstance(exc, msgpack.StackError):
        return "too_deep"
    if isinstance(exc, msgpack.FormatError | UnicodeDecodeError):
        return "format"
    message = str(exc)
    if "incomplete input" in message:
        return "truncated"
    if "exceeds max_" in message:
        return "too_large"
    # "... is not allowed for map key", "invalid timestamp data", and anything new.
    return "format"


def _map_header_len(value: bytes) -> int:
    """The key count a msgpack map's header declares (-1 when ``value`` is not a map)."""
    first = value[0]
    if 0x80 <= first <= 0x8F:
        return first & 0x0F
    if first == 0xDE:
        return int.from_bytes(value[1:3], "big")
    if first == 0xDF:
        return int.from_bytes(value[1:5], "big")
    return -1


def _non_finite_rows(column: Column, n: int) -> npt.NDArray[np.bool_] | None:
    """Which of the ``n`` rows of a float column hold a NaN or ±Inf (None: none does)."""
    values = column.values if isinstance(column, RaggedColumn) else column
    finite = np.isfinite(values)
    if finite.all():
        return None
    bad_values = ~finite.reshape(len(values), -1).all(axis=1)
    if not isinstance(column, RaggedColumn):
        return bad_values
    rows = np.repeat(np.arange(n), column.row_lengths)
    bad = np.zeros(n, dtype=bool)
    bad[rows[bad_values]] = True
    return bad


def _drop_non_finite(
    names: tuple[str, ...],
    arrays: dict[str, Column],
    kept: npt.NDArray[np.int64],
    rejected: list[tuple[int, str]],
) -> tuple[dict[str, Column], npt.NDArray[np.int64], list[tuple[int, str]]]:
    """Rows with a NaN or ±Inf in a finite-only float feature move from kept to ``dtype``."""
    n = len(kept)
    bad: npt.NDArray[np.bool_] | None = None
    for name in names:
        rows = _non_finite_rows(arrays[name], n)
        if rows is not None:
            bad = rows if bad is None else bad | rows
    if bad is None:
        return arrays, kept, rejected
    keep = ~bad
    arrays = {name: mask_rows(column, keep) for name, column in arrays.items()}
    refused = [(int(i), "dtype") for i in kept[bad]]
    return arrays, kept[keep], sorted(rejected + refused)


def _too_deep(obj: list[Any] | dict[Any, Any], budget: int) -> bool:
    """Whether ``obj`` nests more than ``budget`` containers deep (itself counting as 1)."""
    if budget <= 0:
        return True
    children = obj.values() if type(obj) is dict else obj
    types = set(map(type, children))
    if list in types or dict in types:
        for child in children:
            kind = type(child)
            if (kind is list or kind is dict) and _too_deep(child, budget - 1):
                return True
    return False


_CONTAINERS = (list, dict)


def _check_structure(record: dict[Any, Any], max_depth: int) -> None:
    """Reject a record whose top-level keys are not all str, or that nests too deep."""
    if not _STR_ONLY.issuperset(map(type, record)):
        raise Rejected("format")
    inner = set(map(type, record.values()))
    if (list in inner or dict in inner) and _too_deep(record, max_depth):
        raise Rejected("too_deep")


def _as_bytes(index: int, value: object) -> bytes:
    if value is None:  # a Kafka tombstone: nothing to decode
        return b""
    if isinstance(value, bytes):  # a subclass such as numpy.bytes_
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"decode_block: values[{index}] is {type(value).__name__}, expected bytes")


def _convert(fp: FeaturePlan, value: object) -> Any:
    """One feature value as raw wire bytes, a Python scalar or an array of the feature's dtype;
    for strings and variable-length features, the items of ``decode_values``."""
    if value is MISSING or value is None:
        if fp.default_item is not None:
            return fp.default_item
        raise Rejected("schema")  # missing or nil, and no default
    if fp.special:
        if fp.variable:
            return variable_value(fp, value)
        return string_value(fp, value)
    kind = type(value)
    if kind is bytes:
        assert isinstance(value, bytes)
        if len(value) != fp.nbytes:
            raise Rejected("shape")
        if fp.kind == "b" and value.translate(None, BOOL_BYTES):
            raise Rejected("dtype")
        return value
    if kind in _NUMBER_TYPES:
        if fp.shape:
            raise Rejected("shape")
        return scalar(fp, value)
    if kind is list:
        assert isinstance(value, list)
        return from_lists(fp, value)
    if kind is dict:
        assert isinstance(value, dict)
        return from_numpy_map(fp, value)
    if kind is msgpack.Timestamp:  # the one ext type msgpack builds itself
        raise Rejected("format")
    raise Rejected("schema")  # a str


def _assemble(fp: FeaturePlan, column: list[Any], mixed: bool, n: int) -> Column:
    if fp.variable:
        return assemble_variable(fp, column)
    if fp.string:
        return assemble_strings(fp, column, n)
    return assemble_fixed(fp, column, mixed, n)


# -- public ---------------------------------------------------------------------------------


def decode_block(
    schema: Schema, values: Sequence[bytes | None], decoder: str = "auto"
) -> DecodedBlock:
    """Decode a block of msgpack records; each record decodes whole or is rejected.

    The compiled fast path (``streamer.decode.native``) takes the records it is sure of, the
    GIL released; the reference (``decode_block_python``) decides every other one. The result
    is the reference's, record for record. ``decoder``: ``--decoder`` (``python``: the
    reference alone).

    >>> from streamer.decode.schema import Feature, Schema
    >>> s = Schema((Feature("x", "float32", (2,)), Feature("y", "int64")), label="y")
    >>> good = encode_record(s, {"x": np.array([1, 2], np.float32), "y": 3})
    >>> block = decode_block(s, [good, b"\\xc1", good[:-1], good])
    >>> block.features["x"].tolist(), block.kept.tolist(), block.rejected
    ([[1.0, 2.0], [1.0, 2.0]], [0, 3], [(1, 'format'), (2, 'truncated')])
    """
    plan = native_plan(schema, decoder)
    if plan is None or not len(values):
        return decode_block_python(schema, values)
    taken, columns = plan.decode(values)
    if taken.all():
        return DecodedBlock(dict(columns), np.arange(len(values), dtype=np.int64), [])
    # The records the fast path left: the reference decides them (a caller's bug, a value
    # that is not bytes, is still named by its index in ``values``).
    rest = np.flatnonzero(~taken)
    ref = decode_block_python(schema, [_as_bytes(int(i), values[int(i)]) for i in rest])
    fast = np.flatnonzero(taken)
    slow = rest[ref.kept]
    rejected = [(int(rest[i]), reason) for i, reason in ref.rejected]
    features: dict[str, Column] = {}
    if not len(slow):
        features = {name: column[fast] for name, column in columns.items()}
        return DecodedBlock(features, fast.astype(np.int64), rejected)
    rows = np.concatenate([fast, slow])
    order = np.argsort(rows, kind="stable")
    for name, column in columns.items():
        theirs = ref.features[name]
        assert isinstance(theirs, np.ndarray)  # fixed-shape numbers only reach the fast path
        features[name] = np.concatenate([column[fast], theirs])[order]
    return DecodedBlock(features, rows[order].astype(np.int64), rejected)


def decode_block_python(schema: Schema, values: Sequence[bytes | None]) -> DecodedBlock:
    """The reference decoder, pure Python: each record decodes whole or is rejected.

    >>> from streamer.decode.schema import Feature, Schema
    >>> s = Schema((Feature("x", "float32", (2,)), Feature("y", "int64")), label="y")
    >>> good = encode_record(s, {"x": np.array([1, 2], np.float32), "y": 3})
    >>> block = decode_block(s, [good, b"\\xc1", good[:-1]])
    >>> block.features["x"].tolist(), block.kept.tolist(), block.rejected
    ([[1.0, 2.0]], [0], [(1, 'format'), (2, 'truncated')])

    ``values`` may hold None (a Kafka tombstone: rejected as ``truncated``), bytearray or
    memoryview; any other type is a caller's bug and raises TypeError. Whatever the bytes,
    the result is rows matching the schema or a rejection with one of ``REASONS``.
    """
    plan = _plan_for(schema)
    features = plan.features
    unpack = plan.unpack
    max_bytes = plan.max_record_bytes
    max_depth = plan.max_depth
    n_features = len(features)
    columns: list[list[Any]] = [[] for _ in features]
    appends = [column.append for column in columns]
    mixed = [False] * len(features)
    kept: list[int] = []
    rejected: list[tuple[int, str]] = []
    reject = rejected.append
    feature_names = {fp.name for fp in features}
    known_keys: set[Any] = set()  # keys of a record that passed the structure check
    known_extras: tuple[Any, ...] = ()

    for index, value in enumerate(values):
        if type(value) is not bytes:
            value = _as_bytes(index, value)
        size = len(value)
        if not size:
            reject((index, "truncated"))
            continue
        if size > max_bytes:
            reject((index, "too_large"))
            continue
        try:
            record = unpack(value)
        except _ExtRejected:
            reject((index, "format"))
            continue
        except ValueError as exc:
            reject((index, _unpack_reason(exc)))
            continue
        if type(record) is not dict or len(record) != _map_header_len(value):
            reject((index, "format"))  # not a map, or a key twice (the last would win)
            continue
        # The structural checks (str keys, depth) run only when a value is not one of the
        # plain kinds the fast paths take, or keys other than the features are present.
        checked = False
        done = 0
        try:
            for fp in features:
                item = record.get(fp.name, MISSING)
                kind = type(item)
                if kind is bytes and len(item) == fp.nbytes and fp.raw_fast:
                    pass
                elif (kind is float and fp.fast_float and fp.flo <= item <= fp.fhi) or (
                    kind is int and fp.fast_int and fp.lo <= item <= fp.hi
                ):
                    mixed[done] = True
                elif fp.fast_str and (kind is str or kind is bytes):
                    pass
                elif (
                    kind is list
                    and fp.fast_list
                    and len(item) <= fp.max_len
                    and fp.leaf_types.issuperset(map(type, item))
                    and (not item or not fp.list_min or fp.list_lo <= min(item))
                    and (not item or not fp.list_max or max(item) <= fp.list_hi)
                ):
                    item = (item, len(item))  # a list of ids or numbers that surely fit
                elif fp.variable and kind is list and not checked:
                    # An accepted list holds exactly rows of scalars: never deeper than the
                    # schema allows, so the structure check waits for a rejection (a
                    # whole-record problem wins) or for keys other than the features.
                    try:
                        item = _convert(fp, item)
                    except Rejected:
                        _check_structure(record, max_depth)
                        raise
                else:
                    if not checked:
                        _check_structure(record, max_depth)
                        checked = True
                    item = _convert(fp, item)
                    if type(item) is not bytes:
                        mixed[done] = True
                appends[done](item)
                done += 1
            if not checked and len(record) != n_features:
                # Keys beyond the features (a producer's extras): the same key set as a
                # record already checked needs only its extra values looked at.
                if record.keys() == known_keys:
                    for key in known_extras:
                        if type(record[key]) in _CONTAINERS:
                            _check_structure(record, max_depth)
                            break
                else:
                    _check_structure(record, max_depth)
                    known_keys = set(record)
                    known_extras = tuple(known_keys.difference(feature_names))
        except Rejected as rejection:
            for column in columns[:done]:
                column.pop()
            reject((index, rejection.reason))
            continue
        kept.append(index)

    n = len(kept)
    arrays = {
        fp.name: _assemble(fp, column, was_mixed, n)
        for fp, column, was_mixed in zip(features, columns, mixed, strict=True)
    }
    kept_rows = np.array(kept, dtype=np.int64)
    if plan.finite and n:
        arrays, kept_rows, rejected = _drop_non_finite(plan.finite, arrays, kept_rows, rejected)
    return DecodedBlock(arrays, kept_rows, rejected)


def prepare_block(schema: Schema, block: Any, decoder: str = "auto") -> DecodedBlock:
    """A shard child's preparation of a block for its owner: the decode, on the child's core
    (``consumers.process``); the parent's map then gets columns, and only the rejects' raw
    values travel (``DecodedBlock.needs_values``)."""
    return decode_block(schema, block.values, decoder)


def _expected(fp: FeaturePlan) -> str:
    dtype = "string" if fp.string else fp.dtype.name
    if fp.variable:
        inner = "".join(f", {d}" for d in fp.inner_shape)
        return f"[0..{fp.max_len}{inner}] {dtype}"
    if fp.string:
        return f"{list(fp.shape)} string" if fp.shape else "a string"
    raw = f" ({fp.nbytes} bytes as bin)" if fp.shape else ""
    return f"{list(fp.shape)} {dtype}{raw}"


def _found(item: object) -> str:
    """What a record holds, by kind and shape only: never a value of the record."""
    if item is MISSING:
        return "nothing (the field is missing and has no default)"
    if item is None:
        return "nil"
    if isinstance(item, bytes):
        return f"{len(item)} bytes (bin)"
    if isinstance(item, str):
        return "a string"
    if isinstance(item, bool):
        return "a bool"
    if isinstance(item, int | float):
        return f"a msgpack {type(item).__name__}"
    if isinstance(item, list):
        shape: list[int] = []
        level: object = item
        while isinstance(level, list):
            shape.append(len(level))
            level = level[0] if level else None
        return f"a list of shape {shape}"
    if isinstance(item, dict):
        shape_field = item.get("shape", item.get(b"shape"))
        if shape_field is not None:
            return f"a msgpack-numpy array of shape {shape_field}"
        return "a map"
    return type(item).__name__


_RECORD_REASONS: Final = {
    "truncated": "not a complete msgpack value (or an empty one: a tombstone)",
    "extra_data": "bytes after the end of the msgpack value",
    "too_deep": "nested deeper than the schema's max_depth",
    "format": "not a msgpack map with string keys (or a key twice, an ext type, bad UTF-8)",
}


def explain_reject(schema: Schema, value: bytes | None) -> str:
    """Why ``decode_block`` rejects a record, for a log line: the reason, and for a feature's
    problem the feature, what the schema expects and what came -- never a value of the record.

    >>> from streamer.decode.schema import Feature, Schema
    >>> s = Schema((Feature("x", "float32", (8,)),))
    >>> explain_reject(s, msgpack.packb({"x": np.zeros(16, np.float32).tobytes()}))
    'shape: x expected [8] float32 (32 bytes as bin), got 64 bytes (bin)'
    >>> explain_reject(s, msgpack.packb({"x": [float("nan")] * 8}))
    'dtype: x holds NaN or Inf (allow_non_finite = true lets them in)'
    """
    block = decode_block(schema, [value])
    if not block.rejected:
        return "accepted"
    reason = block.rejected[0][1]
    raw = value if isinstance(value, bytes) else b""
    if reason == "too_large":
        if len(raw) > schema.max_record_bytes:
            return (
                f"too_large: {len(raw)} bytes, more than the schema's max_record_bytes "
                f"({schema.max_record_bytes})"
            )
        return "too_large: a string, list or map longer than the schema's limits"
    if reason in _RECORD_REASONS:
        return f"{reason}: {_RECORD_REASONS[reason]}"
    plan = _plan_for(schema)
    try:
        record = plan.unpack(raw)
    except Exception:
        return reason
    if type(record) is not dict:
        return reason
    for fp in plan.features:
        item = record.get(fp.name, MISSING)
        try:
            _convert(fp, item)
        except Rejected as rejection:
            return f"{rejection.reason}: {fp.name} expected {_expected(fp)}, got {_found(item)}"
        if fp.finite_only and item is not MISSING and item is not None:
            # The same value alone: rejected now only for NaN or Inf (checked per column).
            alone = Schema((schema.feature(fp.name),))
            if decode_block(alone, [msgpack.packb({fp.name: item})]).rejected:
                return f"dtype: {fp.name} holds NaN or Inf (allow_non_finite = true lets them in)"
    return reason


def encode_record(schema: Schema, sample: Mapping[str, Any]) -> bytes:
    """One record as msgpack: arrays as raw little-endian ``bin``, scalars as msgpack numbers.

    >>> from streamer.decode.schema import Feature, Schema
    >>> s = Schema((Feature("x", "float32", (2,)), Feature("y", "int64")))
    >>> encode_record(s, {"x": np.array([1, 2], np.float32), "y": 3})
    b'\\x82\\xa1x\\xc4\\x08\\x00\\x00\\x80?\\x00\\x00\\x00@\\xa1y\\x03'

    A variable-length feature takes an array of shape ``[rows, *inner_shape]`` (raw ``bin``
    as well); a string feature str or bytes (lists of them when shaped, as msgpack arrays).
    An optional feature may be left out. Raises ValueError when ``sample`` lacks a required
    feature, has one the schema does not name, or a value has the wrong shape or cannot be
    represented in the feature's dtype.
    """
    unknown = sorted(set(sample) - set(schema.feature_names))
    if unknown:
        raise ValueError(f"sample has keys the schema does not name: {unknown}")
    plans = _plan_for(schema).features
    out: dict[str, Any] = {}
    for fp in plans:
        if fp.name not in sample:
            if fp.default_item is not None:
                continue
            raise ValueError(f"sample lacks feature {fp.name!r}")
        if fp.string:
            out[fp.name] = _encode_strings(fp, sample[fp.name])
            continue
        arr = np.asarray(sample[fp.name])
        rows_ok = fp.variable and arr.ndim == len(fp.shape) and arr.shape[0] <= fp.max_len
        if not (rows_ok and arr.shape[1:] == fp.inner_shape) and arr.shape != fp.shape:
            raise ValueError(
                f"feature {fp.name!r} has shape {arr.shape} where {fp.shape} was expected"
            )
        problem = f"feature {fp.name!r}: {arr.dtype} values do not fit {fp.dtype}"
        if arr.dtype.kind not in "biuf":
            raise ValueError(problem)
        try:
            arr = cast(fp, arr)
        except Rejected as exc:
            raise ValueError(
                f"{problem} (bool only for bool, integers in range for integers, "
                "no finite value beyond a float dtype's range)"
            ) from exc
        out[fp.name] = arr.item() if not fp.shape else arr.astype(fp.wire, copy=False).tobytes()
    packed: bytes = msgpack.packb(out)
    return packed


def _encode_strings(fp: FeaturePlan, value: Any) -> Any:
    if not fp.shape:
        if isinstance(value, str | bytes):
            return value
        raise ValueError(f"feature {fp.name!r}: {type(value).__name__} where a string belongs")
    arr = np.asarray(value, dtype=object)
    rows_ok = fp.variable and arr.ndim == len(fp.shape) and arr.shape[0] <= fp.max_len
    if not (rows_ok and arr.shape[1:] == fp.inner_shape) and arr.shape != fp.shape:
        raise ValueError(f"feature {fp.name!r} has shape {arr.shape} where {fp.shape} was expected")
    if not all(isinstance(v, str | bytes) for v in arr.reshape(-1)):
        raise ValueError(f"feature {fp.name!r}: every element must be str or bytes")
    return arr.tolist()
