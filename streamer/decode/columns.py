"""Decoded columns as tensors: the decode numpy_function's outputs, and the batch rebuilt from them.

A numpy_function returns a flat list of arrays of fixed dtypes and cannot return a
``tf.RaggedTensor``, so a variable-length feature crosses as two arrays (its flat values and
its int64 row lengths) and is rebuilt after the call: a ``tf.RaggedTensor``, or with
``pad_to`` a dense tensor and its ``<name>_length`` column.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from streamer.decode.feature import LENGTH_SUFFIX, Feature
from streamer.decode.ragged import Column, RaggedColumn
from streamer.decode.schema import Schema

__all__ = ["METADATA_COLUMNS", "flat_outputs", "from_flat", "output_types", "to_batch"]

#: The columns the pipeline adds to every decoded block, after the features.
METADATA_COLUMNS = ("partition", "offset", "timestamp")
_METADATA_TYPES = (tf.int32, tf.int64, tf.int64)


def output_types(schema: Schema) -> list[tf.DType]:
    """The numpy_function's ``Tout``: each feature (two for a variable-length one), metadata."""
    out: list[tf.DType] = []
    for f in schema.features:
        out.append(tf.string if f.is_string else tf.as_dtype(f.dtype))
        if f.is_variable:
            out.append(tf.int64)
    return [*out, *_METADATA_TYPES]


def flat_outputs(columns: list[Column]) -> list[np.ndarray]:
    """Features then metadata as the numpy_function returns them: a ragged column as its
    values and its row lengths."""
    out: list[np.ndarray] = []
    for c in columns:
        if isinstance(c, RaggedColumn):
            out += [c.values, c.row_lengths]
        else:
            out.append(c)
    return out


def from_flat(schema: Schema, arrays: list[np.ndarray]) -> list[Column]:
    """The inverse of ``flat_outputs``: the numpy_function's arrays as columns (a
    variable-length feature's two arrays as one ``RaggedColumn``), then the metadata.

    >>> s = Schema.from_dict({"features": {"items": {"dtype": "int64", "shape": [-1]}}})
    >>> cols = from_flat(s, [np.array([1, 2, 3]), np.array([2, 1]), np.array([0, 0])])
    >>> type(cols[0]).__name__, [len(c) for c in cols[1:]]
    ('RaggedColumn', [2])
    >>> [a.tolist() for a in flat_outputs(cols)]
    [[1, 2, 3], [2, 1], [0, 0]]
    """
    cols: list[Column] = []
    at = 0
    for f in schema.features:
        if f.is_variable:
            cols.append(RaggedColumn(arrays[at], arrays[at + 1]))
            at += 2
        else:
            cols.append(arrays[at])
            at += 1
    return [*cols, *arrays[at:]]


def to_batch(schema: Schema, outputs: list[tf.Tensor]) -> dict[str, Any]:
    """The numpy_function's outputs as the batch dict, with static shapes set.

    >>> to_batch(schema, tf.numpy_function(decode, [handle], output_types(schema)))  # doctest: +SKIP
    {'user': <tf.Tensor [n]>, 'items': <tf.RaggedTensor [n, None]>, ..., 'timestamp': ...}
    """
    batch: dict[str, Any] = {}
    at = 0
    for f in schema.features:
        t = outputs[at]
        at += 1
        if not f.is_variable:
            t.set_shape([None, *f.shape])
            batch[f.name] = t
            continue
        lengths = outputs[at]
        at += 1
        t.set_shape([None, *f.inner_shape])
        lengths.set_shape([None])
        _add_variable(batch, f, t, lengths)
    for name, t in zip(METADATA_COLUMNS, outputs[at:], strict=True):
        t.set_shape([None])
        batch[name] = t
    return batch


def _add_variable(batch: dict[str, Any], f: Feature, values: tf.Tensor, lengths: tf.Tensor) -> None:
    """A variable-length feature as a RaggedTensor, or dense with its length column."""
    # Our own decoder made the lengths (they sum to the values' rows): no validation ops.
    ragged = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
    if f.pad_to is None:
        batch[f.name] = ragged
        return
    batch[f.name] = ragged.to_tensor(
        default_value=f.pad_value, shape=[None, f.pad_to, *f.inner_shape]
    )
    batch[f.name + LENGTH_SUFFIX] = tf.cast(tf.minimum(lengths, f.pad_to), tf.int32)
