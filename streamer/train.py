"""Training: a compiled step under a tf.distribute strategy, and checkpoints of model + offsets."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from streamer.model import ModelBundle

__all__ = ["Checkpointer", "Trainer", "choose_strategy"]

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
    >>> loss = trainer.step(batch)                           # batch: features + metadata
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


class Checkpointer:
    """Model, optimizer, step and per-partition offsets in one tf.train checkpoint.

    >>> ckpt = Checkpointer("/ckpt", bundle, topic="samples")   # doctest: +SKIP
    >>> restored = ckpt.restore()        # None, or (step, {partition: next offset})
    >>> ckpt.save(step, tracker_offsets)
    """

    def __init__(self, directory: str, bundle: ModelBundle, *, topic: str, keep: int = 3) -> None:
        self.directory = directory
        self.topic = topic
        #: The topic's id (Kafka's UUID) where known: saved with the offsets, so that offsets
        #: of a topic that was deleted and created again under the same name are not applied.
        self.topic_id: str | None = None
        #: The id saved in the checkpoint that ``restore()`` read ("" when it had none).
        self.restored_topic_id = ""
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._parts = tf.Variable(
            tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False
        )
        self._offsets = tf.Variable(
            tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False
        )
        self._topic = tf.Variable("", dtype=tf.string, trainable=False)
        self._ckpt = tf.train.Checkpoint(
            model=bundle.model,
            optimizer=bundle.optimizer,
            step=self._step,
            offset_partitions=self._parts,
            offset_values=self._offsets,
            topic=self._topic,
        )
        self.manager = tf.train.CheckpointManager(self._ckpt, directory, max_to_keep=keep)

    @property
    def latest(self) -> str | None:
        latest: str | None = self.manager.latest_checkpoint
        return latest

    def restore(self) -> tuple[int, dict[int, int]] | None:
        path = self.manager.latest_checkpoint
        if path is None:
            return None
        self._ckpt.restore(path).assert_existing_objects_matched()
        step = int(self._step.numpy())
        # "name" (older checkpoints) or "name\nid": names cannot hold a newline.
        topic, _, self.restored_topic_id = self._topic.numpy().decode().partition("\n")
        offsets = {
            int(p): int(o) for p, o in zip(self._parts.numpy(), self._offsets.numpy(), strict=True)
        }
        if topic != self.topic:
            log.warning(
                "checkpoint %s was for topic %r, not %r: restoring the model only",
                path,
                topic,
                self.topic,
            )
            offsets = {}
        log.info("restored %s: step %d, offsets %s", path, step, offsets)
        return step, offsets

    def adopt_topic_id(self, topic_id: str | None) -> bool:
        """Save ``topic_id`` (the topic's id now) from here on; False when the restored offsets
        were saved for an earlier topic of the same name.

        A topic deleted and created again is a new topic (offsets from 0): offsets saved for
        the old one would skip its records. The model still applies; the offsets then come
        from the group's commits (those of the old topic were deleted with it).
        """
        self.topic_id = topic_id
        saved = self.restored_topic_id
        if topic_id and saved and saved != topic_id:
            log.warning(
                "checkpoint offsets are for an earlier topic %r (id %s; now %s: deleted and "
                "created again); restoring the model only, offsets from the group's commits",
                self.topic,
                saved,
                topic_id,
            )
            return False
        return True

    def save(self, step: int, offsets: Mapping[int, int]) -> str:
        parts = sorted(offsets)
        self._step.assign(step)
        self._parts.assign(np.asarray(parts, dtype=np.int64))
        self._offsets.assign(np.asarray([offsets[p] for p in parts], dtype=np.int64))
        self._topic.assign(f"{self.topic}\n{self.topic_id}" if self.topic_id else self.topic)
        path: str = self.manager.save(checkpoint_number=step)
        return path
