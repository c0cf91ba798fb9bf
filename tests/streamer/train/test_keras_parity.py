"""The worker's step trains a user's compiled model exactly as ``model.fit`` does.

For each model style, the same batches in the same order from the same initial weights go once
through ``Trainer.step`` and once through ``model.fit(..., shuffle=False)``; the weights must
agree to a relative difference below 1e-5 (CPU), and so must the compiled metrics.
The end-to-end comparison through ``streamer run`` and the broker is in
tests/streamer/train/test_keras_model_run.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from streamer.decode.schema import Schema
from streamer.input.simulator import RecommenderTask
from streamer.train.model import bundle_for
from streamer.train.trainer import Trainer, nonfinite_variables
from tests.streamer.train import keras_models as km

BATCH = 32
ROWS = 8 * BATCH + 7  # a short last batch, as a pass ends with


def _regression_data(weight: bool = False, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) + 0.1 * rng.normal(size=ROWS)).astype(np.float32)
    data: dict[str, Any] = {"x": x, "y": y}
    if weight:
        data["w"] = rng.uniform(0.0, 3.0, size=ROWS).astype(np.float32)
    return data


def _two_output_data() -> dict[str, Any]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(ROWS, 8)).astype(np.float32)
    return {
        "x": x,
        "price": (x[:, 0] * 3 + 1).astype(np.float32),
        "clicked": (x[:, 1] > 0).astype(np.float32),
    }


def _recommender_data() -> dict[str, Any]:
    sample = RecommenderTask().sample(ROWS, np.random.default_rng(2))
    return {
        "user": tf.constant(sample["user"]),
        "items": tf.ragged.constant([list(map(int, a)) for a in sample["items"]], dtype=tf.int64),
        "x": sample["x"],
        "y": sample["y"],
    }


def _batches(data: dict[str, Any]) -> list[dict[str, Any]]:
    return list(tf.data.Dataset.from_tensor_slices(data).batch(BATCH))


def _fit(model: keras.Model, trainer: Trainer, data: dict[str, Any]) -> Any:
    def unpack(b: dict[str, Any]) -> Any:
        x, y, sw = trainer.data(b)
        return (x, y) if sw is None else (x, y, sw)

    ds = tf.data.Dataset.from_tensor_slices(data).batch(BATCH).map(unpack)
    return model.fit(ds, epochs=1, shuffle=False, verbose=0)


def _rel_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = max(np.abs(y64).max(), 1e-12)
        worst = max(worst, float(np.abs(x64 - y64).max() / scale))
    return worst


def _compare(
    build: Callable[[Schema], keras.Model],
    schema: Schema,
    data: dict[str, Any],
) -> tuple[float, dict[str, float], dict[str, float]]:
    """(weights' relative difference, worker metrics, fit metrics)."""
    batches = _batches(data)
    keras.utils.set_random_seed(km.SEED)  # the same initial weights in both builds
    trainer = Trainer(bundle_for(build(schema), schema, "test"))
    for batch in batches:
        result = trainer.step(batch)
        assert result.applied and np.isfinite(result.loss)
    ours = trainer.metric_values()
    keras.utils.set_random_seed(km.SEED)
    reference = build(schema)
    history = _fit(reference, trainer, data)
    theirs = {k: float(v[-1]) for k, v in history.history.items()}
    diff = _rel_diff(trainer.model.get_weights(), reference.get_weights())
    # Equal update counts (a LossScaleOptimizer skips its first overflowing steps in both).
    assert trainer.model.optimizer.iterations.numpy() == reference.optimizer.iterations.numpy()
    return diff, ours, theirs


def _assert_parity(diff: float, ours: dict[str, float], theirs: dict[str, float]) -> None:
    assert diff < 1e-5, diff
    assert set(ours) == set(theirs), (ours, theirs)
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, ours, theirs)


STYLES: dict[
    str, tuple[Callable[[Schema], keras.Model], Callable[[], Schema], Callable[[], Any]]
] = {
    "string loss": (km.build_string_loss, km.schema_regression, _regression_data),
    "L2 regularizer": (km.build_regularized, km.schema_regression, _regression_data),
    "two outputs, dict loss, loss_weights": (
        km.build_two_outputs,
        km.schema_two_outputs,
        _two_output_data,
    ),
    "own train_step": (km.build_custom_train_step, km.schema_regression, _regression_data),
    "batch normalization": (km.build_batchnorm, km.schema_regression, _regression_data),
    "sample-weight feature": (
        km.build_weighted,
        lambda: km.schema_regression(weight=True),
        lambda: _regression_data(weight=True),
    ),
}


@pytest.mark.parametrize("style", list(STYLES))
def test_step_matches_model_fit(style: str) -> None:
    build, schema, data = STYLES[style]
    diff, ours, theirs = _compare(build, schema(), data())
    print(f"parity {style}: weights rel diff {diff:.2e}, metrics {ours}")
    _assert_parity(diff, ours, theirs)


def test_mixed_precision_matches_model_fit() -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        schema = km.schema_regression()
        diff, ours, theirs = _compare(km.build_string_loss, schema, _regression_data())
        model = km.build_string_loss(schema)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    print(f"parity mixed precision: weights rel diff {diff:.2e}")
    _assert_parity(diff, ours, theirs)


def test_recommender_with_ragged_and_string_inputs_matches_model_fit() -> None:
    from examples.recommender import build

    schema = RecommenderTask().schema()
    diff, ours, theirs = _compare(build, schema, _recommender_data())
    print(f"parity recommender: weights rel diff {diff:.2e}")
    _assert_parity(diff, ours, theirs)


def test_string_loss_with_dense1_head_no_longer_crashes_and_keeps_shapes() -> None:
    """The reported crash: ``loss="mse"``, a ``[batch, 1]`` head, a scalar label."""
    schema = km.schema_regression()
    trainer = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
    result = trainer.step(_batches(_regression_data())[0])
    assert isinstance(result.loss, float) and result.applied


def test_sample_weight_is_never_an_input() -> None:
    schema = km.schema_regression(weight=True)
    bundle = bundle_for(km.build_weighted(schema), schema, "test")
    assert bundle.input_names == ("x",) and bundle.weight == "w" and bundle.labels == ("y",)


def test_sample_weight_zero_rows_change_nothing() -> None:
    """Rows of weight 0 contribute nothing: two batches that differ only there train alike."""
    schema = km.schema_regression(weight=True)
    data = _regression_data(weight=True)
    data["w"][::2] = 0.0
    other = {k: v.copy() for k, v in data.items()}
    other["y"][::2] = 1e3  # only rows of weight 0 differ
    out = []
    for d in (data, other):
        trainer = Trainer(bundle_for(km.build_weighted(schema), schema, "test"))
        for batch in _batches(d):
            trainer.step(batch)
        out.append(trainer.model.get_weights())
    assert _rel_diff(out[0], out[1]) < 1e-6


# -- non-finite steps -------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["string loss", "own train_step", "batch normalization"])
def test_a_nonfinite_batch_is_not_applied(style: str) -> None:
    """Nothing changes: weights, optimizer state, BatchNormalization's moving statistics."""
    build, schema_fn, data_fn = STYLES[style]
    schema = schema_fn()
    trainer = Trainer(bundle_for(build(schema), schema, "test"))
    batches = _batches(data_fn())
    trainer.step(batches[0])
    before = [w.copy() for w in trainer.model.get_weights()]
    iterations = int(trainer.model.optimizer.iterations.numpy())
    poisoned = dict(batches[1])
    x = poisoned["x"].numpy().copy()
    x[3, 2] = np.inf  # reaches the forward pass (and BatchNormalization's statistics)
    poisoned["x"] = tf.constant(x)
    result = trainer.step(poisoned)
    assert not result.applied
    after = trainer.model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert int(trainer.model.optimizer.iterations.numpy()) == iterations
    assert not nonfinite_variables(trainer.model.variables)
    assert trainer.step(batches[2]).applied  # and training goes on


def test_a_nonfinite_batch_leaves_the_compiled_metrics_alone() -> None:
    schema = km.schema_regression()
    trainer = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
    batches = _batches(_regression_data())
    trainer.step(batches[0])
    good = trainer.metric_values()
    poisoned = dict(batches[1])
    x = poisoned["x"].numpy().copy()
    x[0, 0] = np.inf
    poisoned["x"] = tf.constant(x)
    assert not trainer.step(poisoned).applied
    assert trainer.metric_values() == good


def test_mixed_precision_nonfinite_loss_skips_without_touching_the_loss_scale() -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        schema = km.schema_regression()
        trainer = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
        batches = _batches(_regression_data())
        trainer.step(batches[0])
        scale = float(trainer.model.optimizer.dynamic_scale.numpy())
        poisoned = dict(batches[1])
        y = poisoned["y"].numpy().copy()
        y[0] = np.nan
        poisoned["y"] = tf.constant(y)
        assert not trainer.step(poisoned).applied
        assert float(trainer.model.optimizer.dynamic_scale.numpy()) == scale
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_nonfinite_variables_names_the_culprits() -> None:
    good = tf.Variable([1.0, 2.0], name="good")
    bad = tf.Variable([[1.0, float("inf")]], name="bad")
    ids = tf.Variable([1, 2], name="ids")
    assert nonfinite_variables([good, bad, ids]) == ["bad:0"]


def test_padding_as_keras_sample_weights_equals_the_mean_over_real_rows() -> None:
    """The multi-worker weighting (streamer/cluster/strategy.py): padding rows get weight 0 and the real
    ones B·N/R, so Keras' mean over the batch is the mean over the R real rows, as the
    hand-written step of earlier versions computed it (here with N = 1)."""
    from streamer.train.trainer import keras_train_step

    schema = km.schema_regression()
    data = _regression_data()
    x, y = data["x"][:BATCH], data["y"][:BATCH]
    real = 20
    weight = np.zeros(BATCH, np.float32)
    weight[:real] = 1.0
    keras.utils.set_random_seed(km.SEED)
    padded = km.build_string_loss(schema)
    step = tf.function(lambda x, y, w: keras_train_step(padded, {"x": x}, y, w * (BATCH / real)))
    step(x, y, weight)
    keras.utils.set_random_seed(km.SEED)
    reference = km.build_string_loss(schema)
    reference.fit({"x": x[:real]}, y[:real], batch_size=real, epochs=1, shuffle=False, verbose=0)
    assert _rel_diff(padded.get_weights(), reference.get_weights()) < 1e-6


# -- several steps per call (--steps-per-execution) ---------------------------------------------

META = ("partition", "offset", "timestamp")


def _with_metadata(data: dict[str, Any]) -> dict[str, Any]:
    rows = ROWS
    return {
        **data,
        "partition": np.arange(rows, dtype=np.int32) % 3,
        "offset": np.arange(rows, dtype=np.int64),
        "timestamp": np.arange(rows, dtype=np.int64) * 10,
    }


@pytest.mark.parametrize(
    "style", ["string loss", "own train_step", "sample-weight feature", "recommender"]
)
def test_steps_per_execution_matches_model_fit_with_the_same_setting(style: str) -> None:
    """``Trainer.run_steps`` (batches taken in the graph, 4 steps a call) trains as
    ``model.fit(..., steps_per_execution=4)`` does, and hands back each step's rows."""
    if style == "recommender":
        from examples.recommender import build

        schema, data = RecommenderTask().schema(), _recommender_data()
    else:
        build, schema_fn, data_fn = STYLES[style]
        schema, data = schema_fn(), data_fn()
    keras.utils.set_random_seed(km.SEED)
    trainer = Trainer(bundle_for(build(schema), schema, "test"))
    iterator = iter(tf.data.Dataset.from_tensor_slices(_with_metadata(data)).batch(BATCH))
    results = []
    while True:
        out = trainer.run_steps(iterator, 4, META)
        results.append(out)
        if out.steps < 4:
            break
    assert [r.steps for r in results] == [4, 4, 1]  # 9 batches; the last call ends early
    assert [r.ended for r in results] == [False, False, True]
    assert all(r.applied.all() and np.isfinite(r.losses).all() for r in results)
    offsets = np.concatenate([r.columns["offset"] for r in results])
    assert offsets.tolist() == list(range(ROWS))  # every row once, in order
    last = results[-1]
    assert last.rows.tolist() == [ROWS - 8 * BATCH]
    assert last.step_columns(0)["timestamp"].tolist() == [10 * o for o in range(8 * BATCH, ROWS)]
    assert all((r.input_wait_seconds >= 0).all() and (r.step_seconds >= 0).all() for r in results)
    ours = trainer.metric_values()

    keras.utils.set_random_seed(km.SEED)
    reference = build(schema)
    reference.steps_per_execution = 4  # what compile(steps_per_execution=4) sets
    history = _fit(reference, trainer, data)
    theirs = {k: float(v[-1]) for k, v in history.history.items()}
    _assert_parity(_rel_diff(trainer.model.get_weights(), reference.get_weights()), ours, theirs)
    assert trainer.model.optimizer.iterations.numpy() == reference.optimizer.iterations.numpy()


def test_a_nonfinite_step_among_several_is_skipped_alone() -> None:
    schema = km.schema_regression()
    data = _with_metadata(_regression_data())
    data["x"][BATCH + 3, 2] = np.inf  # the second batch
    keras.utils.set_random_seed(km.SEED)
    trainer = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
    iterator = iter(tf.data.Dataset.from_tensor_slices(data).batch(BATCH))
    out = trainer.run_steps(iterator, 3, META)
    assert out.applied.tolist() == [True, False, True]
    assert out.step_columns(1)["offset"].tolist() == list(range(BATCH, 2 * BATCH))
    assert int(trainer.model.optimizer.iterations.numpy()) == 2
    assert not nonfinite_variables(trainer.model.variables)
    # The same two good batches one step at a time give the same weights.
    keras.utils.set_random_seed(km.SEED)
    single = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
    for i, batch in enumerate(tf.data.Dataset.from_tensor_slices(data).batch(BATCH).take(3)):
        b = {k: v for k, v in batch.items() if k not in META}
        assert single.step(b).applied == (i != 1)
    assert _rel_diff(trainer.model.get_weights(), single.model.get_weights()) == 0.0


def _slowed(seconds: float) -> Callable[[dict[str, tf.Tensor]], dict[str, tf.Tensor]]:
    """A map that makes each batch take ``seconds`` to come (a slow input)."""

    def slow(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        def pause(x: Any) -> Any:
            time.sleep(seconds)
            return x

        offset = tf.py_function(pause, [batch["offset"]], tf.int64)
        offset.set_shape([None])
        return {**batch, "offset": offset}

    return slow


def test_steps_per_execution_reads_input_wait_and_step_time_per_step() -> None:
    """The clock is read around each fetch inside the graph: an input that takes 20 ms a batch
    shows as 20 ms of input wait on every step, not as step time."""
    schema = km.schema_regression()
    data = _with_metadata(_regression_data())

    trainer = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(BATCH).map(_slowed(0.02))
    # No prefetch injected after the map: it would prepare the next batch while the previous
    # call returns, and the first step of the next call would wait less (16 ms, once in CI).
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    iterator = iter(dataset.with_options(options))
    trainer.run_steps(iterator, 1, META)  # traced here
    out = trainer.run_steps(iterator, 6, META)
    assert out.steps == 6 and not out.ended
    assert (out.input_wait_seconds >= 0.018).all(), out.input_wait_seconds
    # A step of this small model takes well under a millisecond; the median leaves room for
    # a loaded machine's hiccups.
    assert np.median(out.step_seconds) < 0.25 * np.median(out.input_wait_seconds), out


def test_a_call_of_several_steps_ends_after_a_slow_batch() -> None:
    """On a slow stream a call does not wait for all its batches: it ends after a step whose
    batch took longer than ``max_wait_seconds`` (its records are acknowledged now), and the
    iterator has not ended."""
    schema = km.schema_regression()
    data = _with_metadata(_regression_data())

    trainer = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
    iterator = iter(tf.data.Dataset.from_tensor_slices(data).batch(BATCH).map(_slowed(0.03)))
    out = trainer.run_steps(iterator, 8, META, max_wait_seconds=0.01)
    assert out.steps == 1 and not out.ended, out
    out = trainer.run_steps(iterator, 8, META, max_wait_seconds=1.0)
    assert out.steps == 8 and not out.ended, out  # batches 2-9 of 9: the input is not over yet
    out = trainer.run_steps(iterator, 8, META, max_wait_seconds=1.0)
    assert out.steps == 0 and out.ended


def test_a_call_that_fails_part_way_has_applied_the_steps_before_the_failure() -> None:
    """What the worker's ``_untracked`` flag is for: the input fails at the third batch of a
    call; the first two steps were applied and no result comes back, so the worker writes no
    checkpoint from that model (``Worker._run_steps``)."""
    schema = km.schema_regression()
    data = _with_metadata(_regression_data())

    def fail_third(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        first = batch["offset"][0]
        tf.debugging.assert_less(first, tf.constant(2 * BATCH, tf.int64), "input broke")
        return batch

    trainer = Trainer(bundle_for(km.build_string_loss(schema), schema, "test"))
    iterator = iter(tf.data.Dataset.from_tensor_slices(data).batch(BATCH).map(fail_third))
    with pytest.raises(tf.errors.InvalidArgumentError, match="input broke"):
        trainer.run_steps(iterator, 4, META)
    assert int(trainer.model.optimizer.iterations.numpy()) == 2
