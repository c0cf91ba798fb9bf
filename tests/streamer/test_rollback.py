"""Going back to a checkpoint of this run (a lost partition's rollback): the state the run
began in (written beside the managed checkpoints) and a managed one both restore the model,
the optimizer, the step and the offsets exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamer.input.simulator import SimulatorTask
from streamer.rollback import RollbackPoint, RollbackPoints
from streamer.train.checkpoint import Checkpointer
from streamer.train.model import load_model
from streamer.train.trainer import Trainer


def _weights(bundle: object) -> list[np.ndarray]:
    return [v.numpy().copy() for v in [*bundle.model.variables, *bundle.optimizer.variables]]  # type: ignore[attr-defined]


def _perturb(bundle: object, by: float) -> None:
    for v in bundle.model.trainable_variables:  # type: ignore[attr-defined]
        v.assign(v.numpy() + by)
    bundle.optimizer.iterations.assign_add(7)  # type: ignore[attr-defined]


def test_the_start_state_and_a_managed_checkpoint_restore_exactly(tmp_path: Path) -> None:
    bundle = load_model(None, SimulatorTask().schema())
    Trainer(bundle)  # builds the optimizer's slots
    ckpt = Checkpointer(str(tmp_path / "ckpt"), bundle, topic="t")
    points = RollbackPoints()
    start = ckpt.write_copy(str(tmp_path / "ckpt" / "rollback-start" / "ckpt"), 0, {0: 5})
    points.add(RollbackPoint(start, 0, {0: 5}, start=True))
    at_start = _weights(bundle)
    _perturb(bundle, 0.5)
    managed = ckpt.save(10, {0: 50})
    points.add(RollbackPoint(managed, 10, {0: 50}))
    at_10 = _weights(bundle)
    _perturb(bundle, 0.25)  # trained past the last checkpoint

    target = points.target({0: 50})
    assert target is not None and target.path == managed
    assert ckpt.restore_path(target.path, announce=False) == (10, {0: 50})
    assert all(np.array_equal(a, b) for a, b in zip(at_10, _weights(bundle), strict=True))

    target = points.target({})  # nothing committed this run: back to its start
    assert target is not None and target.start
    assert ckpt.restore_path(target.path, announce=False) == (0, {0: 5})
    assert all(np.array_equal(a, b) for a, b in zip(at_start, _weights(bundle), strict=True))
    # The managed directory's latest is untouched by the copy: a restart never restores it.
    assert ckpt.latest == managed
