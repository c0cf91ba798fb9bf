"""Training: a compiled step under a tf.distribute strategy, and checkpoints of model + offsets."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from streamer.model import ModelBundle

__all__ = ["Trainer", "choose_strategy"]

log = logging.getLogger(__name__)


def choose_strategy() -> tf.distribute.Strategy:
    """All visible GPUs through MirroredStrategy when there are several, else the default."""
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        log.info("training on %d GPUs with MirroredStrategy", len(gpus))
        return tf.distribute.MirroredStrategy([g.name for g in gpus])
    log.info("training on %s", gpus[0].name if gpus else "CPU")
    return tf.distribute.get_strategy()


class Trainer:
    """Runs one compiled training step per batch; the model never sees metadata columns.

    >>> trainer = Trainer(load_model(None, schema))          # doctest: +SKIP
    >>> loss = trainer.step(batch)                           # batch: features + metadata  # doctest: +SKIP
    """

    def __init__(
        self,
        bundle: ModelBundle,
        strategy: tf.distribute.Strategy | None = None,
        *,
        jit_compile: bool = False,
    ) -> None:
        self.bundle = bundle
        self.strategy = strategy or tf.distribute.get_strategy()
        self.replicas = self.strategy.num_replicas_in_sync
        model, loss_fn, optimizer = bundle.model, bundle.loss, bundle.optimizer
        names, label = bundle.input_names, bundle.label
        replicas = float(self.replicas)
        # Build optimizer state now so a checkpoint restores its slots too.
        with self.strategy.scope():
            optimizer.build(model.trainable_variables)

        def replica_step(inputs: dict[str, tf.Tensor], labels: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                pred = model(inputs, training=True)
                loss = loss_fn(tf.cast(labels, pred.dtype), pred)
                loss = tf.cast(loss, tf.float32)
                scaled = loss / replicas
                if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
                    scaled = optimizer.scale_loss(scaled)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        @tf.function(jit_compile=jit_compile, reduce_retracing=True)
        def step(features: dict[str, tf.Tensor]) -> tf.Tensor:
            inputs = {n: features[n] for n in names}
            labels = features[label]
            if self.replicas == 1:
                return replica_step(inputs, labels)
            per_replica = self.strategy.run(replica_step, args=(inputs, labels))
            return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

        @tf.function(reduce_retracing=True)
        def evaluate(features: dict[str, tf.Tensor]) -> tf.Tensor:
            inputs = {n: features[n] for n in names}
            pred = model(inputs, training=False)
            return tf.cast(loss_fn(tf.cast(features[label], pred.dtype), pred), tf.float32)

        self._step = step
        self._evaluate = evaluate

    def model_inputs(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The features the step uses (inputs + label): metadata columns are left out."""
        names = (*self.bundle.input_names, self.bundle.label)
        return {n: batch[n] for n in names}

    def step(self, batch: Mapping[str, Any]) -> float:
        with self.strategy.scope():
            loss = self._step(self.model_inputs(batch))
        return float(loss)

    def evaluate(self, batch: Mapping[str, Any]) -> float:
        return float(self._evaluate(self.model_inputs(batch)))
