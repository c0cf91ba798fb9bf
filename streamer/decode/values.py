"""One feature value at a time, for decode_block: dtype rules, encodings, and column assembly.

Pure code (numpy and msgpack only). ``decode.py`` runs the per-record loop and calls these for
every value that is not one of its fast cases; the rules are the module docstring of
``streamer.decode.records``. A variable-length value becomes ``(piece, rows)`` where the piece is the
raw bytes, a flat list of validated Python leaves, or a flat array; a block's pieces are joined
once into a ``RaggedColumn`` (one ``np.array``/``frombuffer`` call, not one per record).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from typing import Any, Final

import msgpack
import numpy as np
import numpy.typing as npt

from consumers.types import REASONS, Reason
from streamer.decode.ragged import RaggedColumn
from streamer.decode.schema import ALLOWED_DTYPES, Feature

__all__ = [
    "BOOL_BYTES",
    "MISSING",
    "NUMBER_TYPES",
    "REASONS",
    "FeaturePlan",
    "Reason",
    "Rejected",
    "assemble_fixed",
    "assemble_strings",
    "assemble_variable",
    "cast",
    "from_lists",
    "from_numpy_map",
    "scalar",
    "string_value",
    "variable_value",
]


class Rejected(Exception):
    """Raised by our own checks only, never by a bug: the record is refused for ``reason``."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason)
        self.reason: Reason = reason


class _Missing:
    __slots__ = ()


MISSING: Final = _Missing()
BOOL_BYTES: Final = b"\x00\x01"
NUMBER_TYPES: Final = frozenset({bool, int, float})
_STRING_TYPES: Final = frozenset({str, bytes})
_LIST_ONLY: Final = {list}
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


class FeaturePlan:
    """What the hot loop needs to know about one feature, precomputed once per schema."""

    __slots__ = (
        "default_item",
        "dtype",
        "fast_float",
        "fast_int",
        "fast_list",
        "fast_str",
        "fhi",
        "finite_only",
        "flo",
        "fmax",
        "hi",
        "inner_nbytes",
        "inner_shape",
        "inner_size",
        "kind",
        "leaf_types",
        "list_hi",
        "list_lo",
        "list_max",
        "list_min",
        "lo",
        "max_len",
        "name",
        "nbytes",
        "raw_fast",
        "shape",
        "size",
        "special",
        "string",
        "variable",
        "wire",
    )

    def __init__(self, feature: Feature) -> None:
        self.name = feature.name
        self.dtype = feature.dtype
        self.wire = feature.dtype.newbyteorder("<")
        self.shape = feature.shape
        self.size = feature.size
        self.nbytes = feature.nbytes
        # "b" bool, "i" any integer (signed or not, bounded by lo..hi), "f" float, "s" string.
        self.kind = {"b": "b", "i": "i", "u": "i", "f": "f", "O": "s"}[feature.dtype.kind]
        self.string = feature.is_string
        self.variable = feature.is_variable
        # Strings and variable-length values take the paths of this module, never raw_fast.
        self.special = self.string or self.variable
        self.inner_shape = feature.inner_shape
        self.inner_size = feature.inner_size
        self.inner_nbytes = feature.inner_size * feature.dtype.itemsize
        self.max_len = feature.max_len or 0
        self.finite_only = feature.finite_only
        self.raw_fast = self.kind not in "bs" and not self.variable
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
        self.fast_str = self.string and not self.shape
        self.fhi = math.inf if self.fmax is None else self.fmax
        self.flo = -self.fhi
        # A variable-length list of numbers (no inner shape): checked inline by the loop.
        self.fast_list = self.variable and not self.inner_shape and self.kind in "if"
        self.leaf_types = frozenset({int} if self.kind == "i" else {int, float})
        self.list_lo: float = self.lo if self.kind == "i" else self.flo
        self.list_hi: float = self.hi if self.kind == "i" else self.fhi
        # msgpack's integers span -2**63..2**64-1: an int64 list needs no min(), a uint64 one
        # no max(), a float64 one neither (each is a pass over the list).
        bounded_float = self.kind == "f" and self.fmax is not None
        self.list_min = (self.kind == "i" and self.lo > -(2**63)) or bounded_float
        self.list_max = (self.kind == "i" and self.hi < 2**64 - 1) or bounded_float
        self.default_item = self._default_item(feature)

    def _default_item(self, feature: Feature) -> Any:
        """The column item of a record without this field (None: the field is required)."""
        default = feature.default
        if default is None:
            return None
        if self.string:
            flat = [default] if not self.shape else list(default)
            if self.variable:
                return flat, len(flat) // self.inner_size
            return flat[0] if not self.shape else flat
        raw = np.asarray(default, dtype=self.dtype).astype(self.wire).tobytes()
        if self.variable:
            return raw, len(default) // self.inner_size
        return raw


def scalar(fp: FeaturePlan, value: Any) -> Any:
    kind = type(value)
    if fp.kind == "b":
        if kind is bool:
            return value
        raise Rejected("dtype")
    if kind is bool:
        raise Rejected("dtype")
    if fp.kind == "i":
        if kind is int and fp.lo <= value <= fp.hi:
            return value
        raise Rejected("dtype")
    fmax = fp.fmax
    if fmax is not None and not -fmax <= value <= fmax and (kind is int or math.isfinite(value)):
        # Beyond the dtype's largest value: refused when it would become inf, as in a list
        # (``cast``); one that rounds to the largest value is taken, rounded.
        with np.errstate(over="ignore"):
            if math.isinf(fp.dtype.type(float(value))):
                raise Rejected("dtype")
    return value


def _leaf_check(fp: FeaturePlan, types: set[type]) -> None:
    if not types <= NUMBER_TYPES:
        if list in types or dict in types:
            raise Rejected("shape")
        raise Rejected("format" if msgpack.Timestamp in types else "schema")
    if fp.kind == "b":
        ok = types == {bool}
    elif fp.kind == "i":
        ok = types == {int}
    else:
        ok = bool not in types
    if not ok:
        raise Rejected("dtype")


def _string_leaf_check(types: set[type]) -> None:
    if not types <= _STRING_TYPES:
        if list in types or dict in types:
            raise Rejected("shape")
        if msgpack.Timestamp in types:
            raise Rejected("format")
        raise Rejected("dtype" if types & NUMBER_TYPES else "schema")


def _flatten(value: list[Any], dims: Sequence[int]) -> list[Any]:
    """The leaves of nested lists whose inner levels have exactly ``dims`` items each."""
    level = value
    for dim in dims:
        if not level:
            return level
        if set(map(type, level)) != _LIST_ONLY or set(map(len, level)) != {dim}:
            raise Rejected("shape")
        level = list(chain.from_iterable(level))
    return level


def from_lists(fp: FeaturePlan, value: list[Any]) -> npt.NDArray[Any]:
    shape = fp.shape
    if not shape or len(value) != shape[0]:
        raise Rejected("shape")
    level = _flatten(value, shape[1:])
    _leaf_check(fp, set(map(type, level)))
    if fp.kind == "i":
        if min(level) < fp.lo or max(level) > fp.hi:
            raise Rejected("dtype")
        return np.array(level, dtype=fp.dtype).reshape(shape)
    if fp.kind == "b":
        return np.array(level, dtype=fp.dtype).reshape(shape)
    wide = np.array(level, dtype=np.float64)
    return cast(fp, wide).reshape(shape)


def _np_get(mapping: dict[Any, Any], key: str) -> Any:
    as_bytes, as_str = _NP_KEYS[key]
    found = mapping.get(as_bytes, MISSING)
    return mapping.get(as_str, MISSING) if found is MISSING else found


def _numpy_header(
    fp: FeaturePlan, mapping: dict[Any, Any]
) -> tuple[np.dtype[Any], bytes, list[int] | None]:
    """``(wire dtype, data, shape)`` of a msgpack-numpy envelope; shape None when 0-d."""
    nd = _np_get(mapping, "nd")
    if nd is not True and nd is not False:
        raise Rejected("schema")  # not a msgpack-numpy array: a map where numbers belong
    if fp.string:
        raise Rejected("dtype")  # arrays of numbers only; strings come as str or bin
    descr = _np_get(mapping, "type")
    if type(descr) is bytes:
        descr = descr.decode("ascii", "replace")
    if type(descr) is not str:
        raise Rejected("dtype" if type(descr) is list else "schema")  # list: structured
    src = _WIRE_DTYPES.get(descr)
    kind = _np_get(mapping, "kind")
    if src is None or kind not in (MISSING, b"", ""):  # "V" structured, "O" pickled objects
        raise Rejected("dtype")
    data = _np_get(mapping, "data")
    if type(data) is not bytes:
        raise Rejected("schema")
    if not nd:
        return src, data, None
    shape = _np_get(mapping, "shape")
    if type(shape) is not list or not set(map(type, shape)) <= {int}:
        raise Rejected("shape")
    return src, data, shape


def from_numpy_map(fp: FeaturePlan, mapping: dict[Any, Any]) -> Any:
    src, data, shape = _numpy_header(fp, mapping)
    if (shape is None and fp.shape) or (shape is not None and tuple(shape) != fp.shape):
        raise Rejected("shape")
    if len(data) != fp.size * src.itemsize:
        raise Rejected("shape")
    if src.kind == "b" and data.translate(None, BOOL_BYTES):
        raise Rejected("dtype")
    if src == fp.wire:
        return data
    return cast(fp, np.frombuffer(data, dtype=src)).reshape(fp.shape)


def cast(fp: FeaturePlan, arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``arr`` in the feature's dtype, or Rejected("dtype") by the module's dtype rules."""
    src = arr.dtype.kind
    target = fp.kind
    if target == "b":
        if src != "b":
            raise Rejected("dtype")
        return arr.astype(fp.dtype)
    if src == "b" or (target == "i" and src == "f"):
        raise Rejected("dtype")
    if np.can_cast(arr.dtype, fp.dtype, "safe"):
        return arr.astype(fp.dtype)
    if target == "i":
        if arr.size and (int(arr.min()) < fp.lo or int(arr.max()) > fp.hi):
            raise Rejected("dtype")
        return arr.astype(fp.dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN stays NaN: checked after
        out = arr.astype(fp.dtype)
    if np.isinf(out).any() and (np.isinf(out) & np.isfinite(arr)).any():
        raise Rejected("dtype")
    return out


# -- strings and variable-length values ------------------------------------------------------


def _not_a_list(fp: FeaturePlan, value: Any) -> Rejected:
    """The reason for a value that is neither a list nor this feature's other encodings."""
    kind = type(value)
    if kind is dict and fp.string:
        try:
            _numpy_header(fp, value)  # a msgpack-numpy array: "dtype", any other map: "schema"
        except Rejected as rejection:
            return rejection
    if kind is msgpack.Timestamp:
        return Rejected("format")
    if kind in NUMBER_TYPES or (fp.string and kind in _STRING_TYPES):
        return Rejected("shape")  # one value where a list belongs
    return Rejected("schema")  # nil, a map, or a str where numbers belong


def string_value(fp: FeaturePlan, value: Any) -> Any:
    """A fixed-shape string feature's value: one str or bin, or nested lists of them (flat)."""
    kind = type(value)
    if not fp.shape:
        if kind is str or kind is bytes:
            return value
        if kind is list:
            raise Rejected("shape")
        if kind is dict:
            raise _not_a_list(fp, value)
        _string_leaf_check({kind})
        raise Rejected("schema")  # unreachable: every other kind was refused above
    if kind is not list:
        raise _not_a_list(fp, value)
    if len(value) != fp.shape[0]:
        raise Rejected("shape")
    leaves = _flatten(value, fp.shape[1:])
    _string_leaf_check(set(map(type, leaves)))
    return leaves


def variable_value(fp: FeaturePlan, value: Any) -> tuple[Any, int]:
    """A variable-length value as ``(piece, rows)``; longer than ``max_len`` is ``shape``."""
    kind = type(value)
    if kind is list:
        rows = len(value)
        if rows > fp.max_len:
            raise Rejected("shape")
        leaves = _flatten(value, fp.inner_shape) if fp.inner_shape else value
        if not leaves:
            return leaves, rows
        types = set(map(type, leaves))
        if fp.string:
            _string_leaf_check(types)
            return leaves, rows
        _leaf_check(fp, types)
        if fp.kind == "i":
            if min(leaves) < fp.lo or max(leaves) > fp.hi:
                raise Rejected("dtype")
        elif fp.fmax is not None:
            # min/max skip a NaN unless it comes first; then (or on inf, or out of range) the
            # exact check decides.
            fmax = fp.fmax
            if not (-fmax <= min(leaves) and max(leaves) <= fmax):
                return cast(fp, np.array(leaves, dtype=np.float64)), rows
        return leaves, rows
    if fp.string:
        raise _not_a_list(fp, value)
    if kind is bytes:
        rows, rest = divmod(len(value), fp.inner_nbytes)
        if rest or rows > fp.max_len:
            raise Rejected("shape")
        if fp.kind == "b" and value.translate(None, BOOL_BYTES):
            raise Rejected("dtype")
        return value, rows
    if kind is dict:
        src, data, shape = _numpy_header(fp, value)
        if shape is None or len(shape) != len(fp.shape) or tuple(shape[1:]) != fp.inner_shape:
            raise Rejected("shape")
        rows = shape[0]
        if not 0 <= rows <= fp.max_len or len(data) != rows * fp.inner_size * src.itemsize:
            raise Rejected("shape")
        if src.kind == "b" and data.translate(None, BOOL_BYTES):
            raise Rejected("dtype")
        if src == fp.wire:
            return data, rows
        return cast(fp, np.frombuffer(data, dtype=src)), rows
    raise _not_a_list(fp, value)


# -- assembly: one block's column of items to arrays -----------------------------------------


def assemble_fixed(fp: FeaturePlan, column: list[Any], mixed: bool, n: int) -> npt.NDArray[Any]:
    """A fixed-shape numeric column: raw bytes, Python scalars or arrays, one per record."""
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


def _objects(items: list[Any]) -> npt.NDArray[np.object_]:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def assemble_strings(fp: FeaturePlan, column: list[Any], n: int) -> npt.NDArray[np.object_]:
    """A fixed-shape string column: str or bytes per record (a flat list when shaped)."""
    if not fp.shape:
        return _objects(column)
    return _objects(list(chain.from_iterable(column))).reshape((n, *fp.shape))


def _piece_array(fp: FeaturePlan, piece: Any) -> npt.NDArray[Any]:
    if type(piece) is bytes:
        return np.frombuffer(piece, dtype=fp.wire).astype(fp.dtype)
    if type(piece) is list:
        return np.array(piece, dtype=fp.dtype)
    return np.asarray(piece, dtype=fp.dtype).reshape(-1)


def assemble_variable(fp: FeaturePlan, column: list[tuple[Any, int]]) -> RaggedColumn:
    """A variable-length column: every record's rows end to end, and the row lengths."""
    lengths = np.fromiter((rows for _, rows in column), dtype=np.int64, count=len(column))
    pieces = [piece for piece, _ in column]
    shape = (-1, *fp.inner_shape)
    if fp.string:
        return RaggedColumn(_objects(list(chain.from_iterable(pieces))).reshape(shape), lengths)
    kinds = set(map(type, pieces))
    if not kinds or kinds == {bytes}:
        values = np.frombuffer(bytearray().join(pieces), dtype=fp.wire)
        if fp.wire != fp.dtype:
            values = values.astype(fp.dtype)
    elif kinds == {list}:  # leaves already checked: one pass, no intermediate list
        count = int(lengths.sum()) * fp.inner_size
        values = np.fromiter(chain.from_iterable(pieces), dtype=fp.dtype, count=count)
    else:
        values = np.concatenate([_piece_array(fp, p) for p in pieces])
    return RaggedColumn(values.reshape(shape), lengths)
