"""Tests of streamer.decode.schema: loading TOML and JSON, derived limits, and every error path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from consumers.errors import ConfigError
from streamer.decode.schema import ALLOWED_DTYPES, Feature, Schema

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
        ({"feature": {}}, "feature", {}, "allowed: features, label, weight, limits"),
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
    assert str(path) in str(info.value)  # the CLI prints the message alone


def test_a_syntax_error_names_the_file_not_its_text(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('label = "y"\nsecret_looking_line = \n')
    with pytest.raises(ConfigError) as info:
        Schema.from_file(path)
    assert info.value.setting == "schema file" and info.value.value == str(path)
    assert "a valid TOML document" in str(info.value)
    assert "secret_looking_line" not in str(info.value)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"features\.x\.dtype"):
        Schema.from_toml_text('[features.x]\ndtype = "half"\n')


# -- variable-length, padded, string and optional features -------------------------------------

KINDS_TOML = """
label = "rating"

[features.user]
dtype = "string"

[features.tags]
dtype = "string"
shape = [-1]
max_len = 4
default = []

[features.items]
dtype = "int64"
shape = [-1]
max_len = 50
default = []

[features.clicks]
dtype = "float32"
shape = [-1, 2]
pad_to = 3
pad_value = -1.0

[features.country]
dtype = "string"
default = "unknown"

[features.x]
dtype = "float32"
shape = [4]
default = 0.5

[features.rating]
dtype = "float32"
"""


def test_every_feature_kind_parses() -> None:
    schema = Schema.from_toml_text(KINDS_TOML)
    user, tags, items, clicks, country, x = schema.input_features
    assert user.is_string and not user.is_variable and user.required
    assert user.dtype == np.dtype(object) and user.nbytes == 0
    assert tags.is_string and tags.is_ragged and tags.max_len == 4 and tags.default == ()
    assert items.is_ragged and not items.is_padded and items.inner_shape == ()
    assert items.max_len == 50 and items.nbytes == 400 and items.default == ()
    assert clicks.is_padded and not clicks.is_ragged and clicks.inner_shape == (2,)
    assert clicks.pad_to == 3 and clicks.pad_value == -1.0 and clicks.required
    # Without max_len a variable-length feature takes max_array_len: every list is bounded.
    assert clicks.max_len == schema.max_array_len == 1024
    assert country.default == "unknown" and not country.required
    assert x.default == (0.5,) * 4 and x.is_dense_numeric
    assert schema.input_columns == (
        "user",
        "tags",
        "items",
        "clicks",
        "clicks_length",
        "country",
        "x",
    )
    # The record limit counts variable-length features at max_len rows.
    assert schema.max_record_bytes == 4 * (4 * 4 + 50 * 8 + 1024 * 8 + 4) + 64 * 1024
    assert schema.max_depth == 8


def test_every_feature_kind_round_trips_through_dict_and_json() -> None:
    schema = Schema.from_toml_text(KINDS_TOML)
    again = Schema.from_json_text(json.dumps(schema.to_dict()))
    assert again == schema
    assert schema.to_dict()["features"]["clicks"] == {
        "dtype": "float32",
        "shape": [-1, 2],
        "max_len": 1024,
        "pad_to": 3,
        "pad_value": -1.0,
    }
    nested = Feature("p", "int8", (-1, 2), default=[[1, 2], [3, 4]])
    assert nested.default == (1, 2, 3, 4)
    assert nested.to_dict()["default"] == [[1, 2], [3, 4]]
    assert repr(nested) == "Feature(name='p', dtype='int8', shape=(-1, 2), default=(1, 2, 3, 4))"


def test_pad_value_defaults_by_dtype() -> None:
    assert Feature("a", "int32", (-1,), pad_to=2).pad_value == 0
    assert Feature("a", "float16", (-1,), pad_to=2).pad_value == 0.0
    assert Feature("a", "bool", (-1,), pad_to=2).pad_value is False
    assert Feature("a", "string", (-1,), pad_to=2).pad_value == ""


def test_max_array_len_grows_with_max_len_and_pad_to() -> None:
    schema = Schema((Feature("a", "int8", (-1,), max_len=5000), Feature("b", "int8", (-1,))))
    assert schema.max_array_len == 5000
    assert schema.feature("b").max_len == 5000


def test_builtin_model_refuses_strings_and_variable_length_inputs() -> None:
    Schema.from_toml_text(TOML).check_builtin_model()
    # A string or ragged label is refused elsewhere; inputs of those kinds need --model.
    with pytest.raises(ConfigError) as info:
        Schema.from_toml_text(KINDS_TOML).check_builtin_model()
    assert info.value.setting == "model"
    for part in ("user (string[])", "items (int64[-1])", "clicks (float32[-1, 2])", "--model"):
        assert part in info.value.allowed
    assert "country" in info.value.allowed and "x (" not in info.value.allowed


def _var(**table: Any) -> dict[str, Any]:
    return _features(v={"dtype": "int32", "shape": [-1], **table})


@pytest.mark.parametrize(
    ("doc", "setting", "value", "allowed"),
    [
        (_features(v={"dtype": "int8", "shape": [3, -1]}), "features.v.shape[1]", -1, "first"),
        (_features(v={"dtype": "int8", "shape": [-2]}), "features.v.shape[0]", -2, "-1"),
        (_features(v={"dtype": "int8", "max_len": 3}), "features.v.max_len", 3, "variable"),
        (_features(v={"dtype": "int8", "pad_to": 3}), "features.v.pad_to", 3, "variable"),
        (_var(max_len=0), "features.v.max_len", 0, "1.."),
        (_var(max_len=2.0), "features.v.max_len", 2.0, "an integer"),
        (_var(max_len=True), "features.v.max_len", True, "an integer"),
        (_var(max_len=2, pad_to=3), "features.v.pad_to", 3, "at most max_len (2)"),
        (_var(pad_value=1), "features.v.pad_value", 1, "with pad_to only"),
        (_var(pad_to=2, pad_value=1.5), "features.v.pad_value", 1.5, "an integer"),
        (_var(pad_to=2, pad_value=2**40), "features.v.pad_value", 2**40, "an integer in"),
        (_var(default=3), "features.v.default", 3, "a list of rows"),
        (_var(default=[1, "a"]), "features.v.default", "a", "a number"),
        (_var(default=[[1]]), "features.v.default", [[1]], "rows of shape []"),
        (_var(max_len=2, default=[1, 2, 3]), "features.v.default", [1, 2, 3], "a list of rows"),
        (
            _features(v={"dtype": "int8", "shape": [-1, 2], "default": [[1, 2], [3]]}),
            "features.v.default",
            [[1, 2], [3]],
            "rows of shape [2]",
        ),
        (
            _features(v={"dtype": "float32", "shape": [2], "default": [1.0]}),
            "features.v.default",
            [1.0],
            "a list of shape [2]",
        ),
        (_features(v={"dtype": "bool", "default": 1}), "features.v.default", 1, "true or false"),
        (_features(v={"dtype": "int8", "default": True}), "features.v.default", True, "a number"),
        (_features(v={"dtype": "float16", "default": 1e6}), "features.v.default", 1e6, "range"),
        (_features(v={"dtype": "string", "default": 5}), "features.v.default", 5, "a string"),
        (
            _features(v={"dtype": "string", "shape": [-1], "default": ["a", 1]}),
            "features.v.default",
            1,
            "a string",
        ),
        (
            _features(v={"dtype": "float64", "shape": [-1, 2**20]}),
            "features.v.max_len",
            2**20,
            "bytes per feature",
        ),
        (
            _features(v={"dtype": "float64", "shape": [-1, 2**20], "max_len": 2**10}),
            "features.v.max_len",
            2**10,
            "bytes per feature",
        ),
        (
            {**_var(max_len=100), "limits": {"max_array_len": 50}},
            "limits.max_array_len",
            50,
            "features.v.max_len = 100",
        ),
        (
            _features(v={"dtype": "int8", "shape": [-1], "pad_to": 2}, v_length={"dtype": "int8"}),
            "features.v_length",
            "v_length",
            "length column",
        ),
        (
            _features(v={"dtype": "int8", "shape": [-1]}, v_row_lengths={"dtype": "int8"}),
            "features.v_row_lengths",
            "v_row_lengths",
            "row lengths",
        ),
        (
            {**_features(v={"dtype": "string"}), "label": "v"},
            "label",
            "v",
            "a numeric feature of fixed shape",
        ),
        (
            {**_var(), "label": "v"},
            "label",
            "v",
            "a numeric feature of fixed shape",
        ),
        (_var(size=2), "features.v.size", 2, "max_len, pad_to, pad_value, default"),
    ],
)
def test_new_kinds_errors_name_setting_value_and_rule(
    doc: Any, setting: str, value: object, allowed: str
) -> None:
    error = _error(doc)
    assert error.setting == setting, error
    assert error.value == value and type(error.value) is type(value)
    assert allowed in error.allowed, error.allowed
    assert setting in str(error)


def test_every_toml_schema_in_the_docs_parses() -> None:
    import re

    docs = Path(__file__).resolve().parents[3] / "docs"
    pages = [docs / "reference" / "schema.md", docs / "tutorials" / "recommender.md"]
    text = "".join(page.read_text(encoding="utf-8") for page in pages)
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    for text in blocks:
        schema = Schema.from_toml_text(text)
        assert schema.label is not None
    kinds = Schema.from_toml_text(max(blocks, key=len))
    assert {f.name for f in kinds.features if f.is_ragged} == {"items", "tags", "recent"}
    assert kinds.feature("clicks").is_padded and kinds.feature("country").default == "unknown"


def test_labels_weight_and_allow_non_finite() -> None:
    schema = Schema.from_toml_text(
        """
label = ["price", "clicked"]
weight = "w"
[features.x]
dtype = "float32"
shape = [4]
allow_non_finite = true
[features.price]
dtype = "float32"
[features.clicked]
dtype = "float32"
[features.w]
dtype = "float32"
"""
    )
    assert schema.labels == ("price", "clicked") and schema.weight == "w"
    assert [f.name for f in schema.input_features] == ["x"]
    assert schema.feature("x").allow_non_finite and not schema.feature("x").finite_only
    assert schema.feature("price").finite_only
    assert Schema.from_dict(schema.to_dict()) == schema


@pytest.mark.parametrize(
    ("data", "setting", "allowed"),
    [
        ({"weight": "nope"}, "weight", "the name of a feature"),
        ({"weight": "y"}, "weight", "other than the label"),
        ({"weight": "v"}, "weight", "numeric scalar"),
        ({"label": ["y", "y"]}, "label", "each label once"),
        ({"label": []}, "label", "a list of names"),
    ],
)
def test_bad_labels_and_weights_are_refused(
    data: dict[str, Any], setting: str, allowed: str
) -> None:
    tables = {"y": {"dtype": "float32"}, "v": {"dtype": "float32", "shape": [2]}}
    with pytest.raises(ConfigError) as info:
        Schema.from_dict({"label": "y", **data, "features": tables})
    assert info.value.setting == setting and allowed in info.value.allowed


def test_allow_non_finite_only_on_floats_and_defaults_are_finite() -> None:
    with pytest.raises(ConfigError, match="float feature only"):
        Feature("n", "int32", allow_non_finite=True)
    with pytest.raises(ConfigError, match="finite numbers"):
        Feature("f", "float32", default=float("nan"))
    assert Feature("f", "float32", default=float("nan"), allow_non_finite=True).default != 0
