"""The training loop reads the next batch while a step is in flight, and never reads a step's
result (which waits for the device) before that batch is in hand; a checkpoint still holds
exactly the steps acknowledged. Runs the real worker on the embedded simulator; the wrappers
below only note the order of the real calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from streamer.input.source import StreamSource
from streamer.train.trainer import StepHandle, Trainer
from tests.workerutil import run_in_process

STEPS = 12
BATCH = 64


@pytest.mark.timeout(180)
def test_the_next_batch_is_read_while_a_step_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    dispatch, result, next_batch = Trainer.dispatch, StepHandle.result, StreamSource.next_batch

    def noted_dispatch(self: Trainer, batch: Any) -> StepHandle:
        events.append("dispatch")
        return dispatch(self, batch)

    def noted_result(self: StepHandle) -> Any:
        events.append("result")
        return result(self)

    def noted_next(self: StreamSource, *args: Any, **kwargs: Any) -> Any:
        out = next_batch(self, *args, **kwargs)
        events.append("batch" if out is not None else "end")
        return out

    monkeypatch.setattr(Trainer, "dispatch", noted_dispatch)
    monkeypatch.setattr(StepHandle, "result", noted_result)
    monkeypatch.setattr(StreamSource, "next_batch", noted_next)
    ckpt = tmp_path / "ckpt"
    code, worker, log = run_in_process(
        max_steps=STEPS, batch_size=BATCH, checkpoint_dir=str(ckpt), checkpoint_every_steps=5
    )
    assert code == 0, log
    assert worker.step == STEPS
    # Step k's result is read only after batch k+1 is in hand, and before step k+1 starts.
    assert events[:2] == ["batch", "dispatch"], events
    body = events[2 : 2 + 3 * (STEPS - 1)]
    assert body == ["batch", "result", "dispatch"] * (STEPS - 1), events
    # --max-steps: the last step is settled, the batch read after it is not trained.
    assert events[2 + 3 * (STEPS - 1) :] == ["batch", "result"], events
    assert events.count("dispatch") == events.count("result") == STEPS
    # The final checkpoint holds the model of exactly STEPS steps and their records.
    latest = tf.train.latest_checkpoint(str(ckpt))
    assert latest is not None and latest.endswith(f"ckpt-{STEPS}"), latest
    assert worker.tracker.commit_points() and sum(
        worker.tracker.commit_points().values()
    ) == STEPS * BATCH, worker.tracker.commit_points()
