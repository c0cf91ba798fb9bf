"""What happens around a training loop's steps, as a list of callbacks in Keras' shape.

``keras.callbacks.Callback`` has ``on_train_batch_begin``/``on_train_batch_end`` and
``on_train_end``, and ``CallbackList`` calls each callback in order; a stream has no epochs,
so its passes take their place (``on_pass_end``). Both loops (``streamer.worker`` and
``streamer.cluster.worker``) call one list; the public API reuses it. Nothing here reads the
command line: each callback gets its parts.

``step`` is the number of training steps done: before the step(s) for ``*_begin``, after
them for ``*_end``. ``logs`` of ``on_train_batch_end``: ``loss`` (the last step's), ``samples``
(records trained), ``input_wait_seconds`` and ``steps`` (several for one call of
--steps-per-execution).

>>> calls = []
>>> class Note(Callback):
...     def on_train_batch_end(self, step, logs=None):
...         calls.append((step, dict(logs or {})))
>>> CallbackList([Note(), None]).on_train_batch_end(3, {"steps": 1})
>>> calls
[(3, {'steps': 1})]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from consumers.errors import StreamerError

if TYPE_CHECKING:
    from streamer.ops.metrics import Metrics
    from streamer.ops.status import StatusLine
    from streamer.ops.tboard import ProfileWindow, TrainingSummaries
    from streamer.train.evaluate import Evaluator
    from streamer.train.lease import Lease

__all__ = [
    "Callback",
    "CallbackList",
    "Evaluation",
    "Every",
    "Export",
    "LeaseCheck",
    "Profiler",
    "TensorBoard",
    "TrainMetricReport",
]

Logs = Mapping[str, Any]

log = logging.getLogger(__name__)


class Callback:
    """One thing that happens around steps; override what it needs."""

    def on_train_batch_begin(self, step: int, logs: Logs | None = None) -> None:
        """Before the next step(s) are dispatched (``logs["steps"]``: how many)."""

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        """After applied step(s): their records are acknowledged."""

    def on_pass_end(self, step: int, logs: Logs | None = None) -> None:
        """A pass of the stream ended (its last checkpoint and commit are done)."""

    def on_train_end(self, logs: Logs | None = None) -> None:
        """The run is over (after the input's last commits): close what was opened."""


class CallbackList(Callback):
    """Callbacks called in order (``None`` entries, parts not configured, are left out)."""

    def __init__(self, callbacks: Iterable[Callback | None] = ()) -> None:
        self.callbacks = [c for c in callbacks if c is not None]

    def append(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def on_train_batch_begin(self, step: int, logs: Logs | None = None) -> None:
        for c in self.callbacks:
            c.on_train_batch_begin(step, logs)

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        for c in self.callbacks:
            c.on_train_batch_end(step, logs)

    def on_pass_end(self, step: int, logs: Logs | None = None) -> None:
        for c in self.callbacks:
            c.on_pass_end(step, logs)

    def on_train_end(self, logs: Logs | None = None) -> None:
        for c in self.callbacks:
            c.on_train_end(logs)


class LeaseCheck(Callback):
    """A worker whose --checkpoint-dir was taken over trains no further (``Lease.check``
    raises); the lease is given up at the end."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        self.lease.check()

    def on_train_end(self, logs: Logs | None = None) -> None:
        self.lease.close()


class Profiler(Callback):
    """The TensorFlow Profiler over steps A:B (--profile-steps)."""

    def __init__(self, window: ProfileWindow) -> None:
        self.window = window

    def on_train_batch_begin(self, step: int, logs: Logs | None = None) -> None:
        steps = int((logs or {}).get("steps", 1))
        if steps > 1:
            self.window.before_steps(step, step + steps)
        else:
            self.window.before_step(step)

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        self.window.after_step(step)

    def on_train_end(self, logs: Logs | None = None) -> None:
        self.window.finish()


class TensorBoard(Callback):
    """Loss, samples/s, input wait and lag every interval (``TrainingSummaries``), written
    out at each pass's end and closed at the run's."""

    def __init__(self, summaries: TrainingSummaries) -> None:
        self.summaries = summaries

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        logs = logs or {}
        self.summaries.observe(
            step,
            float(logs.get("loss", float("nan"))),
            int(logs.get("samples", 0)),
            float(logs.get("input_wait_seconds", 0.0)),
        )

    def on_pass_end(self, step: int, logs: Logs | None = None) -> None:
        self.summaries.flush()

    def on_train_end(self, logs: Logs | None = None) -> None:
        self.summaries.close()


class TrainMetricReport(Callback):
    """The model's metrics over a window of ``interval`` seconds of training: Prometheus, the
    status line, TensorBoard. A stream has no epochs (Keras resets its metrics each epoch): a
    window ends every ``interval`` seconds, and where the loop calls ``report`` (a pass's
    end, before an evaluation, which shares the model's metric state).

    ``read`` returns the metrics since the last read and resets them (in a cluster, an
    all-reduce every worker makes at the same round: there the round's agreed decision calls
    ``report``, and ``automatic`` is False).

    >>> now = [0.0]; seen = []
    >>> r = TrainMetricReport(10, lambda: {"mae": 0.5}, publish=seen.append,
    ...                       clock=lambda: now[0])
    >>> r.on_train_batch_end(1, {"steps": 1}); seen            # within the window
    []
    >>> now[0] = 10.0; r.on_train_batch_end(2, {"steps": 1}); seen
    [{'mae': 0.5}]
    >>> r.report(2); seen                                      # no step since: no report
    [{'mae': 0.5}]
    """

    def __init__(
        self,
        interval: float,
        read: Callable[[], dict[str, float]],
        *,
        metrics: Metrics | None = None,
        status: Callable[[], StatusLine | None] | None = None,
        summaries: TrainingSummaries | None = None,
        publish: Callable[[dict[str, float]], None] | None = None,
        automatic: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.read = read
        self.metrics = metrics
        self.status = status
        self.summaries = summaries
        self.publish = publish
        self.automatic = automatic
        self._clock = clock
        self._window = clock()
        #: Steps since the last report: an empty window reads 0, a false figure.
        self.steps_in_window = 0

    def due(self) -> bool:
        """A window is over and holds steps."""
        return bool(self.steps_in_window) and self._clock() - self._window >= self.interval

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        self.steps_in_window += int((logs or {}).get("steps", 1))
        if self.automatic and self.due():
            self.report(step)

    def report(self, step: int) -> None:
        """End the window now (when it holds steps): read the metrics and publish them."""
        if not self.steps_in_window:
            return
        self._window, self.steps_in_window = self._clock(), 0
        values = self.read()
        if not values:
            return
        if self.metrics is not None:
            self.metrics.observe_train_metrics(values)
        status = self.status() if self.status is not None else None
        if status is not None:
            status.show_metrics(values)
        if self.summaries is not None:
            self.summaries.train_metrics(step, values)
        if self.publish is not None:
            self.publish(values)


class Every(Callback):
    """``action(step)`` whenever the step count crosses a multiple of ``every_steps`` (once
    for a call of several steps: with the model as the call left it)."""

    def __init__(self, every_steps: int, action: Callable[[int], None]) -> None:
        self.every_steps = every_steps
        self.action = action

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        steps = int((logs or {}).get("steps", 1))
        if step // self.every_steps > (step - steps) // self.every_steps:
            self.action(step)


class Export(Callback):
    """Export the model every ``every_steps`` steps (``Every``), and once more at a clean stop
    (``final``) when the model moved since the last export and since the run began.
    ``action(step)`` exports and returns whether it succeeded (a failed export never stops
    training: the next one tries again).

    >>> done = []
    >>> e = Export(10, lambda step: done.append(step) or True, start_step=0)
    >>> e.on_train_batch_end(10, {"steps": 1}); e.final(10); e.final(12); done
    [10, 12]
    """

    def __init__(self, every_steps: int, action: Callable[[int], bool], *, start_step: int) -> None:
        self.action = action
        self.start_step = start_step
        self.exported_step = start_step
        self.every = Every(every_steps, self._export)

    def _export(self, step: int) -> None:
        if self.action(step):
            self.exported_step = step

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        self.every.on_train_batch_end(step, logs)

    def final(self, step: int) -> None:
        """A clean stop: the final model is served too."""
        if step not in (self.exported_step, self.start_step):
            self._export(step)


class Evaluation(Callback):
    """The model on a held-out stream (``Evaluator``) every ``every_steps`` steps, or
    ``every_seconds`` after the last evaluation ended (counted from the first step: start-up
    is not training time; so a slow evaluation never runs back to back with the next); at
    most once per step. The train-metric window ends first (evaluation shares the model's
    metric state); the result goes to Prometheus, TensorBoard and the log. A failed or empty
    evaluation is a WARNING, never a stop: the next one waits its turn."""

    def __init__(
        self,
        evaluator: Evaluator,
        *,
        every_steps: int,
        every_seconds: float | None,
        metrics: Metrics,
        reports: TrainMetricReport | None = None,
        summaries: TrainingSummaries | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.evaluator = evaluator
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.metrics = metrics
        self.reports = reports
        self.summaries = summaries
        self._clock = clock
        self._since: float | None = None  # the first step, then each evaluation's end
        self._evaluated_step = -1

    def due(self, step: int) -> bool:
        if step == self._evaluated_step:
            return False
        if step % self.every_steps == 0:
            return True
        if self.every_seconds is None:
            return False
        now = self._clock()
        if self._since is None:
            self._since = now
            return False
        return now - self._since >= self.every_seconds

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        if self.due(step):
            self.evaluate(step)

    def evaluate(self, step: int) -> None:
        import tensorflow as tf

        if self.reports is not None:
            self.reports.report(step)  # evaluation resets the model's metrics
        self._evaluated_step = step
        t0 = self._clock()
        try:
            result = self.evaluator.evaluate()
        except (StreamerError, tf.errors.OpError) as exc:
            log.warning("evaluation at step %d failed: %s", step, exc)
            result = None
        end = self._since = self._clock()
        if result is None:
            return
        self.metrics.observe_eval(result.loss, result.metrics)
        if self.summaries is not None:
            self.summaries.eval_loss(step, result.loss, result.metrics)
        log.info(
            "eval step=%d loss=%.5f records=%d seconds=%.2f%s",
            step,
            result.loss,
            result.records,
            end - t0,
            "".join(f" {name}={value:.5f}" for name, value in result.metrics.items()),
        )

    def on_train_end(self, logs: Logs | None = None) -> None:
        self.evaluator.close()
