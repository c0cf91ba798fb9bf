"""TensorBoard: scalar summaries of the training loop, and a profiler window over steps A:B.

Scalars are written with ``tf.summary.write`` and the scalars plugin's metadata, which is what
``tf.summary.scalar`` writes when the ``tensorboard`` package is installed; the worker does not
need that package to log (only to view). One event file per run under ``--logdir``; profiler
traces land in ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` where TensorBoard's profile
plugin looks for them.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

__all__ = ["ProfileWindow", "TrainingSummaries"]

log = logging.getLogger(__name__)

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR,
)


def view_hint(logdir: str) -> str:
    """How to view ``logdir``: the command, and how to install TensorBoard where it is not
    (TensorFlow 2.21 does not install it)."""
    import importlib.util

    from consumers.install import pip_install

    command = f"tensorboard --logdir {logdir}"
    if importlib.util.find_spec("tensorboard") is None:
        return f"view them with `{command}` after `{pip_install('tensorboard')}`"
    return f"view them with `{command}`"


class TrainingSummaries:
    """Loss, samples/s, input-wait fraction and lag every ``interval`` seconds; eval on call.

    Per step the loop only adds numbers (``observe``); the file is written when an interval is
    due, so a step pays a clock read and an add.

    Tags: ``train/loss``, ``train/samples_per_second``, ``train/input_wait_fraction`` (time
    spent waiting for the next batch over the interval's wall time), ``kafka/consumer_lag_records``
    (sum over assigned partitions), ``eval/loss`` and ``eval/<name>`` for each compiled metric
    of the model (``eval/mae`` for the built-in one).
    """

    def __init__(self, logdir: str, interval: float, lag: Callable[[], float]) -> None:
        self.logdir = logdir
        self.interval = interval
        self._lag = lag
        self._writer = tf.summary.create_file_writer(logdir)
        log.info("TensorBoard summaries in %s: %s", logdir, view_hint(logdir))
        self._t = time.monotonic()
        self._samples = 0
        self._wait = 0.0
        self._idle = 0.0  # waits of a second or more: idle, not training time

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        with self._writer.as_default():
            for tag, value in values.items():
                if value is None or math.isnan(value):
                    continue
                tf.summary.write(
                    tag, tf.constant(value, tf.float32), step=step, metadata=_SCALAR_METADATA
                )

    def observe(self, step: int, loss: float, samples: int, input_wait_seconds: float) -> None:
        self._samples += samples
        self._wait += input_wait_seconds
        if input_wait_seconds >= 1.0:
            self._idle += input_wait_seconds
        now = time.monotonic()
        elapsed = now - self._t
        if elapsed < self.interval:
            return
        busy = max(elapsed - self._idle, 1e-9)  # samples/s over training time, as the status line
        self.scalars(
            step,
            {
                "train/loss": loss,
                "train/samples_per_second": self._samples / busy,
                "train/input_wait_fraction": min(1.0, self._wait / elapsed),
                "kafka/consumer_lag_records": self._lag(),
            },
        )
        self._t, self._samples, self._wait, self._idle = now, 0, 0.0, 0.0

    def train_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """``train/metric/<name>``: the model's loss and compiled metrics over the last window
        (Keras' names; ``train/loss`` stays the last step's loss)."""
        self.scalars(step, {f"train/metric/{k}": v for k, v in metrics.items()})

    def eval_loss(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        """``eval/loss`` and ``eval/<name>`` for each compiled metric, flushed at once."""
        self.scalars(
            step, {"eval/loss": loss, **{f"eval/{k}": v for k, v in (metrics or {}).items()}}
        )
        self._writer.flush()

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class ProfileWindow:
    """Runs the TensorFlow Profiler from before step ``start + 1`` to after step ``stop``.

    Steps count finished train steps (the worker's ``step``): ``--profile-steps 100:110``
    traces the ten steps 101..110, input waits included. Started at most once per run; a
    run that resumes past ``start`` from a checkpoint starts at once if it is still before
    ``stop``.
    """

    def __init__(self, logdir: str, start: int, stop: int) -> None:
        self.logdir = logdir
        self.start = start
        self.stop = stop
        self.active = False
        self.done = False

    def before_step(self, step: int) -> None:
        if self.done or self.active or not self.start <= step < self.stop:
            return
        try:
            tf.profiler.experimental.start(self.logdir)
        except Exception as exc:  # e.g. another profiler session is running
            log.warning("could not start the profiler: %s", exc)
            self.done = True
            return
        self.active = True
        log.info("profiling steps %d:%d into %s", self.start, self.stop, self.logdir)

    def before_steps(self, first: int, end: int) -> None:
        """Before steps ``first`` to ``end`` (exclusive) run in one call: open the window if
        one of them is in it (``--steps-per-execution``)."""
        at = max(first, self.start)
        if at < end:
            self.before_step(at)

    def after_step(self, step: int) -> None:
        if self.active and step >= self.stop:
            self.finish()

    def finish(self) -> None:
        """Stop and write the trace (also when the run ends inside the window)."""
        if not self.active:
            return
        self.active = False
        self.done = True
        try:
            tf.profiler.experimental.stop()
        except Exception as exc:
            log.warning("could not write the profile: %s", exc)
            return
        log.info("profile written under %s/plugins/profile", self.logdir)
