"""A model for recommender-like streams: hashed string ids, pooled embeddings of id lists, dense vectors.

``build(schema)`` makes one input per schema column, as the worker hands them over:

- a string feature (``[batch]``, or ragged lists of strings) is hashed (``keras.layers.Hashing``)
  into an ``Embedding``; a list of them is averaged;
- an integer variable-length feature (a ``tf.RaggedTensor`` of ids, any range) is hashed the
  same way and its embeddings averaged per example (an empty list gives zeros); with
  ``pad_to``, the dense ids and their ``<name>_length`` give the same masked mean;
- a float variable-length feature is averaged over its rows;
- a fixed numeric feature is flattened, as the built-in model does.

The parts are concatenated into a small MLP with one output (``[batch, 1]``), compiled the
ordinary Keras way: MSE loss, Adam, MAE as metric. The simulator's ``recommender`` task (a user id, 0-50 item ids, a 16-float vector and a rating) is
what it was written for::

    streamer run --sim-task recommender --model examples.recommender:build --max-steps 3000
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from streamer.decode.schema import LENGTH_SUFFIX, Schema

__all__ = ["RowMean", "build"]

HASH_BINS = 4096  # per string or id feature; collisions cost little at this size
EMBED_DIM = 8


@keras.saving.register_keras_serializable(package="examples")
class RowMean(keras.layers.Layer):
    """The mean over the rows of each example: ``[batch, rows, ...] -> [batch, ...]``.

    A ``tf.RaggedTensor`` is averaged over its own rows (an empty example gives zeros); a
    dense ``[batch, pad_to, ...]`` with its lengths (a second input) over the first
    ``length`` rows.
    """

    def call(self, values: Any, lengths: Any = None) -> Any:
        if isinstance(values, tf.RaggedTensor):
            total = tf.reduce_sum(values, axis=1)
            count = tf.cast(values.row_lengths(), total.dtype)
            return tf.math.divide_no_nan(
                total, tf.reshape(count, [-1, *[1] * (total.shape.rank - 1)])
            )
        if lengths is None:
            return tf.reduce_mean(values, axis=1)
        mask = tf.sequence_mask(lengths, tf.shape(values)[1], dtype=values.dtype)
        mask = tf.reshape(mask, [*tf.unstack(tf.shape(mask)), *[1] * (values.shape.rank - 2)])
        total = tf.reduce_sum(values * mask, axis=1)
        count = tf.reduce_sum(mask, axis=1)
        return tf.math.divide_no_nan(total, count)

    def compute_output_shape(self, values_shape: Any, lengths_shape: Any = None) -> Any:
        return (values_shape[0], *values_shape[2:])


def build(schema: Schema, learning_rate: float = 1e-3) -> keras.Model:
    """A compiled model over every input feature of ``schema`` (see the module docstring)."""
    inputs: dict[str, keras.KerasTensor] = {}
    parts: list[Any] = []
    for f in schema.input_features:
        dtype = "string" if f.is_string else f.dtype.name
        shape = (f.pad_to or None, *f.inner_shape) if f.is_variable else f.shape
        x = inputs[f.name] = keras.Input(shape=shape, dtype=dtype, name=f.name)
        lengths = None
        if f.is_padded:
            lengths = inputs[f.name + LENGTH_SUFFIX] = keras.Input(
                shape=(), dtype="int32", name=f.name + LENGTH_SUFFIX
            )
        if f.is_string or f.dtype.kind in "iu":
            ids = keras.layers.Hashing(num_bins=HASH_BINS, name=f"{f.name}_hash")(x)
            x = keras.layers.Embedding(HASH_BINS, EMBED_DIM, name=f"{f.name}_embedding")(ids)
            if f.is_variable or f.shape:
                x = RowMean(name=f"{f.name}_mean")(x, lengths)
        elif f.is_variable:
            x = RowMean(name=f"{f.name}_mean")(keras.ops.cast(x, "float32"), lengths)
        else:
            x = keras.ops.cast(x, "float32")
        if len(x.shape) == 1:
            x = keras.layers.Reshape((1,))(x)
        elif len(x.shape) > 2:
            x = keras.layers.Flatten()(x)
        parts.append(x)
    h = parts[0] if len(parts) == 1 else keras.layers.Concatenate()(parts)
    h = keras.layers.Dense(64, activation="relu")(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    out = keras.layers.Dense(1)(h)  # [batch, 1]: Keras aligns the scalar label
    model = keras.Model(inputs=inputs, outputs=out, name="recommender")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.MeanSquaredError(),
        metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
    )
    return model
