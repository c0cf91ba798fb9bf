"""The record schema: each feature's dtype, shape and kind, the label, and the decoder's limits.

Feature kinds, in the vocabulary of ``tf.io``'s feature specs:

- fixed (``FixedLenFeature``): ``shape = [16]`` (``[]`` for a scalar) -> ``[batch, *shape]``;
- variable-length (``RaggedFeature``): ``shape = [-1]`` or ``[-1, 8]`` -> a ``tf.RaggedTensor``
  ``[batch, None, ...]``, at most ``max_len`` rows per record;
- padded (``FixedLenSequenceFeature``): a variable-length one with ``pad_to = N`` -> a dense
  ``[batch, N, ...]`` (truncated, or padded with ``pad_value``) plus ``<name>_length`` (int32);
- strings: ``dtype = "string"`` (msgpack str or bin) -> ``tf.string``, of any of the shapes above;
- optional: ``default = <value>`` (``[]`` for a variable-length one) stands in for a missing
  field; a feature without a default is required.

NaN and ±Inf in a float feature are refused (``dtype``) unless it says
``allow_non_finite = true``. ``label`` names the feature the model learns (a list of names for a
model of several outputs: the labels go to Keras as a dict keyed by feature name, which must
match the model's output names); ``weight`` names a numeric scalar feature that is Keras'
``sample_weight`` and never an input.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumers.errors import ConfigError
from streamer.decode.feature import (
    ALLOWED_DTYPES,
    HARD_MAX_BYTES,
    LENGTH_SUFFIX,
    NAME_RE,
    NAME_RULE,
    RESERVED_NAMES,
    ROW_LENGTHS_SUFFIX,
    STRING,
    Feature,
    is_int,
)

__all__ = [
    "ALLOWED_DTYPES",
    "LENGTH_SUFFIX",
    "RESERVED_NAMES",
    "ROW_LENGTHS_SUFFIX",
    "STRING",
    "Feature",
    "Schema",
]

_KIB = 1024
_MIB = 1024 * _KIB
_DEFAULT_RECORD_CAP = 64 * _MIB
_DEFAULT_SLACK = 64 * _KIB
_DEFAULT_MAX_DEPTH = 8
_HARD_MAX_DEPTH = 128
_DEFAULT_MIN_ARRAY_LEN = 1024
_DEFAULT_MIN_MAP_LEN = 256
# The msgpack-numpy envelope is a map of five keys; each record is a map of its features.
_NUMPY_MAP_LEN = 5
_LIMIT_KEYS = ("max_record_bytes", "max_depth", "max_array_len", "max_map_len")
_FEATURE_KEYS = ("dtype", "shape", "max_len", "pad_to", "pad_value", "default", "allow_non_finite")
_TOP_KEYS = ("features", "label", "weight", "limits")


@dataclass(frozen=True, slots=True)
class Schema:
    """The features of a record, the label among them, and the decoder's safety limits.

    A limit of 0 (the default) is derived from the features: ``max_record_bytes`` is
    4 x the raw size of all features (variable-length ones at ``max_len`` rows) + 64 KiB (at
    most 64 MiB unless the fixed-shape features need more), ``max_depth`` 8,
    ``max_array_len`` 1024 or the largest dimension, ``max_len`` or ``pad_to``,
    ``max_map_len`` 256 or twice the feature count + 16. A variable-length feature without
    ``max_len`` takes ``max_array_len``: a longer list is a ``shape`` reject, never an
    allocation. Depth counts the record's map as 1, so a feature of shape ``(a, b)`` sent as
    nested lists needs depth 3, as does any msgpack-numpy array.

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
    label: str | tuple[str, ...] | None = None
    weight: str | None = None
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
        for f in features:
            derived = f.name + (LENGTH_SUFFIX if f.is_padded else ROW_LENGTHS_SUFFIX)
            if f.is_variable and (derived in names or derived in RESERVED_NAMES):
                raise ConfigError(
                    f"features.{derived}",
                    derived,
                    f"a name of its own: the {'length column' if f.is_padded else 'row lengths'}"
                    f" of variable-length feature {f.name!r} is called {derived!r}",
                )
        if isinstance(self.label, list | tuple):
            labels = tuple(self.label)
            if not labels:
                raise ConfigError("label", list(self.label), "a feature name or a list of them")
            object.__setattr__(self, "label", labels[0] if len(labels) == 1 else labels)
        for label in self.labels:
            if not isinstance(label, str) or label not in names:
                raise ConfigError("label", label, f"the name of a feature, one of {names}")
            if self.labels.count(label) > 1:
                raise ConfigError("label", list(self.labels), "each label once")
            if not self.feature(label).is_dense_numeric:
                raise ConfigError(
                    "label", label, "a numeric feature of fixed shape (not string or [-1])"
                )
        if self.weight is not None:
            if not isinstance(self.weight, str) or self.weight not in names:
                raise ConfigError("weight", self.weight, f"the name of a feature, one of {names}")
            if self.weight in self.labels:
                raise ConfigError("weight", self.weight, "a feature other than the label")
            w = self.feature(self.weight)
            if not w.is_dense_numeric or w.shape or w.dtype.kind == "b":
                raise ConfigError(
                    "weight",
                    self.weight,
                    "a numeric scalar feature (shape []): one sample weight per record",
                )
        self._set_limits()

    def _set_limits(self) -> None:
        fixed_raw = sum(f.nbytes for f in self.features if not f.is_variable)
        lens = [f.max_len for f in self.features if f.max_len is not None]
        lens += [f.pad_to for f in self.features if f.pad_to is not None]
        max_dim = max((d for f in self.features for d in f.shape), default=1)
        array_len = self.max_array_len
        if not is_int(array_len):
            raise ConfigError("limits.max_array_len", array_len, "an integer")
        if array_len == 0:
            array_len = max(_DEFAULT_MIN_ARRAY_LEN, max_dim, *lens)
        elif not 1 <= array_len <= 2**32 - 1:
            raise ConfigError(
                "limits.max_array_len", array_len, f"1..{2**32 - 1} elements of one msgpack array"
            )
        else:
            for f in self.features:
                for key in ("max_len", "pad_to"):
                    value = getattr(f, key)
                    if value is not None and value > array_len:
                        raise ConfigError(
                            "limits.max_array_len",
                            array_len,
                            f"at least every feature's max_len and pad_to "
                            f"(features.{f.name}.{key} = {value})",
                        )
        # Variable-length features without max_len take max_array_len: every list is bounded.
        features = tuple(
            f.with_max_len(array_len) if f.is_variable and f.max_len is None else f
            for f in self.features
        )
        object.__setattr__(self, "features", features)
        raw = sum(f.nbytes for f in features)
        min_bytes = max(1, fixed_raw)
        default_bytes = max(
            min(4 * raw + _DEFAULT_SLACK, _DEFAULT_RECORD_CAP), fixed_raw + _DEFAULT_SLACK
        )
        max_ndim = max(len(f.shape) for f in self.features)
        min_depth = max(3, 1 + max_ndim)
        min_map = max(len(self.features), _NUMPY_MAP_LEN)
        limits = {
            "max_record_bytes": (
                default_bytes,
                min_bytes,
                HARD_MAX_BYTES,
                "bytes of one record: at least the raw size of all fixed-shape features",
            ),
            "max_depth": (
                max(_DEFAULT_MAX_DEPTH, min_depth),
                min_depth,
                _HARD_MAX_DEPTH,
                "nesting levels, the record's map counting as 1: at least 3 "
                "(msgpack-numpy arrays) and 1 + the most dimensions of a feature",
            ),
            "max_array_len": (
                array_len,
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
            if not is_int(value):
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
    def labels(self) -> tuple[str, ...]:
        """The label features' names: none, one, or one per output of the model."""
        if self.label is None:
            return ()
        return (self.label,) if isinstance(self.label, str) else self.label

    @property
    def input_features(self) -> tuple[Feature, ...]:
        """All features except the labels and the sample weight."""
        skip = {*self.labels, self.weight}
        return tuple(f for f in self.features if f.name not in skip)

    def with_weight(self, weight: str | None) -> Schema:
        """This schema with ``weight`` as its sample-weight feature (``--sample-weight``)."""
        if weight == self.weight:
            return self
        return Schema(
            self.features,
            self.label,
            weight,
            self.max_record_bytes,
            self.max_depth,
            self.max_array_len,
            self.max_map_len,
        )

    def feature(self, name: str) -> Feature:
        """The feature called ``name`` (KeyError if there is none)."""
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def input_columns(self) -> tuple[str, ...]:
        """The columns a model may take: every feature but the label, and the
        ``<name>_length`` column of each padded one."""
        out: list[str] = []
        for f in self.input_features:
            out.append(f.name)
            if f.is_padded:
                out.append(f.name + LENGTH_SUFFIX)
        return tuple(out)

    def check_builtin_model(self) -> None:
        """ConfigError unless the built-in model can take every input feature.

        >>> schema = Schema((Feature("ids", "int64", (-1,)), Feature("y", "float32")), label="y")
        >>> schema.check_builtin_model()                    # doctest: +ELLIPSIS
        Traceback (most recent call last):
        consumers.errors.ConfigError: invalid setting model=None: the built-in model takes ...
        """
        if len(self.labels) > 1:
            raise ConfigError(
                "model",
                None,
                f"the built-in model has one output, and the schema names labels "
                f"{list(self.labels)}: give a model of your own with one output per label "
                "(--model package.module:function)",
            )
        others = [
            f"{f.name} ({STRING if f.is_string else f.dtype.name}{list(f.shape)})"
            for f in self.input_features
            if not f.is_dense_numeric
        ]
        if others:
            raise ConfigError(
                "model",
                None,
                "the built-in model takes numeric fixed-shape features only, and "
                f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} not: give a model "
                "of your own with --model package.module:function (examples/recommender.py in "
                "the repository takes strings and variable-length lists)",
            )

    # -- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The schema as the dict ``from_dict`` reads (limits included, all explicit)."""
        out: dict[str, Any] = {}
        if self.label is not None:
            out["label"] = self.label if isinstance(self.label, str) else list(self.label)
        if self.weight is not None:
            out["weight"] = self.weight
        out["features"] = {f.name: f.to_dict() for f in self.features}
        out["limits"] = {key: getattr(self, key) for key in _LIMIT_KEYS}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schema:
        """Build a schema from the parsed TOML/JSON document.

        >>> Schema.from_dict({"features": {"x": {"dtype": "int64"}}}).features
        (Feature(name='x', dtype='int64', shape=()),)
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
            if not isinstance(name, str) or not NAME_RE.match(name) or name in RESERVED_NAMES:
                raise ConfigError("features", name, NAME_RULE)
            setting = f"features.{name}"
            if not isinstance(table, Mapping):
                raise ConfigError(
                    setting, table, f"a table with 'dtype' and some of {', '.join(_FEATURE_KEYS)}"
                )
            _no_unknown_keys(setting, table, _FEATURE_KEYS)
            allowed = f"one of {', '.join(ALLOWED_DTYPES)}, {STRING}"
            if "dtype" not in table:
                raise ConfigError(f"{setting}.dtype", None, allowed)
            dtype = table["dtype"]
            if not isinstance(dtype, str):
                raise ConfigError(f"{setting}.dtype", dtype, allowed)
            features.append(
                Feature(
                    name,
                    dtype,
                    table.get("shape", ()),
                    max_len=table.get("max_len"),
                    pad_to=table.get("pad_to"),
                    pad_value=table.get("pad_value"),
                    default=table.get("default"),
                    allow_non_finite=table.get("allow_non_finite", False),
                )
            )
        label = data.get("label")
        if label is not None and not (
            isinstance(label, str)
            or (isinstance(label, list) and label and all(isinstance(x, str) for x in label))
        ):
            raise ConfigError("label", label, "the name of a feature, or a list of names")
        if isinstance(label, list):
            label = tuple(label)
        weight = data.get("weight")
        if weight is not None and not isinstance(weight, str):
            raise ConfigError("weight", weight, "the name of a feature")
        limits = data.get("limits", {})
        if not isinstance(limits, Mapping):
            raise ConfigError("limits", limits, f"a table with some of {', '.join(_LIMIT_KEYS)}")
        _no_unknown_keys("limits", limits, _LIMIT_KEYS)
        for key, value in limits.items():
            if not is_int(value) or value <= 0:
                raise ConfigError(f"limits.{key}", value, "a positive integer")
        return cls(features=tuple(features), label=label, weight=weight, **limits)

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
            if exc.setting == "schema":  # the document does not parse: name the file, not its text
                raise ConfigError("schema file", str(p), exc.allowed) from exc
            # The CLI prints the message only: it names the file too.
            named = ConfigError(exc.setting, exc.value, f"{exc.allowed} (in schema file {p})")
            named.add_note(f"in schema file {p}")
            raise named from exc


def _no_unknown_keys(prefix: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in table:
        if key not in allowed:
            setting = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(setting, table[key], f"unknown key; allowed: {', '.join(allowed)}")


def _excerpt(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
