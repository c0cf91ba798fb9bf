"""Checkpointer: model, optimizer, step and every partition's offset in one tf.train checkpoint."""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import shutil
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from streamer.train.model import ModelBundle
from streamer.train.trainer import check_finite_weights

__all__ = ["CheckpointPosition", "Checkpointer", "read_position"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CheckpointPosition:
    """What the newest checkpoint of a directory says of the stream, read without the model
    (``read_position``): its path and step, and its offsets for ``topic`` (none when it was
    written for another topic, or an earlier topic of the same name)."""

    path: str
    step: int
    offsets: dict[int, int]
    topic: str
    topic_id: str


def read_position(
    directory: str, topic: str, topic_id: str | None = None
) -> CheckpointPosition | None:
    """The newest checkpoint in ``directory`` (None without one): its step and its offsets
    for ``topic`` (whose id is ``topic_id`` now, where known). The model is not needed, so
    the stream can start where the checkpoint says before the model exists; the model and
    optimizer are restored from the same path later (``Checkpointer.restore_path``)."""
    path = tf.train.latest_checkpoint(directory)
    if path is None:
        return None
    reader = tf.train.load_checkpoint(path)

    def value(name: str) -> np.ndarray:
        return np.asarray(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"))

    saved, _, saved_id = bytes(value("topic")).decode().partition("\n")
    offsets = {
        int(p): int(o)
        for p, o in zip(value("offset_partitions"), value("offset_values"), strict=True)
    }
    if saved != topic or (topic_id and saved_id and saved_id != topic_id):
        offsets = {}  # another topic's (the model still applies; Checkpointer warns)
    return CheckpointPosition(path, int(value("step")), offsets, saved, saved_id)


def _short(exc: BaseException) -> str:
    """An I/O error as one line: TensorFlow's OpError messages carry a whole trace."""
    text = getattr(exc, "message", None) or str(exc)
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__


class Checkpointer:
    """Model, optimizer, step and per-partition offsets in one tf.train checkpoint.

    >>> ckpt = Checkpointer("/ckpt", bundle, topic="samples")   # doctest: +SKIP
    >>> restored = ckpt.restore()        # None, or (step, {partition: next offset})  # doctest: +SKIP
    >>> ckpt.save(step, tracker_offsets)  # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str | None,
        bundle: ModelBundle,
        *,
        topic: str,
        keep: int = 3,
        restore_from: str | None = None,
    ) -> None:
        """``directory``: where checkpoints are written (None: never); ``restore_from``: where
        ``restore()`` reads the newest one (default: ``directory``)."""
        self.directory = directory
        self.restore_from = restore_from or directory
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
        self._bundle = bundle
        #: Saves that failed in a row (0 after a success), and the last one's cause.
        self.failures = 0
        self.last_error = ""
        self._ckpt = tf.train.Checkpoint(
            model=bundle.model,
            optimizer=bundle.optimizer,
            step=self._step,
            offset_partitions=self._parts,
            offset_values=self._offsets,
            topic=self._topic,
        )
        self.manager = (
            tf.train.CheckpointManager(self._ckpt, directory, max_to_keep=keep)
            if directory
            else None
        )

    @property
    def latest(self) -> str | None:
        """The newest checkpoint written to ``directory`` (None without one)."""
        latest: str | None = self.manager.latest_checkpoint if self.manager else None
        return latest

    def restore(self) -> tuple[int, dict[int, int]] | None:
        """Restore the newest checkpoint of ``restore_from``: None without one, else (step,
        offsets)."""
        if self.restore_from is None:
            return None
        if self.manager is not None and self.restore_from == self.directory:
            path = self.manager.latest_checkpoint
        else:
            path = tf.train.latest_checkpoint(self.restore_from)
        if path is None:
            return None
        return self.restore_path(path)

    def restore_path(self, path: str, *, announce: bool = True) -> tuple[int, dict[int, int]]:
        """Restore the checkpoint at ``path`` (a rollback names one of those it wrote):
        (step, offsets); ``announce``: say so at INFO (a rollback says it its own way)."""
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
        if announce:
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
        """Write a checkpoint; ModelDivergedError (nothing written) when a weight of the model
        or the optimizer is not finite."""
        if self.manager is None:
            raise ValueError("this Checkpointer only restores (no directory to write to)")
        self._check(step)
        self._assign(step, offsets)
        path: str = self.manager.save(checkpoint_number=step)
        return path

    def save_logged(self, step: int, offsets: Mapping[int, int]) -> str | None:
        """``save``, said in the log; None when the write failed (a full or read-only disk;
        nothing may be committed past the checkpoint before). One line per change of state:
        the first failure of a run of them is an ERROR with its cause, the next ones DEBUG,
        the first success after them says how many failed. What a failed write left behind
        (``ckpt-N_temp``) is removed. Raises ModelDivergedError as ``save`` does. The worker's
        and ``streamer.Stream``'s save."""
        try:
            path = self.save(step, offsets)
        except (OSError, tf.errors.OpError) as exc:
            self._remove_partial(step)
            self.failures += 1
            self.last_error = _short(exc)
            level = logging.ERROR if self.failures == 1 else logging.DEBUG
            log.log(
                level,
                "checkpoint at step %d failed: %s (retried with back-off; commits wait for a "
                "checkpoint; said once until one succeeds)",
                step,
                self.last_error,
            )
            return None
        if self.failures:
            log.info(
                "checkpoint %s at step %d: checkpoints work again after %d failed attempts",
                path,
                step,
                self.failures,
            )
            self.failures = 0
        else:
            log.info("checkpoint %s at step %d", path, step)
        return path

    def _remove_partial(self, step: int) -> None:
        """What a failed write of ``step`` left in the directory (TensorFlow writes
        ``ckpt-N_temp/`` and renames it when done): removed, so failures do not pile up."""
        if not self.directory:
            return
        for leftover in glob.glob(os.path.join(glob.escape(self.directory), f"ckpt-{step}_temp*")):
            try:
                if os.path.isdir(leftover):
                    shutil.rmtree(leftover)
                else:
                    os.remove(leftover)
            except OSError as exc:
                log.debug("could not remove %s: %s", leftover, exc)

    def write_copy(self, prefix: str, step: int, offsets: Mapping[int, int]) -> str:
        """The same checkpoint written to ``prefix``, outside the managed directory (a worker
        of a multi-worker cluster other than the chief: every worker must save, and only the
        chief's copy is kept)."""
        self._check(step)
        self._assign(step, offsets)
        # Created before the write (``save`` creates it): the copy restores with every object
        # matched, as a managed checkpoint does (a rollback restores one).
        _ = self._ckpt.save_counter
        path: str = self._ckpt.write(prefix)
        return path

    def _check(self, step: int) -> None:
        bundle = self._bundle
        check_finite_weights(
            [*bundle.model.variables, *bundle.optimizer.variables],
            what="checkpoint",
            step=step,
            checkpoint=self.latest,
        )

    def _assign(self, step: int, offsets: Mapping[int, int]) -> None:
        parts = sorted(offsets)
        self._step.assign(step)
        self._parts.assign(np.asarray(parts, dtype=np.int64))
        self._offsets.assign(np.asarray([offsets[p] for p in parts], dtype=np.int64))
        self._topic.assign(f"{self.topic}\n{self.topic_id}" if self.topic_id else self.topic)
