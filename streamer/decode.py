"""decode_block: msgpack records to one array per feature, bad records set aside with a reason.

Pure code (numpy and msgpack only) so that it can be tested alone and run inside one
``tf.numpy_function`` call per block.

Accepted encodings of a feature value:

1. msgpack ``bin`` with the raw little-endian bytes of exactly ``feature.nbytes`` bytes;
2. a msgpack number, for a scalar feature;
3. (nested) msgpack arrays of numbers of exactly the feature's shape;
4. the msgpack-numpy map (keys ``nd``, ``type``, ``kind``, ``shape``, ``data`` as bin or str).

Dtype rules, the same for every encoding: a bool feature takes bools only; an integer
feature takes integers only (never a bool or a float) whose values fit its dtype; a float
feature takes integers and floats (never a bool), rounded to the nearest value of its dtype,
except that a finite value beyond the dtype's range is refused (it would become inf).
Raw ``bin`` bytes of a bool feature must be 0 or 1.

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
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final, Literal, NoReturn

import msgpack
import numpy as np
import numpy.typing as npt

from streamer.schema import ALLOWED_DTYPES, Feature, Schema

__all__ = ["REASONS", "DecodedBlock", "Reason", "decode_block", "encode_record"]

Reason = Literal[
    "format", "truncated", "extra_data", "too_large", "too_deep", "schema", "dtype", "shape"
]

#: Every reason a record can be rejected for (the ``reason`` label of the decode metrics).
REASONS: Final[tuple[Reason, ...]] = (
    "format",
    "truncated",
    "extra_data",
    "too_large",
    "too_deep",
    "schema",
    "dtype",
    "shape",
)


@dataclass(frozen=True, slots=True)
class DecodedBlock:
    """The decoded records of one block.

    ``features[name]`` has shape ``[len(kept), *feature.shape]`` and the feature's dtype;
    row ``r`` comes from ``values[kept[r]]``. ``rejected`` lists ``(index, reason)`` of the
    other records, in ascending index order.
    """

    features: dict[str, npt.NDArray[Any]]
    kept: npt.NDArray[np.int64]
    rejected: list[tuple[int, str]]

    def __len__(self) -> int:
        return len(self.kept)

    def reason_counts(self) -> dict[str, int]:
        """How many records were rejected for each reason (reasons with none left out)."""
        counts: dict[str, int] = {}
        for _, reason in self.rejected:
            counts[reason] = counts.get(reason, 0) + 1
        return counts


# -- internals ------------------------------------------------------------------------------


class _Rejected(Exception):
    """Raised by our own checks only, never by a bug: the record is refused for ``reason``."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason)
        self.reason: Reason = reason


class _ExtRejected(Exception):
    """Raised from msgpack's ext_hook: no extension type is ever turned into an object."""


def _reject_ext(code: int, data: bytes) -> NoReturn:
    raise _ExtRejected(code)


class _Missing:
    __slots__ = ()


_MISSING: Final = _Missing()
_BOOL_BYTES: Final = b"\x00\x01"
_NUMBER_TYPES: Final = frozenset({bool, int, float})
_LIST_ONLY: Final = {list}
_STR_ONLY: Final = frozenset({str})
# msgpack-numpy writes its keys as bin; other producers write str. Accept both.
_NP_KEYS: Final = {k: (k.encode(), k) for k in ("nd", "type", "kind", "shape", "data")}


def _wire_dtypes() -> dict[str, np.dtype[Any]]:
    """The msgpack-numpy ``type`` strings we accept, either byte order."""
    out: dict[str, np.dtype[Any]] = {}
    for name in ALLOWED_DTYPES:
        little, big = np.dtype(name).newbyteorder("<"), np.dtype(name).newbyteorder(">")
        out[little.str] = little  # "|i1" for one-byte types, as numpy writes them
        out["<" + little.str[1:]] = little
        out[">" + big.str[1:]] = big
    return out


_WIRE_DTYPES: Final = _wire_dtypes()


class _FeaturePlan:
    """What the hot loop needs to know about one feature, precomputed once per schema."""

    __slots__ = (
        "dtype",
        "fast_float",
        "fast_int",
        "fhi",
        "flo",
        "fmax",
        "hi",
        "kind",
        "lo",
        "name",
        "nbytes",
        "raw_fast",
        "shape",
        "size",
        "wire",
    )

    def __init__(self, feature: Feature) -> None:
        self.name = feature.name
        self.dtype = feature.dtype
        self.wire = feature.dtype.newbyteorder("<")
        self.shape = feature.shape
        self.size = feature.size
        self.nbytes = feature.nbytes
        # "b" bool, "i" any integer (signed or not, bounded by lo..hi), "f" float.
        self.kind = {"b": "b", "i": "i", "u": "i", "f": "f"}[feature.dtype.kind]
        self.raw_fast = self.kind != "b"
        self.lo = self.hi = 0
        self.fmax: float | None = None
        if self.kind == "i":
            info = np.iinfo(feature.dtype)
            self.lo, self.hi = int(info.min), int(info.max)
        elif self.kind == "f" and feature.dtype.itemsize < 8:
            self.fmax = float(np.finfo(feature.dtype).max)
        # Hot-loop shortcuts: a scalar feature given a msgpack number that surely fits.
        self.fast_float = self.kind == "f" and not self.shape
        self.fast_int = self.kind == "i" and not self.shape
        self.fhi = math.inf if self.fmax is None else self.fmax
        self.flo = -self.fhi


class _Plan:
    __slots__ = ("features", "max_depth", "max_record_bytes", "unpack")

    def __init__(self, schema: Schema) -> None:
        self.features = tuple(_FeaturePlan(f) for f in schema.features)
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


def _check_structure(record: dict[Any, Any], max_depth: int) -> None:
    """Reject a record whose top-level keys are not all str, or that nests too deep."""
    if not _STR_ONLY.issuperset(map(type, record)):
        raise _Rejected("format")
    inner = set(map(type, record.values()))
    if (list in inner or dict in inner) and _too_deep(record, max_depth):
        raise _Rejected("too_deep")


def _as_bytes(index: int, value: object) -> bytes:
    if value is None:  # a Kafka tombstone: nothing to decode
        return b""
    if isinstance(value, bytes):  # a subclass such as numpy.bytes_
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"decode_block: values[{index}] is {type(value).__name__}, expected bytes")


def _convert(fp: _FeaturePlan, value: object) -> Any:
    """One feature value as raw wire bytes, a Python scalar or an array of the feature's dtype."""
    kind = type(value)
    if kind is bytes:
        assert isinstance(value, bytes)
        if len(value) != fp.nbytes:
            raise _Rejected("shape")
        if fp.kind == "b" and value.translate(None, _BOOL_BYTES):
            raise _Rejected("dtype")
        return value
    if kind in _NUMBER_TYPES:
        if fp.shape:
            raise _Rejected("shape")
        return _scalar(fp, value)
    if kind is list:
        assert isinstance(value, list)
        return _from_lists(fp, value)
    if kind is dict:
        assert isinstance(value, dict)
        return _from_numpy_map(fp, value)
    if kind is msgpack.Timestamp:  # the one ext type msgpack builds itself
        raise _Rejected("format")
    raise _Rejected("schema")  # missing, nil, or a str


def _scalar(fp: _FeaturePlan, value: Any) -> Any:
    kind = type(value)
    if fp.kind == "b":
        if kind is bool:
            return value
        raise _Rejected("dtype")
    if kind is bool:
        raise _Rejected("dtype")
    if fp.kind == "i":
        if kind is int and fp.lo <= value <= fp.hi:
            return value
        raise _Rejected("dtype")
    fmax = fp.fmax
    if fmax is not None and not -fmax <= value <= fmax and (kind is int or math.isfinite(value)):
        raise _Rejected("dtype")
    return value


def _leaf_check(fp: _FeaturePlan, types: set[type]) -> None:
    if not types <= _NUMBER_TYPES:
        if list in types or dict in types:
            raise _Rejected("shape")
        raise _Rejected("format" if msgpack.Timestamp in types else "schema")
    if fp.kind == "b":
        ok = types == {bool}
    elif fp.kind == "i":
        ok = types == {int}
    else:
        ok = bool not in types
    if not ok:
        raise _Rejected("dtype")


def _from_lists(fp: _FeaturePlan, value: list[Any]) -> npt.NDArray[Any]:
    shape = fp.shape
    if not shape or len(value) != shape[0]:
        raise _Rejected("shape")
    level: list[Any] = value
    for dim in shape[1:]:
        if set(map(type, level)) != _LIST_ONLY or set(map(len, level)) != {dim}:
            raise _Rejected("shape")
        level = list(chain.from_iterable(level))
    _leaf_check(fp, set(map(type, level)))
    if fp.kind == "i":
        if min(level) < fp.lo or max(level) > fp.hi:
            raise _Rejected("dtype")
        return np.array(level, dtype=fp.dtype).reshape(shape)
    if fp.kind == "b":
        return np.array(level, dtype=fp.dtype).reshape(shape)
    wide = np.array(level, dtype=np.float64)
    return _cast(fp, wide).reshape(shape)


def _np_get(mapping: dict[Any, Any], key: str) -> Any:
    as_bytes, as_str = _NP_KEYS[key]
    found = mapping.get(as_bytes, _MISSING)
    return mapping.get(as_str, _MISSING) if found is _MISSING else found


def _from_numpy_map(fp: _FeaturePlan, mapping: dict[Any, Any]) -> Any:
    nd = _np_get(mapping, "nd")
    if nd is not True and nd is not False:
        raise _Rejected("schema")  # not a msgpack-numpy array: a map where numbers belong
    descr = _np_get(mapping, "type")
    if type(descr) is bytes:
        descr = descr.decode("ascii", "replace")
    if type(descr) is not str:
        raise _Rejected("dtype" if type(descr) is list else "schema")  # list: structured
    src = _WIRE_DTYPES.get(descr)
    kind = _np_get(mapping, "kind")
    if src is None or kind not in (_MISSING, b"", ""):  # "V" structured, "O" pickled objects
        raise _Rejected("dtype")
    data = _np_get(mapping, "data")
    if type(data) is not bytes:
        raise _Rejected("schema")
    if nd:
        shape = _np_get(mapping, "shape")
        if type(shape) is not list or not set(map(type, shape)) <= {int}:
            raise _Rejected("shape")
        if tuple(shape) != fp.shape:
            raise _Rejected("shape")
    elif fp.shape:
        raise _Rejected("shape")
    if len(data) != fp.size * src.itemsize:
        raise _Rejected("shape")
    if src.kind == "b" and data.translate(None, _BOOL_BYTES):
        raise _Rejected("dtype")
    if src == fp.wire:
        return data
    return _cast(fp, np.frombuffer(data, dtype=src)).reshape(fp.shape)


def _cast(fp: _FeaturePlan, arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``arr`` in the feature's dtype, or _Rejected("dtype") by the module's dtype rules."""
    src = arr.dtype.kind
    target = fp.kind
    if target == "b":
        if src != "b":
            raise _Rejected("dtype")
        return arr.astype(fp.dtype)
    if src == "b" or (target == "i" and src == "f"):
        raise _Rejected("dtype")
    if np.can_cast(arr.dtype, fp.dtype, "safe"):
        return arr.astype(fp.dtype)
    if target == "i":
        if int(arr.min()) < fp.lo or int(arr.max()) > fp.hi:
            raise _Rejected("dtype")
        return arr.astype(fp.dtype)
    with np.errstate(over="ignore"):
        out = arr.astype(fp.dtype)
    if np.isinf(out).any() and (np.isinf(out) & np.isfinite(arr)).any():
        raise _Rejected("dtype")
    return out


def _assemble(fp: _FeaturePlan, column: list[Any], mixed: bool, n: int) -> npt.NDArray[Any]:
    if not mixed:  # all raw bytes: one copy into the block's array
        arr = np.frombuffer(bytearray().join(column), dtype=fp.wire)
        if fp.wire != fp.dtype:  # big-endian host
            arr = arr.astype(fp.dtype)
        return arr.reshape((n, *fp.shape))
    if not fp.shape and not any(type(item) is bytes for item in column):
        return np.array(column, dtype=fp.dtype)
    out = np.empty((n, *fp.shape), dtype=fp.dtype)
    for row, item in enumerate(column):
        if type(item) is bytes:
            out[row] = np.frombuffer(item, dtype=fp.wire).reshape(fp.shape)
        else:
            out[row] = item
    return out


# -- public ---------------------------------------------------------------------------------


def decode_block(schema: Schema, values: Sequence[bytes | None]) -> DecodedBlock:
    """Decode a block of msgpack records; each record decodes whole or is rejected.

    >>> from streamer.schema import Feature, Schema
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
        if type(record) is not dict:
            reject((index, "format"))
            continue
        # The structural checks (str keys, depth) run only when a value is not one of the
        # plain kinds the fast paths take, or keys other than the features are present.
        checked = False
        done = 0
        try:
            for fp in features:
                item = record.get(fp.name, _MISSING)
                kind = type(item)
                if kind is bytes and len(item) == fp.nbytes and fp.raw_fast:
                    pass
                elif (kind is float and fp.fast_float and fp.flo <= item <= fp.fhi) or (
                    kind is int and fp.fast_int and fp.lo <= item <= fp.hi
                ):
                    mixed[done] = True
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
                _check_structure(record, max_depth)
        except _Rejected as rejection:
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
    return DecodedBlock(arrays, np.array(kept, dtype=np.int64), rejected)


def encode_record(schema: Schema, sample: Mapping[str, Any]) -> bytes:
    """One record as msgpack: arrays as raw little-endian ``bin``, scalars as msgpack numbers.

    >>> from streamer.schema import Feature, Schema
    >>> s = Schema((Feature("x", "float32", (2,)), Feature("y", "int64")))
    >>> encode_record(s, {"x": np.array([1, 2], np.float32), "y": 3})
    b'\\x82\\xa1x\\xc4\\x08\\x00\\x00\\x80?\\x00\\x00\\x00@\\xa1y\\x03'

    Raises ValueError when ``sample`` lacks a feature, has one the schema does not name, or a
    value has the wrong shape or cannot be represented in the feature's dtype.
    """
    unknown = sorted(set(sample) - set(schema.feature_names))
    if unknown:
        raise ValueError(f"sample has keys the schema does not name: {unknown}")
    plans = _plan_for(schema).features
    out: dict[str, Any] = {}
    for fp in plans:
        if fp.name not in sample:
            raise ValueError(f"sample lacks feature {fp.name!r}")
        arr = np.asarray(sample[fp.name])
        if arr.shape != fp.shape:
            raise ValueError(
                f"feature {fp.name!r} has shape {arr.shape} where {fp.shape} was expected"
            )
        problem = f"feature {fp.name!r}: {arr.dtype} values do not fit {fp.dtype}"
        if arr.dtype.kind not in "biuf":
            raise ValueError(problem)
        try:
            arr = _cast(fp, arr)
        except _Rejected as exc:
            raise ValueError(
                f"{problem} (bool only for bool, integers in range for integers, "
                "no finite value beyond a float dtype's range)"
            ) from exc
        out[fp.name] = arr.item() if not fp.shape else arr.astype(fp.wire, copy=False).tobytes()
    packed: bytes = msgpack.packb(out)
    return packed
