"""``StreamCallback``: what ``model.fit`` tells a ``streamer.Stream`` (``Stream.callback()``).

Keras reports each call of its train function done (``on_train_batch_end``, once per
``steps_per_execution`` steps, numbered within the epoch); the batches it trained are the
oldest ones the dataset's last stage noted (``streamer.stream._Ledger``), so their records are
acknowledged, and the stream's commit or checkpoint schedule goes on. Anchor: Keras' own
``BackupAndRestore`` (restore on train begin, save on a batch schedule and at the end).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import keras

if TYPE_CHECKING:
    from streamer.stream import Stream

__all__ = ["StreamCallback"]


def _loss(logs: dict[str, Any] | None) -> float | None:
    value = (logs or {}).get("loss")
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


class StreamCallback(keras.callbacks.Callback):
    """Restores on train begin, acknowledges what Keras trained, checkpoints and commits on
    the stream's schedule and at train end (see ``Stream.callback``). Runs in Keras' own
    thread, never asynchronously: the batches' order is the point."""

    def __init__(self, stream: Stream) -> None:
        super().__init__()
        self.stream = stream
        self._begin_step = 0
        self._began = time.perf_counter()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.stream._bind(self.model)  # ``self.model`` syncs a JAX model's state first
        self.stream._begin()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._begin_step = batch
        self._began = time.perf_counter()
        # The call may wait for input as long as the stream is idle: not a stall (/healthz).
        self.stream.health.waiting("trainer", "in a Keras step, or its wait for input")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras numbers the steps of a call begin..end (steps_per_execution of them).
        steps = batch - self._begin_step + 1
        stream = self.stream
        stream._trained(stream._ledger.take(steps), loss=_loss(logs), began=self._began)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.stream._end()
