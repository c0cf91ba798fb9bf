"""How a worker of a cluster builds its parts (``streamer.parts.Plan``): MultiWorkerMirroredStrategy
first, the round's compiled steps, its own share of the partitions, the chief's checkpoint
broadcast to every worker, and decoded blocks (not batches) for its padded batcher.

Also what a cluster refuses at start (``check_config``) and the error of a lost peer.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from consumers.errors import ConfigError, StreamerError
from consumers.settings import ConsumerSettings
from streamer.cluster.strategy import ClusterStep, is_peer_loss, make_strategy
from streamer.cluster.topology import (
    Topology,
    lost_worker,
    offsets_from_vector,
    offsets_vector,
    worker_partitions,
)
from streamer.config import WorkerConfig
from streamer.input.pipeline import PipelineSettings
from streamer.input.source import StreamSource, StreamStart
from streamer.parts import Plan, Restored, Topic, required
from streamer.train.model import ModelBundle

__all__ = ["ClusterPlan", "PeerLostError", "check_config", "peer_lost"]

log = logging.getLogger(__name__)

#: A pass never ends on idle shards in multi-worker training: a worker whose input pauses
#: pads its batches instead (its consumers stay open).
NO_IDLE_END_S = 10.0**9


class PeerLostError(StreamerError):
    """A collective failed: another worker died or the cluster aborted."""

    def __init__(self, topology: Topology, lost: str, detail: str) -> None:
        self.lost = lost
        first = _gist(detail)
        super().__init__(
            f"{topology.describe()} lost {lost}: {first}. Exiting: restart every worker "
            "together (they resume from the last checkpoint)"
        )


def _gist(message: str) -> str:
    """The line of a TensorFlow error that says what happened (its first line is often just
    "Graph execution error:")."""
    lines = [x.strip() for x in message.splitlines() if x.strip()]
    for key in ("aborted by:", "unhealthy", "Connection", "connect", "Unavailable", "UNAVAILABLE"):
        for line in lines:
            if key in line:
                return line
    useful = [x for x in lines if not x.endswith(":") and not x.startswith(("[[", "Detected at"))]
    return (useful or lines or ["(no message)"])[0]


def check_config(cfg: WorkerConfig, topology: Topology) -> None:
    """Options that have no meaning (yet) for one model on N workers, refused at start-up."""
    if cfg.bootstrap is None:
        raise ConfigError(
            "bootstrap", None, f"{topology.describe()}: multi-worker training reads Kafka"
        )
    for name, why in (
        (
            "eval_topic",
            "not with several workers: an evaluation reads its metrics by all-reduce, so "
            "every worker would stop training for each one; evaluate the chief's exports "
            "(--export-dir) on their own",
        ),
        ("pass_records", "a multi-worker pass lasts the whole run (quiet input is padded)"),
        ("pass_seconds", "a multi-worker pass lasts the whole run (quiet input is padded)"),
        ("replay", "replay a range with one worker"),
    ):
        if getattr(cfg, name) is not None:
            raise ConfigError(name, getattr(cfg, name), f"{topology.describe()}: {why}")
    if cfg.start_from != "committed":
        # Each worker would look its own partitions up, but the chief's checkpoint names every
        # partition: a partition not read yet would be checkpointed at the old offset.
        raise ConfigError(
            "start_from",
            cfg.start_from,
            f"{topology.describe()}: not with several workers; move the group first "
            "(streamer reset-group --to ..., with the checkpoint directory cleared), or train "
            "the range with one worker (streamer replay)",
        )
    if cfg.mixed_precision:
        raise ConfigError(
            "mixed_precision",
            True,
            f"{topology.describe()}: not with several workers yet (Keras' loss scaling checks "
            "each worker's gradients before they are all-reduced, so workers could disagree "
            "on skipping a step and wait for each other forever)",
        )


def peer_lost(topology: Topology, exc: tf.errors.OpError) -> StreamerError:
    """The error of a failed collective: a lost peer (named), or another training failure."""
    if not is_peer_loss(exc):
        return StreamerError(f"{topology.describe()}: training failed: {exc.message}")
    return PeerLostError(topology, lost_worker(exc.message, topology), exc.message)


def throwaway_dir(config: WorkerConfig, topology: Topology) -> str:
    """Where a worker other than the chief writes the copies MWMS needs every worker to save."""
    directory = required(config.checkpoint_dir, "checkpoint directory", "--checkpoint-dir")
    return os.path.join(directory, f"workertemp_{topology.index}")


class ClusterPlan(Plan[ClusterStep]):
    """One of N workers of one model (``topology``); ``formed`` is called once the strategy
    exists (TensorFlow's coordination service takes SIGTERM then: the loop takes it back)."""

    def __init__(self, topology: Topology, formed: Callable[[], None] = lambda: None) -> None:
        self.topology = topology
        self.workers = topology.count
        self.holds_lease = False  # streamer launch's workers share one directory
        self._formed = formed

    def strategy(self, config: WorkerConfig) -> tf.distribute.Strategy:
        from streamer.ops.tfstart import quiet_start

        with quiet_start():  # TensorFlow's runtime starts here: its start-up noise filtered
            strategy = make_strategy(self.topology)
        self._formed()
        return strategy

    def steps(self, config: WorkerConfig, strategy: Any, bundle: ModelBundle) -> ClusterStep:
        return ClusterStep(strategy, bundle, self.topology, jit_compile=config.jit_compile)

    def partitions(self, config: WorkerConfig, everything: list[int]) -> list[int]:
        topo = self.topology
        mine = worker_partitions(everything, topo.index, topo.count)
        if not mine:
            raise ConfigError(
                "cluster",
                topo.count,
                f"{topo.count} workers but {len(everything)} partitions to read: every worker "
                "needs at least one (run at most as many workers as partitions)",
            )
        return mine

    def restore(
        self, config: WorkerConfig, bundle: ModelBundle, steps: ClusterStep, topic: Topic
    ) -> Restored:
        """The chief restores the latest checkpoint and every worker takes its state (model,
        optimizer, step, offsets) by broadcast; this worker's partitions' offsets."""
        from streamer.cluster.strategy import weights_digest
        from streamer.train.checkpoint import Checkpointer

        topo = self.topology
        step, offsets = 0, dict[int, int]()
        checkpointer: Checkpointer | None = None
        if config.checkpoint_dir:
            checkpointer = Checkpointer(
                config.checkpoint_dir, bundle, topic=config.topic, keep=config.checkpoint_keep
            )
            if topo.chief:
                found = checkpointer.restore()
                if found is not None:
                    step, offsets = found
                    if not checkpointer.adopt_topic_id(topic.topic_id):
                        offsets = {}
            else:
                checkpointer.topic_id = topic.topic_id
                # A crash's leftovers.
                shutil.rmtree(throwaway_dir(config, topo), ignore_errors=True)
        count = max(topic.everything) + 1
        extra = np.concatenate(([float(step)], offsets_vector(offsets, count)))
        try:
            shared = steps.broadcast(extra)
        except tf.errors.OpError as exc:
            raise peer_lost(topo, exc) from exc
        mine = {p: o for p, o in offsets_from_vector(shared[1:]).items() if p in topic.mine}
        log.info(
            "cluster restore: step %d, offsets %s weights %s",
            int(shared[0]),
            mine,
            weights_digest(bundle.model),
        )
        return Restored(checkpointer, int(shared[0]), mine)

    def source_config(self, config: WorkerConfig, partitions: list[int]) -> WorkerConfig:
        return dataclasses.replace(
            config, partitions=tuple(partitions), shards=min(config.shards, len(partitions))
        )

    def pipeline(self, config: WorkerConfig) -> PipelineSettings:
        return dataclasses.replace(config.pipeline_settings(), idle_timeout_seconds=NO_IDLE_END_S)

    def start(
        self, config: WorkerConfig, consumer: ConsumerSettings | None, restored: Restored
    ) -> StreamStart:
        """The checkpoint's offsets (--start-from is refused with several workers)."""
        return super().start(config, None, restored)

    def dataset(self, source: StreamSource) -> tf.data.Dataset:
        return source.flat_blocks()
