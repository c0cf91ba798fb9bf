"""MultiWorkerMirroredStrategy: the strategy from a Topology, the compiled steps of one round
(control all-reduce, weighted training step, offsets), the broadcast of the chief's state, and
what a lost peer looks like.

A custom ``strategy.run`` step, not ``model.fit`` (Keras 3's fit fails under MWMS with TF 2.21;
see MULTIWORKER.md). The loss is Σ weight·loss over the worker's rows divided by the
all-reduced count of real rows of every worker, so each real row weighs the same wherever it
was read and padding (weight 0) weighs nothing; Keras' optimizer sums the gradients of all
replicas. A round whose all-reduced real count is 0 never calls the optimizer: Adam moves
weights even on zero gradients (tests/streamer/test_multiworker.py checks both).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import numpy.typing as npt
import tensorflow as tf

from consumers.errors import ConfigError
from streamer.model import ModelBundle
from streamer.multiworker import Topology

__all__ = ["ClusterStep", "is_peer_loss", "make_strategy", "per_example_loss", "weights_digest"]

log = logging.getLogger(__name__)


def make_strategy(topology: Topology) -> tf.distribute.MultiWorkerMirroredStrategy:
    """MWMS for this topology. Must come before any other TensorFlow op of the process."""
    spec = tf.train.ClusterSpec({job: list(hosts) for job, hosts in topology.cluster.items()})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=topology.task_type, task_id=topology.task_id, rpc_layer="grpc"
    )
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


def per_example_loss(loss_fn: Any, labels: tf.Tensor, pred: tf.Tensor) -> tf.Tensor:
    """The loss of each example, shape [batch], float32.

    A Keras ``Loss`` object's unreduced ``call``, or a loss function; a label and prediction of
    shape [batch] are treated as [batch, 1] (Keras' mean over the last axis would otherwise
    average the whole batch). Extra axes are averaged.
    """
    y = tf.cast(labels, pred.dtype)
    if y.shape.rank == 1 and pred.shape.rank == 1:
        y, pred = y[:, None], pred[:, None]
    fn = loss_fn.call if isinstance(loss_fn, keras.losses.Loss) else loss_fn
    out = tf.cast(fn(y, pred), tf.float32)
    rank = out.shape.rank
    if rank == 0:
        raise ConfigError(
            "model",
            getattr(loss_fn, "name", repr(loss_fn)),
            "multi-worker training weighs every example: the loss must give one value per "
            "example (a keras.losses.Loss, or a function of (y_true, y_pred) returning [batch])",
        )
    if rank is not None and rank > 1:
        out = tf.reduce_mean(out, axis=list(range(1, rank)))
    return out


def weights_digest(model: keras.Model) -> str:
    """CRC-32 of every model weight's bytes (this worker's copy), as 8 hex digits."""
    crc = 0
    for v in model.variables:
        crc = zlib.crc32(np.ascontiguousarray(v.numpy()).tobytes(), crc)
    return f"{crc:08x}"


def is_peer_loss(exc: BaseException) -> bool:
    """An error of a collective or of the coordination service: a peer is gone (or the
    cluster aborted), so this process must be restarted with all the others."""
    if isinstance(
        exc,
        tf.errors.UnavailableError
        | tf.errors.AbortedError
        | tf.errors.CancelledError
        | tf.errors.DeadlineExceededError,
    ):
        return True
    text = str(exc)
    return any(
        word in text
        for word in ("Collective ops is aborted", "heartbeat", "coordination service", "/job:")
    )


def _local_results(strategy: tf.distribute.Strategy, value: Any) -> Any:
    return strategy.experimental_local_results(value)[0]


class ClusterStep:
    """The compiled functions of a round, on every worker alike.

    >>> step = ClusterStep(strategy, bundle, topology)            # doctest: +SKIP
    >>> ctrl = step.sync(local_vector)                             # doctest: +SKIP
    >>> loss_sum = step.train(features, weight, global_rows)      # doctest: +SKIP

    ``sync`` returns the all-reduced (SUM) vector; ``train`` this worker's Σ weight·loss.
    """

    def __init__(
        self,
        strategy: tf.distribute.MultiWorkerMirroredStrategy,
        bundle: ModelBundle,
        topology: Topology,
        *,
        jit_compile: bool = False,
    ) -> None:
        self.strategy = strategy
        self.bundle = bundle
        self.topology = topology
        self.local_replicas = strategy.num_replicas_in_sync // topology.count
        if self.local_replicas != 1:
            raise ConfigError(
                "CUDA_VISIBLE_DEVICES",
                f"{self.local_replicas} devices",
                "one device per worker process: start one worker per GPU (give each its own "
                "CUDA_VISIBLE_DEVICES, and list every one in TF_CONFIG / --cluster-workers)",
            )
        model, loss_fn, optimizer = bundle.model, bundle.loss, bundle.optimizer
        names, label = bundle.input_names, bundle.label
        with strategy.scope():
            optimizer.build(model.trainable_variables)  # slots exist: checkpoints hold them

        def replica_sync(vec: tf.Tensor) -> tf.Tensor:
            # tf.identity: an input tensor has no replica device to reduce from.
            return tf.distribute.get_replica_context().all_reduce("sum", tf.identity(vec))

        @tf.function
        def sync(vec: tf.Tensor) -> tf.Tensor:
            return strategy.run(replica_sync, args=(vec,))

        def replica_step(
            inputs: dict[str, tf.Tensor], labels: tf.Tensor, weight: tf.Tensor, rows: tf.Tensor
        ) -> tf.Tensor:
            with tf.GradientTape() as tape:
                pred = model(inputs, training=True)
                total = tf.reduce_sum(per_example_loss(loss_fn, labels, pred) * weight)
                scaled = total / rows
                if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
                    scaled = optimizer.scale_loss(scaled)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return total

        @tf.function(jit_compile=jit_compile, reduce_retracing=True)
        def train(features: dict[str, Any], weight: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
            inputs = {n: features[n] for n in names}
            return strategy.run(replica_step, args=(inputs, features[label], weight, rows))

        self._sync = sync
        self._train = train

    def sync(self, vector: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The SUM over workers of ``vector`` (every worker calls this with its own)."""
        out = self._sync(tf.constant(vector))
        return np.asarray(_local_results(self.strategy, out).numpy())

    def train(
        self, features: Mapping[str, Any], weight: npt.NDArray[np.float32], rows: int
    ) -> float:
        """One training step on this worker's batch; ``rows``: real rows of all workers.

        Returns Σ weight·loss of this worker's rows.
        """
        names = (*self.bundle.input_names, self.bundle.label)
        batch = {n: features[n] for n in names}
        out = self._train(batch, tf.constant(weight), tf.constant(float(rows), tf.float32))
        return float(_local_results(self.strategy, out))

    def broadcast(self, extra: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Every worker takes the chief's model and optimizer state, and the chief's ``extra``
        (the checkpoint's step and offsets); returns that ``extra``.

        An all-reduce where every worker but the chief contributes zeros: no shared storage is
        read by any worker but the chief.
        """
        model, optimizer = self.bundle.model, self.bundle.optimizer
        variables = [*model.variables, *optimizer.variables]
        chief = tf.constant(self.topology.chief)

        @tf.function
        def run(extra_t: tf.Tensor) -> Any:
            def replica() -> Any:
                ctx = tf.distribute.get_replica_context()
                values = [tf.cast(v.value, tf.float64) for v in variables] + [tf.identity(extra_t)]
                mine = [tf.where(chief, x, tf.zeros_like(x)) for x in values]
                return ctx.all_reduce("sum", mine)

            return self.strategy.run(replica)

        out = run(tf.constant(extra, tf.float64))
        values = [_local_results(self.strategy, v) for v in out]
        for var, value in zip(variables, values[:-1], strict=True):
            var.assign(tf.cast(value, var.dtype))
        return np.asarray(values[-1].numpy())
