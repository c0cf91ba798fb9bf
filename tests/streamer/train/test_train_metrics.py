"""The compiled metrics reach Prometheus and the status line, and ``--sample-weight`` names the
feature Keras gets as ``sample_weight`` (never a model input). Runs the real worker in this
process on the embedded simulator (random records of a schema file for the second)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from consumers.errors import ConfigError
from streamer.config import load_config
from tests.workerutil import run_in_process

SCHEMA = """
label = "y"

[features.x]
dtype = "float32"
shape = [8]

[features.w]
dtype = "float32"

[features.y]
dtype = "float32"
"""


@pytest.mark.timeout(180)
def test_the_compiled_metrics_reach_prometheus_and_the_status_line() -> None:
    code, worker, log = run_in_process(max_steps=40, status_interval=0.05)
    assert code == 0, log
    value = worker.metrics.registry.get_sample_value("streamer_train_metric", {"metric": "mae"})
    assert value is not None and math.isfinite(value) and value > 0, value
    shown = [
        float(m) for m in re.findall(r"^streamer\.ops\.status: progress .* mae=(\S+)", log, re.M)
    ]
    assert shown and all(math.isfinite(v) for v in shown), log
    assert all(v > 0 for v in shown), log
    # A report with no step since the last one (a pass that ended idle, the stop) leaves the
    # figures as they are: Keras' metrics read 0 after a reset, a false figure.
    worker.reports.report(worker.step)
    after = worker.metrics.registry.get_sample_value("streamer_train_metric", {"metric": "mae"})
    assert after == value, (after, value)


@pytest.mark.timeout(180)
def test_sample_weight_names_the_feature_keras_weights_by(tmp_path: Path) -> None:
    schema = tmp_path / "weighted.toml"
    schema.write_text(SCHEMA)
    code, worker, log = run_in_process(
        schema=str(schema),
        sample_weight="w",
        model="tests.streamer.train.keras_models:build_weighted",
        max_steps=10,
        status_interval=0.05,
    )
    assert code == 0, log
    bundle = worker.built.bundle
    assert bundle.weight == "w" and bundle.input_names == ("x",) and bundle.labels == ("y",)
    batch = {
        "x": np.zeros((2, 8), np.float32),
        "w": np.array([0.5, 2.0], np.float32),
        "y": np.zeros(2),
    }
    _x, _y, sw = worker.built.steps.data(batch)
    assert sw is batch["w"]
    assert math.isfinite(worker.loss)
    # A name that is not a scalar feature of the schema is a setting error, named.
    with pytest.raises(ConfigError, match="sample_weight='x': a numeric scalar feature"):
        load_config({"schema": str(schema), "sample_weight": "x"}, env={})


@pytest.mark.timeout(180)
def test_the_readme_example_model_trains_and_its_loss_falls() -> None:
    """``examples/keras_model.py`` (docs/tutorials/your-model.md): compiled the ordinary Keras way, a
    string loss and metric and an L2 regularizer, trained on the simulator."""
    code, worker, log = run_in_process(
        model="examples.keras_model:build", max_steps=300, status_interval=0.05, seed=7
    )
    assert code == 0, log
    losses = [float(v) for v in re.findall(r"progress step=\d+ .*? loss=(\S+)", log)]
    assert len(losses) >= 2 and losses[-1] < 0.5 * losses[0], losses
    assert worker.built.bundle.model.losses, "the L2 regularizer's loss is part of the model"
