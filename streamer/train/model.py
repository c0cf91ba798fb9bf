"""Models: the built-in MLP for the simulator's task and loading ``package.module:function``."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import keras

from consumers.errors import ConfigError
from streamer.decode.schema import Schema

__all__ = ["ModelBundle", "bundle_for", "default_model", "load_model"]


@dataclass
class ModelBundle:
    """A compiled Keras model and the schema columns it is trained on.

    ``input_names``: the columns fed as ``x``; ``labels``: the label columns (``y``: the one
    column, or a dict by name for a model of several outputs); ``weight``: the column given to
    Keras as ``sample_weight`` (never an input), or None.
    """

    model: keras.Model
    input_names: tuple[str, ...]
    labels: tuple[str, ...]
    weight: str | None = None

    @property
    def optimizer(self) -> keras.optimizers.Optimizer:
        """The model's optimizer (a ``LossScaleOptimizer`` under mixed precision)."""
        return self.model.optimizer

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column a step reads: inputs, labels and the sample weight."""
        weight = (self.weight,) if self.weight else ()
        return (*self.input_names, *self.labels, *weight)


def default_model(schema: Schema, learning_rate: float = 1e-3) -> keras.Model:
    """A small MLP over all input features (flattened, concatenated), MSE loss, Adam.

    Compiled the ordinary Keras way, with mean absolute error (``mae``), the regression task's
    natural metric (in the label's own units), reported for training and evaluation. Its head
    is ``Dense(1)``: predictions are ``[batch, 1]`` (Keras aligns the scalar label), so every
    example has its own loss, as sample weights and multi-worker padding need. It takes numeric fixed-shape
    features only: a schema with string or variable-length inputs needs a model of its own
    (``--model``; ``examples/recommender.py`` is one), and gets a ConfigError saying so.

    >>> model = default_model(SimulatorTask().schema())   # doctest: +SKIP
    """
    schema.check_builtin_model()
    inputs = {
        f.name: keras.Input(shape=f.shape, dtype="float32", name=f.name)
        for f in schema.input_features
    }
    flat = [keras.layers.Flatten()(x) if len(x.shape) > 2 else x for x in inputs.values()]
    flat = [keras.layers.Reshape((1,))(x) if len(x.shape) == 1 else x for x in flat]
    h = flat[0] if len(flat) == 1 else keras.layers.Concatenate()(flat)
    h = keras.layers.Dense(64, activation="relu")(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    out = keras.layers.Dense(1)(h)
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
            f"{list(columns)} (labels {list(schema.labels)} and the sample weight are never "
            "inputs)",
        )
    return tuple(n for n in columns if n in declared)


def _overrides(model: keras.Model, method: str) -> bool:
    """Whether the model's class replaces Keras' own ``method`` (``train_step``, ...)."""
    return getattr(type(model), method, None) is not getattr(keras.Model, method)


def _compiled(obj: Any, where: str) -> keras.Model:
    """The model, compiled: as returned, or compiled here from ``(model, loss, optimizer)``."""
    if isinstance(obj, tuple) and len(obj) == 3:
        model, loss, optimizer = obj
        if not isinstance(model, keras.Model):
            raise ConfigError(
                "model", where, f"returned {type(model).__name__}, expected a keras.Model"
            )
        if loss is None or optimizer is None:
            raise ConfigError("model", where, "(model, loss, optimizer) needs all three")
        # The legacy form: compiled here, so Keras' own loss machinery trains it.
        model.compile(optimizer=optimizer, loss=loss)
        return model
    if not isinstance(obj, keras.Model):
        raise ConfigError(
            "model",
            where,
            "the function must return a compiled keras.Model or (model, loss, optimizer)",
        )
    model = obj
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ConfigError(
            "model",
            where,
            "the model is not compiled: call model.compile(optimizer=..., loss=...) before "
            "returning it",
        )
    custom = _overrides(model, "train_step") or _overrides(model, "compute_loss")
    if getattr(model, "loss", None) is None and not custom:
        raise ConfigError(
            "model",
            where,
            "the model was compiled without a loss: model.compile(optimizer=..., loss=...) "
            "(or override train_step or compute_loss, as Keras allows)",
        )
    return model


def _check_outputs(model: keras.Model, schema: Schema, where: str) -> None:
    """Labels that match the model's outputs (by name when there are several)."""
    names = tuple(getattr(model, "output_names", None) or ())
    labels = schema.labels
    if len(labels) > 1 and names and set(names) != set(labels):
        raise ConfigError(
            "label",
            list(labels),
            f"one label per model output, named like the outputs: the model's outputs are "
            f"{list(names)} ({where})",
        )
    if len(labels) == 1 and len(names) > 1:
        raise ConfigError(
            "label",
            labels[0],
            f"a list of labels, one per model output {list(names)} ({where})",
        )


def bundle_for(obj: Any, schema: Schema, where: str = "model") -> ModelBundle:
    """The bundle of a model (or ``(model, loss, optimizer)``) for ``schema``; ConfigError when
    the model cannot be trained on it (not compiled, no loss, labels that miss its outputs)."""
    if not schema.labels:
        raise ConfigError("schema", "label", "training needs a schema with a label feature")
    model = _compiled(obj, where)
    _check_outputs(model, schema, where)
    return ModelBundle(model, _input_names(model, schema, where), schema.labels, schema.weight)


def load_model(spec: str | None, schema: Schema, learning_rate: float = 1e-3) -> ModelBundle:
    """Build the model: the built-in MLP when ``spec`` is None, else ``package.module:function(schema)``.

    The module is imported from the Python path, or else from the current directory (as
    ``python -m`` would), so ``--model examples.recommender:build`` works from the repository
    root whichever way the worker was started.
    """
    if spec is None:
        return bundle_for(default_model(schema, learning_rate), schema, "built-in")
    module_name, _, func_name = spec.partition(":")
    try:
        module = _import(module_name)
    except ImportError as exc:
        raise ConfigError("model", spec, f"cannot import {module_name}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError("model", spec, f"{module_name} has no function {func_name}")
    return bundle_for(func(schema), schema, spec)


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
