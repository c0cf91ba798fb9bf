"""The record schema: each feature's dtype and shape, the label, and the decoder's limits."""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from consumers.errors import ConfigError

__all__ = [
    "ALLOWED_DTYPES",
    "RESERVED_NAMES",
    "Feature",
    "Schema",
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

#: Column names the pipeline adds to every decoded block; no feature may take them.
RESERVED_NAMES: frozenset[str] = frozenset({"partition", "offset", "timestamp"})

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,127}$")
_NAME_RULE = (
    "a name of 1-128 characters: a letter or '_', then letters, digits or '_./-'; "
    f"not one of {sorted(RESERVED_NAMES)}"
)
_MAX_NDIM = 32
_MAX_DIM = 2**31 - 1
_KIB = 1024
_MIB = 1024 * _KIB
_GIB = 1024 * _MIB
# A feature, and a record, may not exceed this however the limits are set.
_HARD_MAX_BYTES = _GIB
_DEFAULT_RECORD_CAP = 64 * _MIB
_DEFAULT_SLACK = 64 * _KIB
_DEFAULT_MAX_DEPTH = 8
_HARD_MAX_DEPTH = 128
_DEFAULT_MIN_ARRAY_LEN = 1024
_DEFAULT_MIN_MAP_LEN = 256
# The msgpack-numpy envelope is a map of five keys; each record is a map of its features.
_NUMPY_MAP_LEN = 5
_LIMIT_KEYS = ("max_record_bytes", "max_depth", "max_array_len", "max_map_len")
_FEATURE_KEYS = ("dtype", "shape")
_TOP_KEYS = ("features", "label", "limits")


def _is_int(value: object) -> bool:
    # bool is an int subclass; a setting of `true` is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _dtype_of(setting: str, value: DTypeLike) -> np.dtype[Any]:
    allowed = f"one of {', '.join(ALLOWED_DTYPES)}"
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
    rule = f"a list of at most {_MAX_NDIM} integers in 1..{_MAX_DIM} ([] for a scalar)"
    if not isinstance(value, list | tuple) or len(value) > _MAX_NDIM:
        raise ConfigError(setting, value, rule)
    for i, dim in enumerate(value):
        if not _is_int(dim) or not 0 < dim <= _MAX_DIM:
            raise ConfigError(f"{setting}[{i}]", dim, rule)
    return tuple(int(d) for d in value)


@dataclass(frozen=True, slots=True, init=False)
class Feature:
    """One named tensor of a record: its dtype and its shape (``()`` for a scalar).

    >>> f = Feature("x", "float32", (16,))
    >>> f.dtype, f.shape, f.nbytes
    (dtype('float32'), (16,), 64)
    """

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    def __init__(self, name: str, dtype: DTypeLike, shape: Sequence[int] = ()) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ConfigError("features", name, _NAME_RULE)
        setting = f"features.{name}"
        if name in RESERVED_NAMES:
            raise ConfigError(setting, name, _NAME_RULE)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", _dtype_of(f"{setting}.dtype", dtype))
        object.__setattr__(self, "shape", _shape_of(f"{setting}.shape", shape))
        if self.nbytes > _HARD_MAX_BYTES:
            raise ConfigError(
                f"{setting}.shape",
                list(self.shape),
                f"at most {_HARD_MAX_BYTES} bytes per feature ({self.nbytes} with {self.dtype})",
            )

    @property
    def size(self) -> int:
        """Number of elements: the product of the shape (1 for a scalar)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Size of the raw little-endian encoding in bytes."""
        return self.size * self.dtype.itemsize

    def to_dict(self) -> dict[str, Any]:
        """The ``[features.<name>]`` table of this feature."""
        return {"dtype": self.dtype.name, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class Schema:
    """The features of a record, the label among them, and the decoder's safety limits.

    A limit of 0 (the default) is derived from the features: ``max_record_bytes`` is
    4 x the raw size of all features + 64 KiB (at most 64 MiB unless the features need
    more), ``max_depth`` 8, ``max_array_len`` 1024 or the largest dimension, ``max_map_len``
    256 or twice the feature count + 16. Depth counts the record's map as 1, so a feature
    of shape ``(a, b)`` sent as nested lists needs depth 3, as does any msgpack-numpy array.

    >>> s = Schema.from_toml_text('''
    ... label = "y"
    ... [features.x]
    ... dtype = "float32"
    ... shape = [16]
    ... [features.y]
    ... dtype = "float32"
    ... ''')
    >>> s.feature_names, [f.name for f in s.input_features], s.max_depth
    (('x', 'y'), ['x'], 8)
    """

    features: tuple[Feature, ...]
    label: str | None = None
    max_record_bytes: int = 0
    max_depth: int = 0
    max_array_len: int = 0
    max_map_len: int = 0

    def __post_init__(self) -> None:
        features = tuple(self.features)
        if not features or not all(isinstance(f, Feature) for f in features):
            raise ConfigError("features", self.features, "at least one feature")
        object.__setattr__(self, "features", features)
        names = [f.name for f in features]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"features.{name}", name, "feature names must be unique")
        if self.label is not None and self.label not in names:
            raise ConfigError("label", self.label, f"the name of a feature, one of {names}")
        self._set_limits()

    def _set_limits(self) -> None:
        raw = sum(f.nbytes for f in self.features)
        min_bytes = max(1, raw)
        default_bytes = max(
            min(4 * raw + _DEFAULT_SLACK, _DEFAULT_RECORD_CAP), raw + _DEFAULT_SLACK
        )
        max_ndim = max(len(f.shape) for f in self.features)
        min_depth = max(3, 1 + max_ndim)
        max_dim = max((d for f in self.features for d in f.shape), default=1)
        min_map = max(len(self.features), _NUMPY_MAP_LEN)
        limits = {
            "max_record_bytes": (
                default_bytes,
                min_bytes,
                _HARD_MAX_BYTES,
                "bytes of one record: at least the raw size of all features",
            ),
            "max_depth": (
                max(_DEFAULT_MAX_DEPTH, min_depth),
                min_depth,
                _HARD_MAX_DEPTH,
                "nesting levels, the record's map counting as 1: at least 3 "
                "(msgpack-numpy arrays) and 1 + the most dimensions of a feature",
            ),
            "max_array_len": (
                max(_DEFAULT_MIN_ARRAY_LEN, max_dim),
                1,
                2**32 - 1,
                "elements of one msgpack array",
            ),
            "max_map_len": (
                max(_DEFAULT_MIN_MAP_LEN, 2 * len(self.features) + 16),
                min_map,
                2**32 - 1,
                "keys of one msgpack map: at least the number of features and 5",
            ),
        }
        for key, (default, low, high, what) in limits.items():
            value = getattr(self, key)
            if not _is_int(value):
                raise ConfigError(f"limits.{key}", value, f"an integer: {what}")
            if value == 0:
                object.__setattr__(self, key, default)
            elif not low <= value <= high:
                raise ConfigError(f"limits.{key}", value, f"{low}..{high} {what}")

    # -- views ------------------------------------------------------------------------------

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Names of all features, in schema order."""
        return tuple(f.name for f in self.features)

    @property
    def input_features(self) -> tuple[Feature, ...]:
        """All features except the label."""
        return tuple(f for f in self.features if f.name != self.label)

    def feature(self, name: str) -> Feature:
        """The feature called ``name`` (KeyError if there is none)."""
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(name)

    # -- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The schema as the dict ``from_dict`` reads (limits included, all explicit)."""
        out: dict[str, Any] = {}
        if self.label is not None:
            out["label"] = self.label
        out["features"] = {f.name: f.to_dict() for f in self.features}
        out["limits"] = {key: getattr(self, key) for key in _LIMIT_KEYS}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schema:
        """Build a schema from the parsed TOML/JSON document.

        >>> Schema.from_dict({"features": {"x": {"dtype": "int64"}}}).features
        (Feature(name='x', dtype=dtype('int64'), shape=()),)
        """
        if not isinstance(data, Mapping):
            raise ConfigError(
                "schema", data, "a table with 'features' and optional 'label', 'limits'"
            )
        _no_unknown_keys("", data, _TOP_KEYS)
        tables = data.get("features")
        if not isinstance(tables, Mapping) or not tables:
            raise ConfigError(
                "features", tables, "a table of feature tables, e.g. [features.x] dtype = 'float32'"
            )
        features = []
        for name, table in tables.items():
            if not isinstance(name, str) or not _NAME_RE.match(name) or name in RESERVED_NAMES:
                raise ConfigError("features", name, _NAME_RULE)
            setting = f"features.{name}"
            if not isinstance(table, Mapping):
                raise ConfigError(setting, table, "a table with 'dtype' and optional 'shape'")
            _no_unknown_keys(setting, table, _FEATURE_KEYS)
            if "dtype" not in table:
                raise ConfigError(f"{setting}.dtype", None, f"one of {', '.join(ALLOWED_DTYPES)}")
            dtype = table["dtype"]
            if not isinstance(dtype, str):
                raise ConfigError(f"{setting}.dtype", dtype, f"one of {', '.join(ALLOWED_DTYPES)}")
            features.append(Feature(name, dtype, table.get("shape", ())))
        label = data.get("label")
        if label is not None and not isinstance(label, str):
            raise ConfigError("label", label, "the name of a feature")
        limits = data.get("limits", {})
        if not isinstance(limits, Mapping):
            raise ConfigError("limits", limits, f"a table with some of {', '.join(_LIMIT_KEYS)}")
        _no_unknown_keys("limits", limits, _LIMIT_KEYS)
        for key, value in limits.items():
            if not _is_int(value) or value <= 0:
                raise ConfigError(f"limits.{key}", value, "a positive integer")
        return cls(features=tuple(features), label=label, **limits)

    @classmethod
    def from_toml_text(cls, text: str) -> Schema:
        """Parse a TOML document (see the class docstring for the layout)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("schema", _excerpt(text), f"a valid TOML document: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def from_json_text(cls, text: str) -> Schema:
        """Parse a JSON document with the same layout as the TOML one."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("schema", _excerpt(text), f"a valid JSON document: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Schema:
        """Load a ``.toml`` or ``.json`` schema file; errors name the setting and the file."""
        p = Path(path)
        suffix = p.suffix.lower()
        if suffix not in (".toml", ".json"):
            raise ConfigError("schema file", str(p), "a file named *.toml or *.json")
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("schema file", str(p), f"a readable file: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError("schema file", str(p), f"UTF-8 text: {exc.reason}") from exc
        try:
            return cls.from_toml_text(text) if suffix == ".toml" else cls.from_json_text(text)
        except ConfigError as exc:
            exc.add_note(f"in schema file {p}")
            raise


def _no_unknown_keys(prefix: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in table:
        if key not in allowed:
            setting = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(setting, table[key], f"unknown key; allowed: {', '.join(allowed)}")


def _excerpt(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
