"""HandOver: where records leave the input pipeline for training, so a revoked partition is
handed to its next owner exactly: what was trained is committed, the rest never trained here.

Every assignment of a partition to this source gets a new epoch (``ShardRouter``); a block
claimed from a shard carries the epochs of its partitions, and every row its epoch (the
``EPOCH`` column, added by the decode and removed here). The last stage of
``StreamSource.dataset()`` is a filter (graph ops only, no Python per batch) that keeps a row
only while its partition's current epoch is the row's, and records per partition the highest
offset it handed to the trainer. A revocation ends the epoch (nothing more of the partition
reaches training: rows still in the pipeline's buffers are dropped, never trained after the
hand-over nor trained again if the partition comes back), waits until every record it handed
is trained (acknowledged in the offset tracker), and only then lets the shard commit: the
commit is exactly what was trained.

Blocks of one partition stay in offset order through the pipeline (one shard per partition
and epoch, a deterministic decode map, ``rebatch``): what was handed is a prefix of what was
read, so "trained up to the highest handed offset" is one commit point. With a shuffle window
rows are not in order: a revocation then commits the tracker's point as it stands (records
handed and not yet trained are trained again by the next owner).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["EPOCH", "EpochTable", "HandOver"]

log = logging.getLogger(__name__)

#: Partitions 0 .. CAPACITY-1 are filtered (Kafka topics stay far below); rows of a higher
#: partition pass unfiltered.
CAPACITY = 1 << 16
#: The batch column that carries each row's assignment epoch up to the filter.
EPOCH = "_epoch"
_ENDED = -1


@dataclass(frozen=True, slots=True)
class EpochTable:
    """Every partition's current assignment epoch, as sorted arrays. Immutable: an assignment
    makes a new table (``updated``), so a claim takes the current one by reference, without
    a lock or a look at the block's partitions, and its rows are looked up at decode.

    >>> t = EpochTable().updated({3: 2, 5: 7})
    >>> t.rows(np.array([3, 5, 3, 9], np.int32)).tolist()
    [2, 7, 2, 0]
    """

    keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def updated(self, epochs: dict[int, int]) -> EpochTable:
        merged = dict(zip(self.keys.tolist(), self.values.tolist(), strict=True))
        merged.update(epochs)
        keys = np.array(sorted(merged), np.int64)
        return EpochTable(keys, np.array([merged[k] for k in keys.tolist()], np.int64))

    def get(self, partition: int) -> int:
        return int(self.rows(np.array([partition]))[0])

    def rows(self, partition: np.ndarray) -> np.ndarray:
        """Each row's epoch by its partition (0: a partition never assigned)."""
        if not self.keys.size or not len(partition):
            return np.zeros(len(partition), np.int64)
        pos = np.minimum(np.searchsorted(self.keys, partition), self.keys.size - 1)
        return np.where(self.keys[pos] == partition, self.values[pos], 0)


class HandOver:
    """The hand-over point of one source's dataset (see the module)."""

    def __init__(self, *, ordered: bool, wait_seconds: float = 5.0) -> None:
        self.ordered = ordered
        self.wait_seconds = wait_seconds
        #: False once the trainer has left the pass (a stop, the pass's end): nothing handed
        #: is trained any more, so a revocation then does not wait for it.
        self.training = True
        with tf.init_scope():
            zeros = tf.zeros([CAPACITY], tf.int64)
            #: Per partition, the epoch whose rows may be trained (-1: none, revoked).
            self._current = tf.Variable(zeros, trainable=False)
            #: Per partition, the highest offset handed to training in the current epoch.
            self._handed = tf.Variable(zeros - 1, trainable=False)
            #: Rows dropped so far (of an ended epoch): a figure for logs and tests.
            self._dropped = tf.Variable(tf.constant(0, tf.int64), trainable=False)

    # ---- the filter (graph, the dataset's last map) ------------------------------------------

    def attach(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """``ds`` with the filter as its last stage: after every buffer, so a batch passes it
        only as the trainer takes it (no prefetch may be injected after it)."""
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        return ds.map(self.filter).with_options(options)

    def filter(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch`` without its ``EPOCH`` column and the rows that must not be trained."""
        batch = dict(batch)
        epoch = batch.pop(EPOCH)
        partition = tf.cast(batch["partition"], tf.int64)
        offset = batch["offset"]
        inside = partition < CAPACITY
        idx = tf.minimum(partition, CAPACITY - 1)
        keep = tf.logical_or(tf.logical_not(inside), tf.equal(epoch, tf.gather(self._current, idx)))
        handed = tf.logical_and(keep, inside)
        self._handed.scatter_max(
            tf.IndexedSlices(tf.boolean_mask(offset, handed), tf.boolean_mask(idx, handed))
        )
        dropped = tf.size(keep, tf.int64) - tf.math.count_nonzero(keep, dtype=tf.int64)

        def masked() -> dict[str, Any]:
            self._dropped.assign_add(dropped)
            return {k: _mask(v, keep) for k, v in batch.items()}

        return tf.cond(tf.reduce_all(keep), lambda: dict(batch), masked)

    # ---- the rebalance side (a shard's poller or event thread) --------------------------------

    @property
    def dropped(self) -> int:
        """Rows of ended assignments dropped before training so far."""
        return int(self._dropped.numpy())

    def assign(self, epochs: dict[int, int]) -> None:
        """Partitions assigned here, each with the epoch of this assignment."""
        parts = [p for p in epochs if 0 <= p < CAPACITY]
        if parts:
            idx = tf.constant(parts, tf.int64)
            self._handed.scatter_update(
                tf.IndexedSlices(tf.fill([len(parts)], tf.constant(-1, tf.int64)), idx)
            )
            values = tf.constant([epochs[p] for p in parts], tf.int64)
            self._current.scatter_update(tf.IndexedSlices(values, idx))

    def block(self, partitions: list[int]) -> None:
        """No record of these partitions reaches training from now on (lost, or revoking)."""
        parts = [p for p in partitions if 0 <= p < CAPACITY]
        if parts:
            idx = tf.constant(parts, tf.int64)
            ended = tf.fill([len(parts)], tf.constant(_ENDED, tf.int64))
            self._current.scatter_update(tf.IndexedSlices(ended, idx))

    def release(self, partitions: list[int], done: Callable[[int], int | None]) -> None:
        """Revoking: block the partitions, then wait (at most ``wait_seconds``) until every
        record of them handed to training is trained. ``done(p)``: the tracker's commit point
        of ``p`` (None: nothing registered)."""
        self.block(partitions)
        if not self.ordered or not self.training:
            return
        parts = [p for p in partitions if 0 <= p < CAPACITY]
        deadline = time.monotonic() + self.wait_seconds
        time.sleep(0.005)  # a filter call that read the floor before the block finishes
        left: dict[int, int] = {}
        while parts:
            handed = self._handed.numpy()
            left = {}
            for p in parts:
                h = int(handed[p])
                point = done(p)
                if h >= 0 and point is not None and point <= h:
                    left[p] = h - point + 1
            if not left or time.monotonic() >= deadline or not self.training:
                break
            parts = list(left)
            time.sleep(0.002)
        for p, n in left.items():
            log.debug("partition %d: handed up to %d, commit point %s", p, handed[p], done(p))
            log.warning(
                "partition %d: up to %d records handed to training were not trained within "
                "%.0fs of its revocation; committing what was trained (the next owner trains "
                "the rest again)",
                p,
                n,
                self.wait_seconds,
            )


def _mask(value: Any, keep: tf.Tensor) -> Any:
    if isinstance(value, tf.RaggedTensor):
        return tf.ragged.boolean_mask(value, keep)
    return tf.boolean_mask(value, keep)
