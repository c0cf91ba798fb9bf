"""Models: the built-in MLP for the simulator's task and loading ``package.module:function``."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from consumers.errors import ConfigError
from streamer.schema import Schema

__all__ = ["ModelBundle", "default_model", "load_model"]


@dataclass
class ModelBundle:
    """A Keras model with its loss and optimizer, and the schema features it reads."""

    model: keras.Model
    loss: keras.losses.Loss
    optimizer: keras.optimizers.Optimizer
    input_names: tuple[str, ...]
    label: str


def default_model(schema: Schema, learning_rate: float = 1e-3) -> keras.Model:
    """A small MLP over all non-label features (flattened, concatenated), MSE loss, Adam.

    Compiled with mean absolute error (``mae``), the regression task's natural metric (in the
    label's own units): evaluation reports it next to the loss. It takes numeric fixed-shape
    features only: a schema with string or variable-length inputs needs a model of its own
    (``--model``; ``examples/recommender.py`` is one), and gets a ConfigError saying so.

    >>> model = default_model(SimulatorTask().schema())   # doctest: +SKIP
    """
    schema.check_builtin_model()
    inputs = {
        f.name: keras.Input(shape=f.shape, dtype="float32", name=f.name)
        for f in schema.features
        if f.name != schema.label
    }
    flat = [keras.layers.Flatten()(x) if len(x.shape) > 2 else x for x in inputs.values()]
    flat = [keras.layers.Reshape((1,))(x) if len(x.shape) == 1 else x for x in flat]
    h = flat[0] if len(flat) == 1 else keras.layers.Concatenate()(flat)
    h = keras.layers.Dense(64, activation="relu")(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    out = keras.layers.Dense(1)(h)
    out = keras.layers.Reshape(())(out)
    model = keras.Model(inputs=inputs, outputs=out, name="streamer_mlp")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.MeanSquaredError(),
        metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
    )
    return model


def _input_names(model: keras.Model, schema: Schema, where: str) -> tuple[str, ...]:
    """The columns to feed: those a functional model declares (by name), else all inputs.

    Keras 3 flattens a dict of inputs before matching it with a functional model's inputs,
    so one key more than the model declares shifts the others (a shape error at the first
    step): such a model gets exactly its inputs, and a schema column it does not use is
    left out.
    """
    columns = schema.input_columns
    try:
        declared = model.input
    except (AttributeError, ValueError):  # a subclassed model that was never called
        declared = None
    if not isinstance(declared, dict):
        return columns
    unknown = sorted(set(declared) - set(columns))
    if unknown:
        raise ConfigError(
            "model",
            where,
            f"the model takes inputs {unknown} that the schema does not provide; it provides "
            f"{list(columns)} (the label {schema.label!r} is never an input)",
        )
    return tuple(n for n in columns if n in declared)


def _bundle(obj: Any, schema: Schema, where: str) -> ModelBundle:
    if isinstance(obj, tuple) and len(obj) == 3:
        model, loss, optimizer = obj
    elif isinstance(obj, keras.Model):
        model, loss, optimizer = obj, getattr(obj, "loss", None), getattr(obj, "optimizer", None)
    else:
        raise ConfigError(
            "model",
            where,
            "the function must return a compiled keras.Model or (model, loss, optimizer)",
        )
    if not isinstance(model, keras.Model):
        raise ConfigError(
            "model", where, f"returned {type(model).__name__}, expected a keras.Model"
        )
    if loss is None or optimizer is None:
        raise ConfigError(
            "model",
            where,
            "the model has no loss or optimizer: compile it or return (model, loss, optimizer)",
        )
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if schema.label is None:
        raise ConfigError("schema", "label", "training needs a schema with a label feature")
    return ModelBundle(model, loss, optimizer, _input_names(model, schema, where), schema.label)


def load_model(spec: str | None, schema: Schema, learning_rate: float = 1e-3) -> ModelBundle:
    """Build the model: the built-in MLP when ``spec`` is None, else ``package.module:function(schema)``.

    The module is imported from the Python path, or else from the current directory (as
    ``python -m`` would), so ``--model examples.recommender:build`` works from the repository
    root whichever way the worker was started.
    """
    if spec is None:
        return _bundle(default_model(schema, learning_rate), schema, "built-in")
    module_name, _, func_name = spec.partition(":")
    try:
        module = _import(module_name)
    except ImportError as exc:
        raise ConfigError("model", spec, f"cannot import {module_name}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError("model", spec, f"{module_name} has no function {func_name}")
    return _bundle(func(schema), schema, spec)


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        cwd = os.getcwd()
        if exc.name not in (top, module_name) or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)  # after everything else: it never shadows an installed module
        return importlib.import_module(module_name)


def cast_inputs(features: dict[str, tf.Tensor], names: tuple[str, ...]) -> dict[str, tf.Tensor]:
    """The model's inputs only (never metadata), as float32 unless integer ids."""
    return {n: features[n] for n in names}
