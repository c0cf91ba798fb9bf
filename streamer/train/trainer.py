"""Training: the user's compiled Keras model trained batch by batch as ``model.fit`` trains it,
under a tf.distribute strategy, and a step whose loss or gradients are not finite never applied.

The step is Keras' own (``keras/src/backend/tensorflow/trainer.py``, Keras 3.15):

- a model whose class keeps Keras' ``train_step`` gets that step line for line: the forward
  pass with ``training=True``, ``Model.compute_loss`` (compiled losses, dict losses and
  ``loss_weights``, regularization and ``add_loss`` losses, rank alignment, sample weights,
  the division by the number of replicas), the loss tracker, the optimizer's loss scaling
  (mixed precision) and ``compute_metrics``. One thing is added: the update and the metric
  updates run only when the loss (and, without loss scaling, every gradient) is finite;
- a model whose class overrides ``train_step`` (Keras' documented way to customise training)
  gets its own ``train_step``; the optimizer's ``apply`` is gated on finite gradients while it
  is traced (a ``LossScaleOptimizer`` keeps its own rule: it skips non-finite steps and lowers
  the scale).

Every replica, and every worker of a multi-worker cluster, agrees on whether a step is applied
(an all-reduce of the verdict), so no collective is left waiting.

What ``model.fit`` does that the worker does not: callbacks, ``steps_per_execution``,
``class_weight``, epochs and validation splits (the stream has none), and its progress bar
(the worker has a status line, metrics and TensorBoard of its own).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from streamer.train.errors import ModelDivergedError
from streamer.train.model import ModelBundle

__all__ = [
    "StepHandle",
    "StepResult",
    "StepsResult",
    "Trainer",
    "check_finite_weights",
    "choose_strategy",
    "finite_gate",
    "nonfinite_variables",
]

log = logging.getLogger(__name__)


def choose_strategy() -> tf.distribute.Strategy:
    """All visible GPUs through MirroredStrategy when there are several, else the default."""
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        log.info("training on %d GPUs with MirroredStrategy", len(gpus))
        return tf.distribute.MirroredStrategy([g.name for g in gpus])
    log.info("training on %s", gpus[0].name if gpus else "CPU")
    return tf.distribute.get_strategy()


class StepResult(NamedTuple):
    """One step: the batch's loss (the mean over replicas, before loss scaling) and whether its
    update was applied (False: the loss or a gradient was not finite, nothing changed)."""

    loss: float
    applied: bool


class StepHandle:
    """A step started by ``Trainer.dispatch``: its loss and verdict, still on the device."""

    __slots__ = ("_loss", "_ok")

    def __init__(self, loss: Any, ok: Any) -> None:
        self._loss, self._ok = loss, ok

    def result(self) -> StepResult:
        """Wait for the step and read its result (one small copy to the host)."""
        return StepResult(float(self._loss), bool(self._ok))


class StepsResult(NamedTuple):
    """Several steps of one call (``Trainer.run_steps``), in order: per step its loss, whether
    it was applied, its rows, the seconds it waited for its batch and the seconds its step took;
    the metadata columns of all their rows, step after step; whether the iterator ended."""

    losses: np.ndarray
    applied: np.ndarray
    rows: np.ndarray
    input_wait_seconds: np.ndarray
    step_seconds: np.ndarray
    columns: dict[str, np.ndarray]
    #: The iterator ended during the call (the pass's input is over).
    ended: bool = False

    @property
    def steps(self) -> int:
        return len(self.losses)

    def step_columns(self, i: int) -> dict[str, np.ndarray]:
        """Step ``i``'s rows of each metadata column."""
        start = int(self.rows[:i].sum())
        stop = start + int(self.rows[i])
        return {name: column[start:stop] for name, column in self.columns.items()}


def nonfinite_variables(variables: Any) -> list[str]:
    """The names of the variables holding a NaN or ±Inf (empty when all are finite).

    >>> nonfinite_variables([tf.Variable([1.0, float("nan")], name="w")])
    ['w:0']
    """
    bad = []
    for v in variables:
        value = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            bad.append(getattr(v, "path", None) or v.name)
    return bad


def check_finite_weights(
    variables: Any, *, what: str, step: int, checkpoint: str | None = None
) -> None:
    """ModelDivergedError when a variable holds a NaN or ±Inf: ``what`` (a checkpoint, an
    export) is never written with one."""
    bad = nonfinite_variables(variables)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ModelDivergedError(
            f"at step {step} {len(bad)} variables hold NaN or Inf ({shown}): the {what} was "
            "not written",
            checkpoint,
        )


def _agree(finite: tf.Tensor) -> tf.Tensor:
    """True when ``finite`` holds on every replica (and every worker): one verdict for all."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return finite
    bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32))
    return tf.equal(bad, 0.0)


def _all_finite(tensors: Any) -> tf.Tensor:
    checks = [tf.reduce_all(tf.math.is_finite(g)) for g in tensors if g is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def finite_gate(ok: tf.Tensor, apply: Callable[[Any], None], grads: Any) -> None:
    """``apply(grads)`` in this replica when ``ok`` (agreed by every replica), else nothing.

    Under a strategy that needs ``merge_call`` for its updates (MirroredStrategy), the
    condition runs in the cross-replica context, the way Keras' ``LossScaleOptimizer`` does it:
    TensorFlow does not allow a ``cond`` in a replica context whose branch calls ``merge_call``.
    """

    def here() -> None:
        apply(grads)  # its value (the iteration count) is not a branch output

    if tf.__internal__.distribute.strategy_supports_no_merge_call():
        tf.cond(ok, here, lambda: None)
        return

    def cross(distribution: Any, ok: Any, grads: Any) -> None:
        verdict = distribution.experimental_local_results(ok)[0]

        def run() -> None:
            distribution.extended.call_for_each_replica(apply, args=(grads,))

        tf.cond(verdict, run, lambda: None)

    tf.distribute.get_replica_context().merge_call(cross, args=(ok, grads))


_FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def _loss_scaled(optimizer: Any) -> bool:
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def _first_batch_size(x: Any) -> tf.Tensor:
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    if isinstance(first, tf.RaggedTensor):
        return first.nrows(out_type=tf.int32)
    return tf.shape(first)[0]


@tf.autograph.experimental.do_not_convert
def keras_train_step(model: keras.Model, x: Any, y: Any, sample_weight: Any) -> tuple[Any, Any]:
    """One replica's step, as ``TensorFlowTrainer.train_step`` does it, gated on finiteness.

    Returns ``(loss, applied)``: the replica's loss before loss scaling and the agreed verdict.
    Call it in a replica context (``strategy.run``) inside a ``tf.function``.
    """
    if getattr(type(model), "train_step", None) is not keras.Model.train_step:
        return _custom_train_step(model, x, y, sample_weight)
    from keras.src.losses.loss import unscale_loss_for_distribution

    optimizer = model.optimizer
    # What the forward pass itself updates (BatchNormalization's moving statistics): put back
    # when the step is skipped, so one bad batch cannot poison them either.
    restorable = tf.__internal__.distribute.strategy_supports_no_merge_call()
    frozen = [v for v in model.non_trainable_variables if restorable and v.dtype in _FLOAT_DTYPES]
    before = [tf.identity(v.value) for v in frozen]
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        # Keras' wrapper of compute_loss: it drops ``training`` for an override without it.
        loss = model._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        unscaled = unscale_loss_for_distribution(loss)
        scaled = optimizer.scale_loss(loss)
    trainable = model.trainable_weights
    grads = tape.gradient(scaled, trainable) if trainable else []
    finite = tf.reduce_all(tf.math.is_finite(unscaled))
    if not _loss_scaled(optimizer):  # a LossScaleOptimizer checks (scaled) gradients itself
        finite = tf.logical_and(finite, _all_finite(grads))
    ok = _agree(finite)
    if trainable:
        finite_gate(ok, lambda g: optimizer.apply_gradients(zip(g, trainable, strict=True)), grads)
    else:
        log.warning("the model has no trainable weights: training changes nothing")

    if frozen:

        def restore() -> None:
            for v, value in zip(frozen, before, strict=True):
                v.assign(value)

        tf.cond(ok, lambda: None, restore)

    def update_metrics() -> None:
        tracker = model._loss_tracker  # the "loss" Mean that train_step updates
        if tracker is not None:
            tracker.update_state(unscaled, sample_weight=_first_batch_size(x))
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    tf.cond(ok, update_metrics, lambda: None)
    return tf.cast(unscaled, tf.float32), ok


class _GatedApply:
    """While a model's own ``train_step`` is traced, its optimizer's ``apply`` is gated on
    finite gradients (agreed by every replica); ``verdict`` is the last gate's decision."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.verdict: tf.Tensor | None = None

    def __enter__(self) -> _GatedApply:
        opt = self.optimizer
        if opt is None or _loss_scaled(opt):
            return self
        original = type(opt).apply

        def gated(grads: Any, trainable_variables: Any = None) -> None:
            grads = list(grads)
            ok = _agree(_all_finite(grads))
            self.verdict = ok
            finite_gate(ok, lambda g: original(opt, g, trainable_variables), grads)

        # object.__setattr__: the optimizer tracks what is set on it; a function is no state.
        object.__setattr__(opt, "apply", gated)
        return self

    def __exit__(self, *exc: object) -> None:
        opt = self.optimizer
        if opt is not None and "apply" in vars(opt):
            object.__delattr__(opt, "apply")


def _custom_train_step(model: keras.Model, x: Any, y: Any, sample_weight: Any) -> tuple[Any, Any]:
    data = (x, y) if sample_weight is None else (x, y, sample_weight)
    with _GatedApply(model.optimizer) as gate:
        logs = model.train_step(data)
    loss = logs.get("loss") if isinstance(logs, Mapping) else None
    loss = tf.constant(math.nan) if loss is None else tf.cast(tf.reshape(loss, []), tf.float32)
    ok = gate.verdict if gate.verdict is not None else tf.constant(True)
    return loss, ok


@tf.autograph.experimental.do_not_convert
def keras_test_step(model: keras.Model, x: Any, y: Any, sample_weight: Any) -> Any:
    """One replica's evaluation step: the model's ``test_step`` (loss tracker and metrics)."""
    data = (x, y) if sample_weight is None else (x, y, sample_weight)
    return model.test_step(data)


def metric_values(model: keras.Model) -> dict[str, float]:
    """Each of the model's metrics (``loss`` first) as one number, by Keras' name for it, as
    ``Model.get_metrics_result`` gives them.

    Metrics that have not been built yet (no step so far) and results that are not one number
    (a confusion matrix, say) are left out.
    """
    out: dict[str, float] = {}
    for metric in model.metrics:
        try:
            result = metric.result()
        except ValueError:  # "Cannot get result() since the metric has not yet been built."
            continue
        items = result.items() if isinstance(result, Mapping) else [(metric.name, result)]
        for name, value in items:
            arr = np.asarray(value)
            if arr.size == 1 and arr.dtype.kind in "fiu":
                out[name] = float(arr.reshape(()))
    return out


def _any_batch(value: Any) -> Any:
    if value is None:  # no sample weight
        return None
    spec = tf.type_spec_from_value(value)
    shape = spec.shape
    if shape.rank:
        relaxed = tf.TensorShape([None, *shape[1:]])
        if isinstance(spec, tf.RaggedTensorSpec):
            return tf.RaggedTensorSpec(relaxed, spec.dtype, spec.ragged_rank, spec.row_splits_dtype)
        return tf.TensorSpec(relaxed, spec.dtype)
    return spec


def _trace_once(fn: Any, data: tuple[Any, ...]) -> Any:
    """Trace ``fn`` once for batches of any size, before its first call; the concrete
    function of that trace (None for an eager ``fn``).

    A stream's batches have no static size (the last of a pass is short), as a ``tf.data``
    input to ``model.fit`` has none: Keras reads static shapes in places (a per-output loss
    tracker is weighted by the static batch size when there is one), so the trace must not
    see one. And one trace serves every batch size (no retrace at the end of a pass).
    """
    if not isinstance(fn, tf.types.experimental.PolymorphicFunction):
        return None
    return fn.get_concrete_function(*tf.nest.map_structure(_any_batch, data))


class _Compiled:
    """A ``tf.function`` called through the one concrete function that serves every batch.

    Calling the ``tf.function`` binds and canonicalises its arguments and looks the trace up
    on every call: about 320 µs of the main interpreter's GIL per step here, against 150 µs
    for its concrete function (profiled; at 256 records a batch, 0.7 µs per record). The
    graph is the same, so the step is too. A batch the concrete function does not take (its
    structure changed) goes through the ``tf.function``, which traces it.
    """

    def __init__(self, fn: Any, *, relax: bool = True) -> None:
        """``relax``: trace for batches of any size (``_trace_once``); else for ``data`` as
        it is (arguments that are no batch: an iterator, a step count)."""
        self.fn = fn
        self._relax = relax
        self._concrete: Any = None

    def __call__(self, data: tuple[Any, ...]) -> Any:
        if self._concrete is None:
            if self._relax:
                self._concrete = _trace_once(self.fn, data)
            elif isinstance(self.fn, tf.types.experimental.PolymorphicFunction):
                # Traced for the specs, not the values: a pass's new iterator is the same
                # argument to it (traced for an iterator object, a new one retraced).
                specs = [tf.type_spec_from_value(v) for v in data]
                self._concrete = self.fn.get_concrete_function(*specs)
            if self._concrete is None:  # eager (run_eagerly)
                return self.fn(*data)
        try:
            return self._concrete(*data)
        except TypeError:
            # Binding the inputs failed, before anything ran (a failure while the graph runs
            # is a tf.errors.OpError): not this trace's inputs, the tf.function decides.
            return self.fn(*data)


class Trainer:
    """Runs the user's compiled model one batch at a time, as ``model.fit`` would.

    >>> trainer = Trainer(load_model(None, schema))          # doctest: +SKIP
    >>> result = trainer.step(batch)     # StepResult(loss, applied); metadata columns ignored  # doctest: +SKIP
    >>> trainer.metric_values(reset=True)   # {"loss": ..., "mae": ...} since the last reset  # doctest: +SKIP
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
        model = bundle.model
        # Build the optimizer's state now, so a checkpoint restores its slots too.
        with self.strategy.scope():
            bundle.optimizer.build(model.trainable_variables)
        strategy_ = self.strategy

        @tf.autograph.experimental.do_not_convert
        def step(x: Any, y: Any, sample_weight: Any) -> tuple[tf.Tensor, tf.Tensor]:
            loss, ok = strategy_.run(keras_train_step, args=(model, x, y, sample_weight))
            loss = strategy_.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)
            return loss, strategy_.experimental_local_results(ok)[0]

        @tf.autograph.experimental.do_not_convert
        def evaluate(x: Any, y: Any, sample_weight: Any) -> None:
            strategy_.run(keras_test_step, args=(model, x, y, sample_weight))

        self._meta_names: tuple[str, ...] | None = None
        # With --jit-compile each step of a call is the XLA-compiled step, as with one a call.
        inner = tf.function(step, jit_compile=True) if jit_compile else step

        @tf.autograph.experimental.do_not_convert
        def steps(iterator: Any, limit: tf.Tensor, max_wait: tf.Tensor) -> tuple[tf.Tensor, ...]:
            """Up to ``limit`` steps on the iterator's next batches, in one call (Keras'
            ``steps_per_execution``): each step is ``step`` (Keras' train_step, gated on
            finiteness). It stops early, fetching nothing more, when the iterator ends, and
            after a step whose batch took more than ``max_wait`` seconds to come (a slow
            stream: its records are acknowledged now, not after ``limit`` batches). The clock
            is read around each fetch (``tf.timestamp``), so input wait and step time stay per
            step."""
            names = self._meta_names or ()
            dtypes = [iterator.element_spec[n].dtype for n in names]

            def new(dtype: tf.DType) -> tf.TensorArray:
                return tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False)

            def cond(i: tf.Tensor, ended: tf.Tensor, slow: tf.Tensor, *_: Any) -> tf.Tensor:
                go = tf.logical_not(tf.logical_or(ended, slow))
                return tf.logical_and(i < limit, go)

            def body(
                i: tf.Tensor,
                ended: tf.Tensor,
                slow: tf.Tensor,
                last: tf.Tensor,
                *arrays: tf.TensorArray,
            ) -> tuple[Any, ...]:
                with tf.control_dependencies([last]):  # after the previous step
                    t0 = tf.timestamp()
                with tf.control_dependencies([t0]):
                    opt = iterator.get_next_as_optional()
                    has = opt.has_value()
                with tf.control_dependencies([has]):
                    t1 = tf.timestamp()

                def train() -> tuple[tf.Tensor, ...]:
                    batch = dict(opt.get_value())
                    meta = [batch.pop(n) for n in names]
                    loss, ok = inner(*self.data(batch))
                    return (loss, ok, *meta)

                def none() -> tuple[tf.Tensor, ...]:
                    empty = [tf.zeros([0], d) for d in dtypes]
                    return (tf.constant(math.nan), tf.constant(False), *empty)

                # t1 feeds the predicate: the step cannot start before its clock does.
                loss, ok, *meta = tf.cond(tf.logical_and(has, t1 > 0), train, none)
                with tf.control_dependencies([loss, ok]):
                    t2 = tf.timestamp()
                losses, oks, rows, waits, took, *columns = arrays
                return (
                    i + tf.cast(has, tf.int32),
                    tf.logical_not(has),
                    tf.logical_and(has, t1 - t0 > max_wait),
                    t2,
                    losses.write(i, loss),
                    oks.write(i, ok),
                    rows.write(i, tf.shape(meta[0], out_type=tf.int64)[0]),
                    waits.write(i, t1 - t0),
                    took.write(i, t2 - t1),
                    *(c.write(i, m) for c, m in zip(columns, meta, strict=True)),
                )

            start = (
                tf.constant(0),
                tf.constant(False),
                tf.constant(False),
                tf.timestamp(),
                new(tf.float32),
                new(tf.bool),
                new(tf.int64),
                new(tf.float64),
                new(tf.float64),
                *(new(d) for d in dtypes),
            )
            loop = tf.while_loop(cond, body, start)
            count, ended, _, _, losses, oks, rows, waits, took, *columns = loop
            # The last write may be an ended fetch's (index ``count``): cut it off.
            head = [a.stack()[:count] for a in (losses, oks, rows, waits, took)]
            n = tf.reduce_sum(head[2])
            return (ended, *head, *(c.concat()[:n] for c in columns))

        eager = bool(getattr(model, "run_eagerly", False))
        self._steps = _Compiled(steps if eager else tf.function(steps), relax=False)
        self._step = _Compiled(
            step if eager else tf.function(step, jit_compile=jit_compile, reduce_retracing=True)
        )
        self._evaluate = _Compiled(
            evaluate if eager else tf.function(evaluate, reduce_retracing=True)
        )

    @property
    def model(self) -> keras.Model:
        return self.bundle.model

    def data(self, batch: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """``(x, y, sample_weight)`` of a batch, as Keras' ``train_step`` unpacks its data."""
        bundle = self.bundle
        x = {n: batch[n] for n in bundle.input_names}
        labels = bundle.labels
        y = batch[labels[0]] if len(labels) == 1 else {n: batch[n] for n in labels}
        sw = batch[bundle.weight] if bundle.weight else None
        return x, y, sw

    def step(self, batch: Mapping[str, Any]) -> StepResult:
        """One step, waiting for its result."""
        return self.dispatch(batch).result()

    def dispatch(self, batch: Mapping[str, Any]) -> StepHandle:
        """Start one step and return without waiting for the device: on a GPU the call
        returns once the step's kernels are queued, and ``StepHandle.result()`` waits for
        them (reading the loss and the verdict copies them to the host). The training loop
        fetches the next batch between the two, so the device computes while the host reads
        its input; on a CPU the step has run when this returns."""
        data = self.data(batch)
        with self.strategy.scope():
            loss, ok = self._step(data)
        return StepHandle(loss, ok)

    def run_steps(
        self,
        iterator: Any,
        limit: int,
        metadata: tuple[str, ...] = ("partition", "offset", "timestamp"),
        *,
        max_wait_seconds: float = math.inf,
    ) -> StepsResult:
        """Up to ``limit`` steps on ``iterator``'s next batches in one call of the compiled
        function (``--steps-per-execution``): fewer when the iterator ends (``ended``; no
        step: it had ended), or after a step whose batch took more than
        ``max_wait_seconds`` to come. The ``metadata`` columns (at least one) are not the
        model's: they come back, step by step.

        One call costs the main interpreter's GIL about what one step's call did (profiled),
        so ``limit`` steps cost it ``1 / limit`` as much per step. Errors of the input come as
        the iterator raises them (``tf.errors.OpError``): the steps of the call before the
        failing fetch were applied to the model, and their records are not returned."""
        if not metadata:
            raise ValueError("run_steps: name at least one metadata column (rows per step)")
        if self._meta_names is None:
            self._meta_names = metadata
        elif self._meta_names != metadata:
            raise ValueError(f"run_steps: metadata {metadata} after {self._meta_names}")
        args = (iterator, tf.constant(limit, tf.int32), tf.constant(max_wait_seconds, tf.float64))
        with self.strategy.scope():
            out = self._steps(args)
        ended, losses, oks, rows, waits, took, *columns = (t.numpy() for t in out)
        return StepsResult(
            losses.astype(np.float64),
            oks.astype(bool),
            rows.astype(np.int64),
            waits,
            took,
            dict(zip(metadata, columns, strict=True)),
            bool(ended),
        )

    def evaluate(self, batch: Mapping[str, Any]) -> None:
        """One batch of an evaluation: updates the model's loss tracker and metrics."""
        data = self.data(batch)
        with self.strategy.scope():
            self._evaluate(data)

    def metric_values(self, *, reset: bool = False) -> dict[str, float]:
        """The model's metrics since the last reset (``loss`` first); ``reset``: start anew."""
        values = metric_values(self.model)
        if reset:
            self.reset_metrics()
        return values

    def reset_metrics(self) -> None:
        self.model.reset_metrics()
