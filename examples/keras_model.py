"""A model compiled the ordinary Keras way, for the simulator's regression task.

``streamer run --model examples.keras_model:build`` trains it exactly as ``model.fit`` would
(docs/tutorials/your-model.md): the string loss and metric, the L2 regularizer's loss and Adam's
updates are Keras' own.
"""

from __future__ import annotations

import keras

from streamer.decode.schema import Schema

__all__ = ["build"]


def build(schema: Schema) -> keras.Model:
    """One input per schema input feature (the simulator's: ``x``, 16 floats), one output."""
    inputs = {
        f.name: keras.Input(shape=f.shape, name=f.name, dtype=f.dtype.name)
        for f in schema.input_features
    }
    x = inputs["x"]
    h = keras.layers.Dense(64, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4))(x)
    h = keras.layers.Dense(64, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model
