"""On an accelerator the training loop reads the next batch while a step is in flight, and
reads a step's result (a wait for the device) only once that batch is in hand; on a CPU (where
a step has finished when its call returns) each step is settled at once. Either way a
checkpoint holds exactly the steps acknowledged. Runs the real worker on the embedded
simulator; the wrappers below only note the order of the real calls."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from streamer.input.source import StreamSource
from streamer.train.trainer import StepHandle, Trainer
from streamer.worker import Worker
from tests.workerutil import run_in_process

STEPS = 12
BATCH = 64


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, overlap: bool
) -> tuple[list[str], Any]:
    """Run the worker for STEPS steps with checkpoints; the order of its real calls."""
    events: list[str] = []
    dispatch, result, next_batch = Trainer.dispatch, StepHandle.result, StreamSource.next_batch
    build = Worker._build

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

    def built(self: Worker) -> Any:
        parts = build(self)
        assert self.overlap_steps is False  # no GPU here: settle every step at once
        self.overlap_steps = overlap  # as on an accelerator
        return parts

    monkeypatch.setattr(Trainer, "dispatch", noted_dispatch)
    monkeypatch.setattr(StepHandle, "result", noted_result)
    monkeypatch.setattr(StreamSource, "next_batch", noted_next)
    monkeypatch.setattr(Worker, "_build", built)
    ckpt = tmp_path / "ckpt"
    code, worker, log = run_in_process(
        max_steps=STEPS, batch_size=BATCH, checkpoint_dir=str(ckpt), checkpoint_every_steps=5
    )
    assert code == 0, log
    assert worker.step == STEPS
    assert events.count("dispatch") == events.count("result") == STEPS, events
    # The final checkpoint holds the model of exactly STEPS steps and their records.
    latest = tf.train.latest_checkpoint(str(ckpt))
    assert latest is not None and latest.endswith(f"ckpt-{STEPS}"), latest
    points = worker.built.tracker.commit_points()
    assert sum(points.values()) == STEPS * BATCH, points
    return events, worker


@pytest.mark.timeout(180)
def test_on_a_cpu_every_step_is_settled_before_the_next_batch_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, _ = _run(tmp_path, monkeypatch, overlap=False)
    assert events == ["batch", "dispatch", "result"] * STEPS, events


@pytest.mark.timeout(180)
def test_on_an_accelerator_the_next_batch_is_read_while_a_step_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, _ = _run(tmp_path, monkeypatch, overlap=True)
    calls = [e for e in events if e != "end"]
    # At most one step in flight: a result between any two dispatches.
    starts = [i for i, e in enumerate(calls) if e == "dispatch"]
    for a, b in itertools.pairwise(starts):
        assert calls[a + 1 : b].count("result") == 1, calls
    # Steps whose batch came promptly were settled after the next batch was read...
    overlapped = sum(1 for i in starts if calls[i + 1 : i + 3] == ["batch", "result"])
    assert overlapped >= STEPS // 2, calls
    # ...and the step that reaches --max-steps at once: no batch is read after it.
    assert calls[-2:] == ["dispatch", "result"], calls
