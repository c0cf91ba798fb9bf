"""streamer.decode.columns: the decode numpy_function's outputs (types, flat arrays) and the
batch dict rebuilt from them: ragged tensors, padded dense ones with their length, static
shapes, metadata last."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from streamer.decode.columns import METADATA_COLUMNS, flat_outputs, output_types, to_batch
from streamer.decode.ragged import Column, RaggedColumn
from streamer.decode.schema import Schema

SCHEMA = Schema.from_dict(
    {
        "label": "y",
        "features": {
            "x": {"dtype": "float32", "shape": [2]},
            "flag": {"dtype": "bool"},
            "user": {"dtype": "string"},
            "items": {"dtype": "int64", "shape": [-1]},
            "pairs": {"dtype": "float16", "shape": [-1, 2], "pad_to": 2, "pad_value": 9.0},
            "words": {"dtype": "string", "shape": [-1], "pad_to": 3},
            "y": {"dtype": "uint16"},
        },
    }
)


def _block() -> list[Column]:
    """Three records of SCHEMA as the decode lays them out (features, then metadata)."""
    return [
        np.array([[1, 2], [3, 4], [5, 6]], np.float32),
        np.array([True, False, True]),
        np.array([b"ann", b"bob", b""], dtype=object),
        RaggedColumn(np.array([10, 11, 12], np.int64), np.array([2, 0, 1], np.int64)),
        RaggedColumn(np.arange(10, dtype=np.float16).reshape(5, 2), np.array([0, 3, 2], np.int64)),
        RaggedColumn(
            np.array([b"a", b"b", b"c", b"d"], dtype=object), np.array([1, 0, 3], np.int64)
        ),
        np.array([7, 8, 65535], np.uint16),
        np.array([0, 1, 1], np.int32),
        np.array([5, 6, 7], np.int64),
        np.array([1000, 2000, 3000], np.int64),
    ]


def test_output_types_give_a_variable_feature_two_outputs_and_metadata_last() -> None:
    assert output_types(SCHEMA) == [
        tf.float32,
        tf.bool,
        tf.string,
        tf.int64,  # items: values
        tf.int64,  # items: row lengths
        tf.float16,  # pairs: values
        tf.int64,
        tf.string,  # words: values
        tf.int64,
        tf.uint16,
        tf.int32,  # partition
        tf.int64,  # offset
        tf.int64,  # timestamp
    ]
    assert METADATA_COLUMNS == ("partition", "offset", "timestamp")


def test_flat_outputs_split_ragged_columns_in_the_order_of_output_types() -> None:
    block = _block()
    flat = flat_outputs(block)
    types = output_types(SCHEMA)
    assert len(flat) == len(types)
    for array, dtype in zip(flat, types, strict=True):
        assert isinstance(array, np.ndarray)
        assert tf.as_dtype(array.dtype) == dtype or (dtype == tf.string and array.dtype == object)
    items = block[3]
    assert isinstance(items, RaggedColumn)
    assert flat[3] is items.values and flat[4] is items.row_lengths  # no copies


def _eager_batch() -> dict[str, Any]:
    return to_batch(SCHEMA, [tf.constant(a) for a in flat_outputs(_block())])


def test_to_batch_rebuilds_fixed_ragged_and_string_features() -> None:
    batch = _eager_batch()
    assert batch["x"].numpy().tolist() == [[1, 2], [3, 4], [5, 6]]
    assert batch["flag"].numpy().tolist() == [True, False, True]
    assert batch["user"].numpy().tolist() == [b"ann", b"bob", b""]
    items = batch["items"]
    assert isinstance(items, tf.RaggedTensor)
    assert items.to_list() == [[10, 11], [], [12]]
    assert batch["y"].dtype == tf.uint16 and batch["y"].numpy().tolist() == [7, 8, 65535]


def test_a_padded_feature_is_dense_truncated_or_filled_with_its_length_column() -> None:
    """pad_to rows each: longer records cut, shorter ones filled with pad_value; the length
    column (int32) says how many rows are real, at most pad_to."""
    batch = _eager_batch()
    pairs = batch["pairs"]
    assert not isinstance(pairs, tf.RaggedTensor)
    assert pairs.shape == (3, 2, 2) and pairs.dtype == tf.float16
    assert pairs.numpy().tolist() == [
        [[9, 9], [9, 9]],  # no rows: all padding
        [[0, 1], [2, 3]],  # three rows: the first two kept
        [[6, 7], [8, 9]],
    ]
    assert batch["pairs_length"].dtype == tf.int32
    assert batch["pairs_length"].numpy().tolist() == [0, 2, 2]
    words = batch["words"]
    assert words.numpy().tolist() == [[b"a", b"", b""], [b"", b"", b""], [b"b", b"c", b"d"]]
    assert batch["words_length"].numpy().tolist() == [1, 0, 3]


def test_to_batch_keys_are_the_features_lengths_then_metadata() -> None:
    batch = _eager_batch()
    assert list(batch) == [
        "x",
        "flag",
        "user",
        "items",
        "pairs",
        "pairs_length",
        "words",
        "words_length",
        "y",
        "partition",
        "offset",
        "timestamp",
    ]
    assert batch["partition"].dtype == tf.int32
    assert batch["offset"].numpy().tolist() == [5, 6, 7]
    assert batch["timestamp"].numpy().tolist() == [1000, 2000, 3000]


def test_static_shapes_are_set_after_the_numpy_function() -> None:
    """In the graph, a numpy_function's outputs have no shape; to_batch gives each its rank
    and inner dimensions so that Keras can build the model (only the batch axis unknown)."""
    shapes: dict[str, Any] = {}

    @tf.function
    def decode() -> dict[str, Any]:
        outputs = tf.numpy_function(
            lambda: flat_outputs(_block()), [], output_types(SCHEMA), stateful=False
        )
        for t in outputs:
            assert t.shape.rank is None  # what numpy_function gives
        batch = to_batch(SCHEMA, outputs)
        shapes.update({k: v.shape.as_list() for k, v in batch.items()})
        return batch

    result = decode()
    assert shapes == {
        "x": [None, 2],
        "flag": [None],
        "user": [None],
        "items": [None, None],
        "pairs": [None, 2, 2],
        "pairs_length": [None],
        "words": [None, 3],
        "words_length": [None],
        "y": [None],
        "partition": [None],
        "offset": [None],
        "timestamp": [None],
    }
    assert result["items"].to_list() == [[10, 11], [], [12]]  # the same values as eagerly


def test_outputs_that_do_not_match_the_schema_are_an_error_not_a_shifted_batch() -> None:
    outputs = [tf.constant(a) for a in flat_outputs(_block())]
    with pytest.raises(ValueError):
        to_batch(SCHEMA, [*outputs, tf.constant([0, 0, 0], tf.int64)])
    with pytest.raises(ValueError):
        to_batch(SCHEMA, outputs[:-1])
