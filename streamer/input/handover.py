"""HandOver: where records leave the input pipeline for training, so a revoked partition is
handed to its next owner exactly: what was trained is committed, the rest never trained here.

The last stage of ``StreamSource.dataset()`` is a filter (graph ops only, no Python per
batch) that keeps, per partition, the highest offset it handed to the trainer, and drops a
row when its offset is at or below the partition's floor. A revocation raises the floor past
every offset (nothing more of the partition reaches training), waits until every record it
handed is trained (acknowledged in the offset tracker), and only then lets the shard commit:
the commit is exactly what was trained. An assignment sets the floor below the partition's
start, so records of an earlier assignment still in the pipeline (stale copies) are dropped.

Blocks of one partition stay in offset order through the pipeline (one shard per partition,
a deterministic decode map, ``rebatch``): what was handed is a prefix of what was read, so
"trained up to the highest handed offset" is one commit point. With a shuffle window rows are
not in order: the filter then only drops revoked partitions' rows, and a revocation commits
the tracker's point as it stands (records handed and not yet trained are trained again by the
next owner).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = ["HandOver"]

log = logging.getLogger("streamer.handover")

#: Partitions 0 .. CAPACITY-1 are filtered (Kafka topics stay far below); rows of a higher
#: partition pass unfiltered.
CAPACITY = 1 << 16
_NEVER = 2**63 - 1


class HandOver:
    """The hand-over point of one source's dataset (see the module)."""

    def __init__(self, *, ordered: bool, wait_seconds: float = 5.0) -> None:
        self.ordered = ordered
        self.wait_seconds = wait_seconds
        with tf.init_scope():
            self._floor = tf.Variable(tf.fill([CAPACITY], tf.constant(-1, tf.int64)), trainable=False)
            self._handed = tf.Variable(tf.fill([CAPACITY], tf.constant(-1, tf.int64)), trainable=False)
        #: Rows dropped by the filter so far (stale or revoked): a figure for tests and logs.
        self._dropped = tf.Variable(tf.constant(0, tf.int64), trainable=False)

    # ---- the filter (graph, the dataset's last map) ------------------------------------------

    def filter(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch`` without the rows that must not be trained here."""
        partition = tf.cast(batch["partition"], tf.int64)
        offset = batch["offset"]
        inside = partition < CAPACITY
        idx = tf.minimum(partition, CAPACITY - 1)
        floor = tf.gather(self._floor, idx)
        if self.ordered:
            floor = tf.maximum(floor, tf.gather(self._handed, idx))
        keep = tf.logical_or(tf.logical_not(inside), offset > floor)
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
        return int(self._dropped.numpy())

    def assign(self, starts: dict[int, int | None]) -> None:
        """Partitions assigned here, with where they start (None: unknown, nothing dropped)."""
        parts = [p for p in starts if 0 <= p < CAPACITY]
        if not parts:
            return
        floors = [(-1 if starts[p] is None else int(starts[p]) - 1) for p in parts]  # type: ignore[operator]
        idx = tf.constant(parts, tf.int64)
        values = tf.constant(floors, tf.int64)
        self._handed.scatter_update(tf.IndexedSlices(values, idx))
        self._floor.scatter_update(tf.IndexedSlices(values, idx))

    def block(self, partitions: list[int]) -> None:
        """No record of these partitions reaches training from now on (lost, or revoking)."""
        parts = [p for p in partitions if 0 <= p < CAPACITY]
        if parts:
            idx = tf.constant(parts, tf.int64)
            never = tf.fill([len(parts)], tf.constant(_NEVER, tf.int64))
            self._floor.scatter_update(tf.IndexedSlices(never, idx))

    def release(self, partitions: list[int], done: Callable[[int], int | None]) -> None:
        """Revoking: block the partitions, then wait (at most ``wait_seconds``) until every
        record of them handed to training is trained. ``done(p)``: the tracker's commit point
        of ``p`` (None: nothing registered)."""
        self.block(partitions)
        if not self.ordered:
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
            if not left or time.monotonic() >= deadline:
                break
            parts = list(left)
            time.sleep(0.002)
        for p, n in left.items():
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
