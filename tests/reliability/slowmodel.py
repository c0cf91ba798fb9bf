"""A model whose training step is slow on purpose: ``--model tests.reliability.slowmodel:build``.

The forward pass sleeps ``STEP_SLEEP_S`` in a ``tf.py_function`` (the sleep releases the GIL,
like a long GPU kernel or a big all-reduce would), so each train step takes at least that long.
Used to check that a step slower than ``max_poll_interval_ms`` causes no rebalance.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

STEP_SLEEP_S = 1.5


def _sleep(x: tf.Tensor) -> np.float32:
    time.sleep(STEP_SLEEP_S)
    return np.float32(0.0)


class SlowLayer(keras.layers.Layer):
    """Identity on its input, after sleeping ``STEP_SLEEP_S`` once per call."""

    def call(self, x: tf.Tensor) -> tf.Tensor:
        # The sleep's (zero) result is added to the output, so the step waits for it; no
        # gradient flows through the py_function.
        zero = tf.py_function(_sleep, [tf.reduce_sum(x)], tf.float32)
        zero.set_shape([])
        return x + tf.cast(tf.stop_gradient(zero), x.dtype)

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return input_shape


def build(schema: object) -> keras.Model:
    """A small compiled MLP over the simulator schema's ``x`` (float32[16]) with a slow layer."""
    features = {f.name: f for f in schema.features}  # type: ignore[attr-defined]
    x = keras.Input(shape=tuple(features["x"].shape), dtype="float32", name="x")
    h = SlowLayer()(x)
    h = keras.layers.Dense(16, activation="relu")(h)
    out = keras.layers.Reshape(())(keras.layers.Dense(1)(h))
    model = keras.Model(inputs={"x": x}, outputs=out, name="slow_mlp")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.MeanSquaredError())
    return model
