"""Tests of streamer.schema: loading TOML and JSON, derived limits, and every error path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from consumers.errors import ConfigError
from streamer.schema import ALLOWED_DTYPES, Feature, Schema

TOML = """
label = "y"

[features.x]
dtype = "float32"
shape = [16]

[features.img]
dtype = "uint8"
shape = [4, 3]

[features.y]
dtype = "float32"
shape = []

[features.flag]
dtype = "bool"

[limits]
max_record_bytes = 1048576
max_depth = 8
"""

DOC: dict[str, Any] = {
    "label": "y",
    "features": {
        "x": {"dtype": "float32", "shape": [16]},
        "img": {"dtype": "uint8", "shape": [4, 3]},
        "y": {"dtype": "float32", "shape": []},
        "flag": {"dtype": "bool"},
    },
    "limits": {"max_record_bytes": 1048576, "max_depth": 8},
}


def _check(schema: Schema) -> None:
    assert schema.feature_names == ("x", "img", "y", "flag")
    assert schema.label == "y"
    assert [f.name for f in schema.input_features] == ["x", "img", "flag"]
    x = schema.feature("x")
    assert x.dtype == np.dtype(np.float32)
    assert x.shape == (16,)
    assert x.nbytes == 64
    assert schema.feature("img").nbytes == 12
    assert schema.feature("y").shape == ()
    assert schema.feature("y").nbytes == 4
    assert schema.feature("flag").dtype == np.dtype(bool)
    assert schema.max_record_bytes == 1048576
    assert schema.max_depth == 8


def test_toml_text() -> None:
    _check(Schema.from_toml_text(TOML))


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "schema.toml"
    path.write_text(TOML)
    _check(Schema.from_file(path))
    _check(Schema.from_file(str(path)))


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "schema.JSON"
    path.write_text(json.dumps(DOC))
    _check(Schema.from_file(path))


def test_to_dict_round_trip() -> None:
    schema = Schema.from_toml_text(TOML)
    assert Schema.from_dict(schema.to_dict()) == schema
    assert Schema.from_json_text(json.dumps(schema.to_dict())) == schema
    assert schema.to_dict()["features"]["x"] == {"dtype": "float32", "shape": [16]}


@pytest.mark.parametrize("dtype", ALLOWED_DTYPES)
def test_every_allowed_dtype(dtype: str) -> None:
    schema = Schema.from_dict({"features": {"v": {"dtype": dtype, "shape": [2]}}})
    assert schema.features[0].dtype == np.dtype(dtype)
    assert schema.features[0].nbytes == 2 * np.dtype(dtype).itemsize


def test_defaults_are_derived_from_features() -> None:
    schema = Schema.from_dict({"features": {"x": {"dtype": "float32", "shape": [250]}}})
    assert schema.label is None
    assert schema.input_features == schema.features
    assert schema.max_record_bytes == 4 * 1000 + 64 * 1024
    assert schema.max_depth == 8
    assert schema.max_array_len == 1024
    assert schema.max_map_len >= 256
    big = Schema((Feature("x", "float64", (2000, 3000)),))
    assert big.max_record_bytes >= big.features[0].nbytes + 64 * 1024
    assert big.max_array_len == 3000
    deep = Schema((Feature("x", "int8", (1,) * 10),))
    assert deep.max_depth == 11


def test_feature_accepts_numpy_dtypes() -> None:
    assert Feature("a", np.float32, [3]).dtype == np.dtype("float32")
    assert Feature("a", np.dtype("int16")).shape == ()
    assert Feature("a", "float32", (2,)) == Feature("a", np.float32, [2])
    assert hash(Schema((Feature("a", "int8"),))) == hash(Schema((Feature("a", np.int8),)))


def test_feature_lookup_of_unknown_name() -> None:
    with pytest.raises(KeyError):
        Schema.from_toml_text(TOML).feature("nope")


# -- errors: each names the setting, the value and what is allowed -----------------------------


def _error(doc: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        Schema.from_dict(doc)
    return info.value


def _features(**tables: Any) -> dict[str, Any]:
    return {"features": tables}


@pytest.mark.parametrize(
    ("doc", "setting", "value", "allowed"),
    [
        ([1, 2], "schema", [1, 2], "table"),
        ({"features": {}}, "features", {}, "table of feature tables"),
        ({}, "features", None, "table of feature tables"),
        ({"features": [1]}, "features", [1], "table of feature tables"),
        ({"feature": {}}, "feature", {}, "allowed: features, label, limits"),
        (_features(x={"dtype": "float128"}), "features.x.dtype", "float128", "float32"),
        (_features(x={"dtype": "str"}), "features.x.dtype", "str", "one of bool"),
        (_features(x={"dtype": 4}), "features.x.dtype", 4, "one of bool"),
        (_features(x={"shape": [2]}), "features.x.dtype", None, "one of bool"),
        (_features(x={"dtype": "int8", "shape": [0]}), "features.x.shape[0]", 0, "integers"),
        (_features(x={"dtype": "int8", "shape": [2, -1]}), "features.x.shape[1]", -1, "1.."),
        (_features(x={"dtype": "int8", "shape": [2.0]}), "features.x.shape[0]", 2.0, "integers"),
        (_features(x={"dtype": "int8", "shape": [True]}), "features.x.shape[0]", True, "integer"),
        (_features(x={"dtype": "int8", "shape": 3}), "features.x.shape", 3, "a list"),
        (_features(x={"dtype": "int8", "shape": [1] * 33}), "features.x.shape", [1] * 33, "32"),
        (
            _features(x={"dtype": "int8", "shape": [2**31]}),
            "features.x.shape[0]",
            2**31,
            "integers",
        ),
        (
            _features(x={"dtype": "float64", "shape": [2**20, 2**10]}),
            "features.x.shape",
            [2**20, 2**10],
            "bytes per feature",
        ),
        (_features(x={"dtype": "int8", "size": 3}), "features.x.size", 3, "allowed: dtype, shape"),
        (_features(x="float32"), "features.x", "float32", "a table with 'dtype'"),
        (_features(partition={"dtype": "int8"}), "features", "partition", "not one of"),
        (_features(offset={"dtype": "int8"}), "features", "offset", "not one of"),
        (_features(timestamp={"dtype": "int8"}), "features", "timestamp", "not one of"),
        (_features(**{"": {"dtype": "int8"}}), "features", "", "1-128 characters"),
        (_features(**{"a b": {"dtype": "int8"}}), "features", "a b", "1-128 characters"),
        (_features(**{"1x": {"dtype": "int8"}}), "features", "1x", "a letter"),
        ({**_features(x={"dtype": "int8"}), "label": "y"}, "label", "y", "one of ['x']"),
        ({**_features(x={"dtype": "int8"}), "label": 3}, "label", 3, "name of a feature"),
        ({**_features(x={"dtype": "int8"}), "limits": 5}, "limits", 5, "max_record_bytes"),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_bytes": 5}},
            "limits.max_bytes",
            5,
            "allowed: max_record_bytes, max_depth",
        ),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_depth": 0}},
            "limits.max_depth",
            0,
            "positive integer",
        ),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_depth": "8"}},
            "limits.max_depth",
            "8",
            "positive integer",
        ),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_depth": 2}},
            "limits.max_depth",
            2,
            "at least 3",
        ),
        (
            {**_features(x={"dtype": "int8", "shape": [1, 1, 1]}), "limits": {"max_depth": 3}},
            "limits.max_depth",
            3,
            "1 + the most dimensions",
        ),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_depth": 1000}},
            "limits.max_depth",
            1000,
            "3..128",
        ),
        (
            {
                **_features(x={"dtype": "float32", "shape": [100]}),
                "limits": {"max_record_bytes": 399},
            },
            "limits.max_record_bytes",
            399,
            "400..",
        ),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_record_bytes": 2**31}},
            "limits.max_record_bytes",
            2**31,
            "..1073741824",
        ),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_map_len": 4}},
            "limits.max_map_len",
            4,
            "at least the number of features",
        ),
        (
            {**_features(x={"dtype": "int8"}), "limits": {"max_array_len": True}},
            "limits.max_array_len",
            True,
            "positive integer",
        ),
    ],
)
def test_error_names_setting_value_and_allowed(
    doc: Any, setting: str, value: object, allowed: str
) -> None:
    error = _error(doc)
    assert error.setting == setting
    assert error.value == value
    assert type(error.value) is type(value)
    assert allowed in error.allowed
    assert setting in str(error)
    assert repr(value) in str(error)


def test_duplicate_feature_names() -> None:
    with pytest.raises(ConfigError) as info:
        Schema((Feature("a", "int8"), Feature("a", "int16")))
    assert info.value.setting == "features.a"
    assert "unique" in info.value.allowed


def test_no_features() -> None:
    with pytest.raises(ConfigError) as info:
        Schema(())
    assert info.value.setting == "features"


def test_feature_rejects_structured_and_big_endian_dtypes() -> None:
    with pytest.raises(ConfigError) as info:
        Feature("a", np.dtype([("f", "<f4")]))
    assert info.value.setting == "features.a.dtype"
    with pytest.raises(ConfigError, match="native byte order"):
        Feature("a", np.dtype(">f4"))
    with pytest.raises(ConfigError, match=r"features\.a\.dtype"):
        Feature("a", "not a dtype")
    with pytest.raises(ConfigError, match=r"features\.a\.dtype"):
        Feature("a", object)
    with pytest.raises(ConfigError, match=r"features\.a\.dtype"):
        Feature("a", np.complex64)


def test_limit_of_wrong_type_in_constructor() -> None:
    with pytest.raises(ConfigError) as info:
        Schema((Feature("a", "int8"),), max_depth=2.5)  # type: ignore[arg-type]
    assert info.value.setting == "limits.max_depth"


@pytest.mark.parametrize(
    ("name", "text", "allowed"),
    [
        ("bad.toml", "label = \n", "valid TOML"),
        ("bad.toml", "[features.x]\ndtype = 'int8'\n[features.x]\n", "valid TOML"),
        ("bad.json", "{'features': 1}", "valid JSON"),
        ("bad.json", "", "valid JSON"),
        ("schema.yaml", "features: {}", "*.toml or *.json"),
        ("noext", "", "*.toml or *.json"),
    ],
)
def test_unparseable_files(tmp_path: Path, name: str, text: str, allowed: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Schema.from_file(path)
    assert allowed in info.value.allowed
    assert info.value.setting in ("schema", "schema file")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        Schema.from_file(path)
    assert info.value.setting == "schema file"
    assert info.value.value == str(path)
    assert "readable" in info.value.allowed
    assert isinstance(info.value.__cause__, OSError)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    path = tmp_path / "dir.toml"
    path.mkdir()
    with pytest.raises(ConfigError, match="readable"):
        Schema.from_file(path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.toml"
    path.write_bytes(b'label = "\xe9"\n')
    with pytest.raises(ConfigError, match="UTF-8"):
        Schema.from_file(path)


def test_error_in_file_names_setting_and_file(tmp_path: Path) -> None:
    path = tmp_path / "schema.toml"
    path.write_text('[features.x]\ndtype = "float128"\n')
    with pytest.raises(ConfigError) as info:
        Schema.from_file(path)
    assert info.value.setting == "features.x.dtype"
    assert info.value.value == "float128"
    assert any(str(path) in note for note in info.value.__notes__)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"features\.x\.dtype"):
        Schema.from_toml_text('[features.x]\ndtype = "half"\n')
