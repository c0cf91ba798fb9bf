"""Serve the newest SavedModel version of an export directory (``streamer run --export-dir``)
and predict four samples of the simulator's task; the docs' online-learning tutorial runs it::

    .venv/bin/python examples/serve_latest.py runs/online/models

TensorFlow is loaded without its start-up noise (``streamer.ops.tfstart``), so the output is
the two lines the tutorial shows.
"""

from __future__ import annotations

import os
import sys


def main(models: str) -> None:
    from streamer.ops.tfstart import load_tensorflow

    load_tensorflow()
    import numpy as np
    import tensorflow as tf

    from streamer.input.simulator import SimulatorTask

    versions = [int(v) for v in os.listdir(models) if v.isdigit()]
    if not versions:
        sys.exit(
            f"no SavedModel version in {models} yet: the worker exports every --export-every-steps"
        )
    version = max(versions)
    serve = tf.saved_model.load(f"{models}/{version}").signatures["serving_default"]
    sample = SimulatorTask().sample(4, np.random.default_rng(0))
    (pred,) = serve(x=tf.constant(sample["x"])).values()
    print("version", version, "prediction", pred.numpy().ravel().round(3))
    print("label", sample["y"].round(3))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/online/models")
