"""Feature: one field of a record, its dtype, shape and kind (fixed, variable-length, padded,
string, optional); the schema (``streamer.decode.schema``) is made of them."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from consumers.errors import ConfigError

__all__ = [
    "ALLOWED_DTYPES",
    "HARD_MAX_BYTES",
    "LENGTH_SUFFIX",
    "NAME_RE",
    "NAME_RULE",
    "RESERVED_NAMES",
    "ROW_LENGTHS_SUFFIX",
    "STRING",
    "Feature",
    "is_int",
]

#: The feature dtypes a schema may name (numpy names).
ALLOWED_DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)

#: The dtype name of a string feature (msgpack str or bin; ``tf.string``; numpy ``object``).
STRING = "string"

#: A padded feature's length column is ``<name>_length`` (int32: the rows kept, at most pad_to).
LENGTH_SUFFIX = "_length"
#: A ragged feature's row lengths in the flat serving signature: ``<name>_row_lengths``.
ROW_LENGTHS_SUFFIX = "_row_lengths"

#: Column names the pipeline adds to every decoded block; no feature may take them.
RESERVED_NAMES: frozenset[str] = frozenset({"partition", "offset", "timestamp"})

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,127}$")
NAME_RULE = (
    "a name of 1-128 characters: a letter or '_', then letters, digits or '_./-'; "
    f"not one of {sorted(RESERVED_NAMES)}"
)
_MAX_NDIM = 32
_MAX_DIM = 2**31 - 1
#: A feature, and a record, may not exceed this however the limits are set.
HARD_MAX_BYTES = 1024**3
_OBJECT = np.dtype(object)


def is_int(value: object) -> bool:
    # bool is an int subclass; a setting of `true` is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _dtype_of(setting: str, value: DTypeLike) -> np.dtype[Any]:
    allowed = f"one of {', '.join(ALLOWED_DTYPES)}, {STRING}"
    if isinstance(value, str) and value == STRING:
        return _OBJECT
    if isinstance(value, np.dtype) and value == _OBJECT:
        return _OBJECT
    if isinstance(value, str):
        if value not in ALLOWED_DTYPES:
            raise ConfigError(setting, value, allowed)
        return np.dtype(value)
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(setting, value, allowed) from exc
    if dtype.name not in ALLOWED_DTYPES or not dtype.isnative:
        raise ConfigError(setting, value, f"{allowed} (native byte order)")
    return np.dtype(dtype.name)


def _shape_of(setting: str, value: object) -> tuple[int, ...]:
    rule = (
        f"a list of at most {_MAX_NDIM} integers in 1..{_MAX_DIM} ([] for a scalar); the "
        "first may be -1 (variable length: [-1] or [-1, 8])"
    )
    if not isinstance(value, list | tuple) or len(value) > _MAX_NDIM:
        raise ConfigError(setting, value, rule)
    for i, dim in enumerate(value):
        if not is_int(dim) or not (0 < dim <= _MAX_DIM or (i == 0 and dim == -1)):
            raise ConfigError(f"{setting}[{i}]", dim, rule)
    return tuple(int(d) for d in value)


def _scalar_of(setting: str, dtype: np.dtype[Any], value: object) -> Any:
    """``value`` as a Python scalar of the feature's kind, by the decoder's dtype rules."""
    kind = dtype.kind
    if kind == "O":
        if isinstance(value, str):
            return value
        raise ConfigError(setting, value, "a string")
    if kind == "b":
        if isinstance(value, bool):
            return value
        raise ConfigError(setting, value, "true or false (a bool feature)")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(setting, value, f"a number ({dtype.name})")
    if kind in "iu":
        info = np.iinfo(dtype)
        if not isinstance(value, int) or not info.min <= value <= info.max:
            raise ConfigError(setting, value, f"an integer in {info.min}..{info.max}")
        return int(value)
    fmax = float(np.finfo(dtype).max)
    if math.isfinite(value) and abs(value) > fmax:
        raise ConfigError(setting, value, f"a number within {dtype.name}'s range")
    return float(value)


def _flat_default(setting: str, feature: Feature, value: object) -> Any:
    """The normalised default: a scalar, or a flat tuple of the values in row-major order."""
    shape = feature.shape
    if not shape:
        return _scalar_of(setting, feature.dtype, value)
    inner = shape[1:] if feature.is_variable else shape
    rule = (
        f"a list of rows of shape {list(inner)} ([] for none)"
        if feature.is_variable
        else f"a value for every element, or one value for all: a list of shape {list(shape)}"
    )
    if not feature.is_variable and not isinstance(value, list):
        one = _scalar_of(setting, feature.dtype, value)
        return (one,) * feature.size
    if not isinstance(value, list):
        raise ConfigError(setting, value, rule)
    arr_shape: list[int] = []
    level: list[Any] = [value]
    while level and all(isinstance(v, list) for v in level):
        lengths = {len(v) for v in level}
        if len(lengths) != 1:
            raise ConfigError(setting, value, rule)
        arr_shape.append(lengths.pop())
        level = [x for v in level for x in v]
    if feature.is_variable:
        if value == []:
            return ()
        ok = tuple(arr_shape[1:]) == inner and arr_shape[0] <= (feature.max_len or _MAX_DIM)
    else:
        ok = tuple(arr_shape) == shape
    if not ok or any(isinstance(v, list) for v in level):
        raise ConfigError(setting, value, rule)
    return tuple(_scalar_of(setting, feature.dtype, v) for v in level)


def _finite(value: object) -> bool:
    """False for a float NaN or infinity; True for anything else (strings, ints, bools)."""
    return not isinstance(value, float) or math.isfinite(value)


def _nested(flat: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
    """The flat tuple as nested lists of ``shape`` (the first dimension may be -1)."""
    if not shape:
        return list(flat)
    if len(shape) == 1:
        return list(flat)
    step = math.prod(shape[1:])
    return [_nested(flat[i : i + step], shape[1:]) for i in range(0, len(flat), step)]


@dataclass(frozen=True, slots=True, init=False, repr=False)
class Feature:
    """One named field of a record: its dtype, its shape (``()`` for a scalar) and its kind.

    >>> f = Feature("x", "float32", (16,))
    >>> f.dtype, f.shape, f.nbytes
    (dtype('float32'), (16,), 64)
    >>> items = Feature("items", "int64", (-1,), max_len=50, default=[])
    >>> items.is_ragged, items.inner_shape, items.default
    (True, (), ())

    ``dtype`` is a numpy dtype (``object`` for ``"string"``). A ``shape`` starting with -1 is
    variable-length: at most ``max_len`` rows (set by the schema from ``max_array_len`` when
    not given). ``pad_to`` makes it dense (``pad_value``, default 0 or ""). ``default`` is
    None for a required feature, else the value a missing field gets: a scalar, or a flat
    tuple of the values in row-major order.
    """

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    max_len: int | None
    pad_to: int | None
    pad_value: Any
    default: Any
    allow_non_finite: bool

    def __init__(
        self,
        name: str,
        dtype: DTypeLike,
        shape: Sequence[int] = (),
        *,
        max_len: int | None = None,
        pad_to: int | None = None,
        pad_value: Any = None,
        default: Any = None,
        allow_non_finite: bool = False,
    ) -> None:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigError("features", name, NAME_RULE)
        setting = f"features.{name}"
        if name in RESERVED_NAMES:
            raise ConfigError(setting, name, NAME_RULE)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", _dtype_of(f"{setting}.dtype", dtype))
        object.__setattr__(self, "shape", _shape_of(f"{setting}.shape", shape))
        variable = self.is_variable
        for key, value in (("max_len", max_len), ("pad_to", pad_to)):
            if value is None:
                continue
            if not variable:
                raise ConfigError(
                    f"{setting}.{key}",
                    value,
                    f"{key} applies to a variable-length feature only (shape [-1, ...])",
                )
            if not is_int(value) or not 0 < value <= _MAX_DIM:
                raise ConfigError(f"{setting}.{key}", value, f"an integer in 1..{_MAX_DIM}")
        if max_len is not None and pad_to is not None and pad_to > max_len:
            raise ConfigError(f"{setting}.pad_to", pad_to, f"at most max_len ({max_len})")
        object.__setattr__(self, "max_len", max_len)
        object.__setattr__(self, "pad_to", pad_to)
        if pad_value is not None and pad_to is None:
            raise ConfigError(
                f"{setting}.pad_value", pad_value, "pad_value applies with pad_to only"
            )
        if pad_to is not None:
            fill = pad_value if pad_value is not None else ("" if self.is_string else 0)
            if self.dtype.kind == "b" and pad_value is None:
                fill = False
            pad_value = _scalar_of(f"{setting}.pad_value", self.dtype, fill)
        if not isinstance(allow_non_finite, bool):
            raise ConfigError(f"{setting}.allow_non_finite", allow_non_finite, "true or false")
        if allow_non_finite and self.dtype.kind != "f":
            raise ConfigError(
                f"{setting}.allow_non_finite",
                allow_non_finite,
                f"applies to a float feature only ({self.name!r} is "
                f"{STRING if self.is_string else self.dtype.name})",
            )
        object.__setattr__(self, "allow_non_finite", allow_non_finite)
        if pad_value is not None and not allow_non_finite and not _finite(pad_value):
            raise ConfigError(
                f"{setting}.pad_value", pad_value, "a finite number (or allow_non_finite = true)"
            )
        object.__setattr__(self, "pad_value", pad_value)
        object.__setattr__(self, "default", None)
        if default is not None:
            default = _flat_default(f"{setting}.default", self, default)
            if not allow_non_finite and not all(map(_finite, default if self.shape else [default])):
                raise ConfigError(
                    f"{setting}.default",
                    self.to_dict_default(default),
                    "finite numbers (NaN and Inf are refused unless allow_non_finite = true)",
                )
        object.__setattr__(self, "default", default)
        for key, nbytes in (("shape", self.nbytes), ("pad_to", self.padded_nbytes)):
            if nbytes > HARD_MAX_BYTES:
                if key == "shape" and variable:
                    key = "max_len"
                bad: Any = list(self.shape) if key == "shape" else getattr(self, key)
                raise ConfigError(
                    f"{setting}.{key}",
                    bad,
                    f"at most {HARD_MAX_BYTES} bytes per feature ({nbytes} with {self.dtype})",
                )

    def __repr__(self) -> str:
        dtype = STRING if self.is_string else self.dtype.name
        extra = "".join(
            f", {key}={getattr(self, key)!r}"
            for key in ("max_len", "pad_to", "pad_value", "default")
            if getattr(self, key) is not None
        )
        if self.allow_non_finite:
            extra += ", allow_non_finite=True"
        return f"Feature(name={self.name!r}, dtype={dtype!r}, shape={self.shape}{extra})"

    # -- kinds ------------------------------------------------------------------------------

    @property
    def is_string(self) -> bool:
        """``dtype = "string"``: bytes (msgpack str or bin) to ``tf.string``."""
        return self.dtype == _OBJECT

    @property
    def is_variable(self) -> bool:
        """A variable number of rows per record (shape ``[-1, ...]``): ragged or padded."""
        return bool(self.shape) and self.shape[0] == -1

    @property
    def is_ragged(self) -> bool:
        """Variable-length and handed to the model as a ``tf.RaggedTensor``."""
        return self.is_variable and self.pad_to is None

    @property
    def is_padded(self) -> bool:
        """Variable-length and handed to the model dense (``pad_to`` rows) plus a length."""
        return self.pad_to is not None

    @property
    def is_dense_numeric(self) -> bool:
        """A number or fixed-shape array of numbers: what the built-in model takes."""
        return not self.is_string and not self.is_variable

    @property
    def finite_only(self) -> bool:
        """A float feature whose NaN and ±Inf values are refused (``dtype``): the default;
        ``allow_non_finite = true`` lets them through."""
        return self.dtype.kind == "f" and not self.allow_non_finite

    @property
    def required(self) -> bool:
        """A record without this field is rejected (``schema``); else it gets ``default``."""
        return self.default is None

    @property
    def inner_shape(self) -> tuple[int, ...]:
        """The shape of one row of a variable-length feature (of the value of a fixed one)."""
        return self.shape[1:] if self.is_variable else self.shape

    @property
    def inner_size(self) -> int:
        """Elements of one row (``inner_shape``'s product; 1 for a list of scalars)."""
        return math.prod(self.inner_shape)

    @property
    def size(self) -> int:
        """Elements of a fixed feature (1 for a scalar); at most this many if variable."""
        if self.is_variable:
            return (self.max_len or 0) * self.inner_size
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Size of the raw little-endian encoding in bytes (0 for strings; the most if variable)."""
        return 0 if self.is_string else self.size * self.dtype.itemsize

    @property
    def padded_nbytes(self) -> int:
        """Bytes of one record's dense ``pad_to`` rows (0 unless padded numbers)."""
        if self.pad_to is None or self.is_string:
            return 0
        return self.pad_to * self.inner_size * self.dtype.itemsize

    def with_max_len(self, max_len: int) -> Feature:
        """This feature with ``max_len`` set (the schema fills in its default)."""
        return Feature(
            self.name,
            self.dtype,
            self.shape,
            max_len=max_len,
            pad_to=self.pad_to,
            pad_value=self.pad_value,
            default=self.to_dict().get("default"),
            allow_non_finite=self.allow_non_finite,
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``[features.<name>]`` table of this feature."""
        out: dict[str, Any] = {
            "dtype": STRING if self.is_string else self.dtype.name,
            "shape": list(self.shape),
        }
        for key in ("max_len", "pad_to", "pad_value"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.default is not None:
            out["default"] = self.to_dict_default(self.default)
        if self.allow_non_finite:
            out["allow_non_finite"] = True
        return out

    def to_dict_default(self, flat: Any) -> Any:
        """A normalised default as the schema file writes it (nested lists when shaped)."""
        return flat if not self.shape else _nested(flat, self.shape)
