"""Models written the ordinary Keras way, one per style the worker must train exactly as
``model.fit`` does (tests/streamer/train/test_keras_parity.py), and their schemas.

Each ``build_*(schema)`` is also a ``--model tests.streamer.train.keras_models:build_*`` for
``streamer run``. Weights start from ``keras.utils.set_random_seed(SEED)`` so that two builds
in two processes start equal.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from streamer.decode.schema import Schema

SEED = 1234


def _seeded() -> None:
    keras.utils.set_random_seed(SEED)


def schema_regression(weight: bool = False) -> Schema:
    features: dict[str, Any] = {
        "x": {"dtype": "float32", "shape": [8]},
        "y": {"dtype": "float32"},
    }
    if weight:
        features["w"] = {"dtype": "float32"}
    return Schema.from_dict(
        {"label": "y", **({"weight": "w"} if weight else {}), "features": features}
    )


def schema_two_outputs() -> Schema:
    return Schema.from_dict(
        {
            "label": ["price", "clicked"],
            "features": {
                "x": {"dtype": "float32", "shape": [8]},
                "price": {"dtype": "float32"},
                "clicked": {"dtype": "float32"},
            },
        }
    )


def _mlp_input(schema: Schema) -> tuple[dict[str, Any], Any]:
    inputs = {
        f.name: keras.Input(shape=f.shape, dtype="float32", name=f.name)
        for f in schema.input_features
    }
    h = keras.layers.Dense(16, activation="relu")(inputs["x"])
    return inputs, h


def build_string_loss(schema: Schema) -> keras.Model:
    """``compile(optimizer="adam", loss="mse")`` on a ``Dense(1)`` head, a scalar label."""
    _seeded()
    inputs, h = _mlp_input(schema)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"], jit_compile=False)
    return model


def build_regularized(schema: Schema) -> keras.Model:
    """An L2 kernel regularizer (its loss is part of Keras' total loss)."""
    _seeded()
    inputs = {"x": keras.Input(shape=(8,), name="x")}
    h = keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.05))(
        inputs["x"]
    )
    out = keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.05))(h)
    model = keras.Model(inputs, out)
    model.compile(
        optimizer=keras.optimizers.SGD(0.05), loss="mean_absolute_error", jit_compile=False
    )
    return model


def build_two_outputs(schema: Schema) -> keras.Model:
    """Two named outputs, a dict of losses and ``loss_weights``."""
    _seeded()
    inputs, h = _mlp_input(schema)
    price = keras.layers.Dense(1, name="price")(h)
    clicked = keras.layers.Dense(1, activation="sigmoid", name="clicked")(h)
    model = keras.Model(inputs, {"price": price, "clicked": clicked})
    model.compile(
        optimizer="adam",
        loss={"price": "mse", "clicked": "binary_crossentropy"},
        loss_weights={"price": 1.0, "clicked": 0.3},
        metrics={"clicked": ["accuracy"]},
        jit_compile=False,
    )
    return model


@keras.saving.register_keras_serializable(package="tests")
class ClippedModel(keras.Model):
    """Overrides ``train_step`` (Keras' documented customisation): clips gradients by norm."""

    def train_step(self, data: Any) -> Any:
        x, y = data[0], data[1]
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        grads = [tf.clip_by_norm(g, 0.5) for g in grads]
        self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def build_custom_train_step(schema: Schema) -> keras.Model:
    _seeded()
    inputs, h = _mlp_input(schema)
    model = ClippedModel(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
    return model


def build_weighted(schema: Schema) -> keras.Model:
    """A model trained with a sample-weight feature (the schema's ``weight``)."""
    _seeded()
    inputs, h = _mlp_input(schema)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse", weighted_metrics=["mae"], jit_compile=False)
    return model


def build_diverging(schema: Schema) -> keras.Model:
    """A learning rate that makes the loss overflow within a few steps."""
    _seeded()
    inputs, h = _mlp_input(schema)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.SGD(1e12), loss="mse", jit_compile=False)
    return model


def build_batchnorm(schema: Schema) -> keras.Model:
    """BatchNormalization: moving statistics that the forward pass itself updates."""
    _seeded()
    inputs = {"x": keras.Input(shape=(8,), name="x")}
    h = keras.layers.BatchNormalization()(inputs["x"])
    h = keras.layers.Dense(16, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    return model
