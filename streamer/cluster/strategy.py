"""MultiWorkerMirroredStrategy: the strategy from a Topology, the compiled steps of one round
(control all-reduce, weighted training step, offsets), the broadcast of the chief's state, and
what a lost peer looks like.

Keras' own step (``streamer.train.trainer.keras_train_step``: ``compute_loss``, regularization,
compiled metrics, the model's ``train_step`` if it has one) under ``strategy.run``, not
``model.fit`` (Keras 3's fit fails under MWMS with TF 2.21; see MULTIWORKER.md). Padding rows
and the normalisation travel as Keras sample weights: a row's weight is its pad weight (0 or 1,
times the schema's sample weight) times ``B·N/R`` (B rows per worker, N workers, R real rows
of all workers), so Keras' mean over ``B·N`` rows is Σ weight·loss / R: each real row weighs the
same wherever it was read and padding weighs nothing. A round whose all-reduced real count is 0
never calls the optimizer: Adam moves weights even on zero gradients
(tests/streamer/cluster/test_multiworker.py checks both). A step whose loss or gradients are not finite
is skipped on every worker alike (the verdict is all-reduced).
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
from streamer.cluster.topology import Topology
from streamer.train.model import ModelBundle
from streamer.train.trainer import keras_train_step, metric_values

__all__ = [
    "ClusterStep",
    "check_per_example_loss",
    "is_peer_loss",
    "make_strategy",
    "weights_digest",
]

log = logging.getLogger(__name__)


def make_strategy(topology: Topology) -> tf.distribute.MultiWorkerMirroredStrategy:
    """MWMS for this topology. Must come before any other TensorFlow op of the process."""
    spec = tf.train.ClusterSpec({job: list(hosts) for job, hosts in topology.cluster.items()})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=topology.task_type, task_id=topology.task_id, rpc_layer="grpc"
    )
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


def check_per_example_loss(model: keras.Model) -> None:
    """ConfigError for a model whose output has no per-example axis (``[batch]``).

    Keras' mean-over-the-last-axis losses (mse, mae, ...) reduce a ``[batch]`` output to one
    number for the whole batch, so sample weights (and padding) could not weigh its rows.
    """
    for out in getattr(model, "outputs", None) or ():
        if len(out.shape) == 1:
            raise ConfigError(
                "model",
                getattr(model, "name", "model"),
                "multi-worker training weighs every example (padding rows weigh 0): give the "
                "model outputs of shape [batch, k] (Dense(1) without a Reshape to [batch]); "
                f"output {getattr(out, 'name', '?')!r} is [batch]",
            )


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
    >>> loss_sum, applied = step.train(features, weight, global_rows)   # doctest: +SKIP

    ``sync`` returns the all-reduced (SUM) vector; ``train`` this worker's Σ weight·loss and
    whether the step was applied.
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
        model = bundle.model
        check_per_example_loss(model)
        with strategy.scope():
            bundle.optimizer.build(model.trainable_variables)  # slots exist: checkpoints hold them
        scale = float(strategy.num_replicas_in_sync)

        def replica_sync(vec: tf.Tensor) -> tf.Tensor:
            # tf.identity: an input tensor has no replica device to reduce from.
            return tf.distribute.get_replica_context().all_reduce("sum", tf.identity(vec))

        @tf.function
        def sync(vec: tf.Tensor) -> tf.Tensor:
            return strategy.run(replica_sync, args=(vec,))

        @tf.autograph.experimental.do_not_convert
        def replica_step(x: Any, y: Any, weight: tf.Tensor, rows: tf.Tensor) -> Any:
            batch = tf.cast(tf.shape(weight)[0], tf.float32)
            loss, ok = keras_train_step(model, x, y, weight * (batch * scale / rows))
            # Σ weight·loss of this worker's rows: Keras' loss times R / N.
            return loss * rows / scale, ok

        @tf.function(jit_compile=jit_compile, reduce_retracing=True)
        def train(x: Any, y: Any, weight: tf.Tensor, rows: tf.Tensor) -> Any:
            return strategy.run(replica_step, args=(x, y, weight, rows))

        self._sync = sync
        self._train = train

    def sync(self, vector: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The SUM over workers of ``vector`` (every worker calls this with its own)."""
        out = self._sync(tf.constant(vector))
        return np.asarray(_local_results(self.strategy, out).numpy())

    def train(
        self, features: Mapping[str, Any], weight: npt.NDArray[np.float32], rows: int
    ) -> tuple[float, bool]:
        """One training step on this worker's batch; ``rows``: real rows of all workers.

        Returns Σ weight·loss of this worker's rows and whether the step was applied (False on
        every worker alike when a loss or gradient anywhere was not finite).
        """
        bundle = self.bundle
        x = {n: features[n] for n in bundle.input_names}
        labels = bundle.labels
        y = features[labels[0]] if len(labels) == 1 else {n: features[n] for n in labels}
        w = np.asarray(weight, np.float32)
        if bundle.weight:
            w = w * np.asarray(features[bundle.weight], np.float32)
        loss, ok = self._train(x, y, tf.constant(w), tf.constant(float(rows), tf.float32))
        return (
            float(_local_results(self.strategy, loss)),
            bool(_local_results(self.strategy, ok)),
        )

    def metric_values(self) -> dict[str, float]:
        """The model's metrics since the last call (all-reduced over workers), then reset.

        Every worker must call it at the same round: reading a metric is a collective."""
        values = metric_values(self.bundle.model)
        self.bundle.model.reset_metrics()
        return values

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
