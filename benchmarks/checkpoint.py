"""What a checkpoint costs, and what a checkpoint cadence costs and saves after ``kill -9``.

Run from the repository root: ``python benchmarks/checkpoint.py [--big-mb 100]``.

For the built-in model and for a model of about ``--big-mb`` MB of weights (an embedding table
plus the built-in MLP), with the worker's own ``Checkpointer`` (model + Adam slots + step +
offsets, ``--checkpoint-keep 3``): the median time of a save and the bytes one checkpoint
holds, and the median training step on a batch of 256 simulator samples. Then, for candidate
cadences (every N steps or T seconds, whichever comes first): the share of training time spent
checkpointing, and the records a ``kill -9`` at a random moment retrains on average (half an
interval) and at most (a whole one), at the step rate measured here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from streamer.ops.tfstart import load_tensorflow

load_tensorflow()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from streamer.input.simulator import SimulatorTask  # noqa: E402
from streamer.train.checkpoint import Checkpointer  # noqa: E402
from streamer.train.model import ModelBundle, load_model  # noqa: E402
from streamer.train.trainer import Trainer  # noqa: E402

BATCH = 256
CADENCES = (
    (1000, 300.0),
    (1000, 60.0),
    (1000, 30.0),
    (2000, 30.0),
    (5000, 30.0),
    (5000, 60.0),
    (200, 10.0),
)


def big_model(mb: float) -> ModelBundle:
    """The built-in MLP plus an embedding table of ``mb`` MB, looked up by a hash of ``x``."""
    rows = int(mb * 1e6 / 4 / 16)
    x = keras.Input(shape=(16,), dtype="float32", name="x")
    ids = keras.layers.Lambda(
        lambda t: keras.ops.mod(keras.ops.cast(keras.ops.abs(t[:, 0]) * 1e5, "int32"), rows)
    )(x)
    emb = keras.layers.Embedding(rows, 16)(ids)
    h = keras.layers.Concatenate()([x, emb])
    h = keras.layers.Dense(64, activation="relu")(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    out = keras.layers.Dense(1)(h)  # [batch, 1], as the built-in head
    model = keras.Model(inputs={"x": x}, outputs=out)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return ModelBundle(model, ("x",), ("y",))


def measure(name: str, bundle: ModelBundle, saves: int, steps: int) -> dict[str, float]:
    trainer = Trainer(bundle)
    sample = SimulatorTask().sample(BATCH, np.random.default_rng(0))
    batch = {k: tf.constant(v) for k, v in sample.items()}
    for _ in range(5):
        trainer.step(batch)  # trace and warm up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.step(batch)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in bundle.model.weights)
    offsets = {p: 1_000_000 + p for p in range(12)}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        ckpt = Checkpointer(tmp, bundle, topic="bench", keep=3)
        ckpt.save(0, offsets)  # the first save builds the save graph
        save_times = []
        for i in range(1, saves + 1):
            t0 = time.perf_counter()
            path = ckpt.save(i, offsets)
            save_times.append(time.perf_counter() - t0)
        size = sum(
            os.path.getsize(os.path.join(tmp, f))
            for f in os.listdir(tmp)
            if f.startswith(os.path.basename(path) + ".")
        )
        t0 = time.perf_counter()
        Checkpointer(tmp, bundle, topic="bench").restore()
        restore_s = time.perf_counter() - t0
    return {
        "name": name,  # type: ignore[dict-item]
        "weights_mb": weights / 1e6,
        "checkpoint_mb": size / 1e6,
        "save_s": statistics.median(save_times),
        "save_max_s": max(save_times),
        "restore_s": restore_s,
        "step_s": step_s,
    }


def cadence_rows(m: dict[str, float]) -> list[str]:
    rows = []
    for steps, seconds in CADENCES:
        interval = min(steps * m["step_s"], seconds)  # training time between two checkpoints
        overhead = m["save_s"] / (interval + m["save_s"])
        records = interval / m["step_s"] * BATCH
        rows.append(
            f"| {m['name']} | {steps} steps or {seconds:g} s | {interval:6.1f} s | "
            f"{overhead:6.2%} | {records / 2:>10,.0f} | {records:>10,.0f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-mb", type=float, default=100.0, help="weights of the big model")
    parser.add_argument("--saves", type=int, default=7, help="saves per model (median)")
    parser.add_argument(
        "--steps", type=int, default=None, help="steps timed per model [default: 300 and 30]"
    )
    args = parser.parse_args()
    schema = SimulatorTask().schema()
    results = [
        measure("built-in MLP", load_model(None, schema), args.saves, args.steps or 300),
        measure(
            f"{args.big_mb:g} MB embedding", big_model(args.big_mb), args.saves, args.steps or 30
        ),
    ]
    print(
        "| model | weights | checkpoint on disk | save (median / max) | restore | step (batch 256) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for m in results:
        print(
            f"| {m['name']} | {m['weights_mb']:.2f} MB | {m['checkpoint_mb']:.2f} MB | "
            f"{m['save_s'] * 1000:.0f} / {m['save_max_s'] * 1000:.0f} ms | "
            f"{m['restore_s'] * 1000:.0f} ms | {m['step_s'] * 1000:.2f} ms |"
        )
    print()
    print(
        "| model | cadence | training between checkpoints | checkpoint share | "
        "retrained after kill -9: mean | max |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for m in results:
        for row in cadence_rows(m):
            print(row)


if __name__ == "__main__":
    main()
