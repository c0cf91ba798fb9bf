"""The hand-over filter (streamer.input.handover) alone, on a real tf.data pipeline: rows of an
ended assignment never reach training, and a revocation waits for what was handed."""

from __future__ import annotations

import threading
import time

import numpy as np
import tensorflow as tf

from streamer.input.handover import EPOCH, HandOver


def _batches(rows: list[tuple[int, int, int]], size: int) -> tf.data.Dataset:
    p, o, e = (np.array(c, np.int64) for c in zip(*rows, strict=True))
    ds = tf.data.Dataset.from_tensor_slices(
        {"partition": p.astype(np.int32), "offset": o, EPOCH: e, "x": o.astype(np.float32)}
    )
    return ds.batch(size)


def test_rows_of_an_ended_assignment_are_dropped_and_the_column_removed() -> None:
    h = HandOver(ordered=True)
    h.assign({0: 1, 1: 1})
    h.assign({1: 2})  # partition 1 came back: its epoch-1 rows are stale copies
    rows = [(0, 10, 1), (1, 20, 1), (1, 21, 1), (1, 20, 2), (1, 21, 2), (7, 5, 0)]
    out = list(h.attach(_batches(rows, 3)))
    got = [(int(p), int(o)) for b in out for p, o in zip(b["partition"], b["offset"], strict=True)]
    assert got == [(0, 10), (1, 20), (1, 21), (7, 5)]  # 7: never assigned, epoch 0
    assert all(EPOCH not in b for b in out)
    assert h.dropped == 2


def test_a_revocation_waits_for_the_records_handed_and_drops_the_rest() -> None:
    h = HandOver(ordered=True, wait_seconds=5.0)
    h.assign({0: 1})
    it = iter(h.attach(_batches([(0, o, 1) for o in range(100)], 10)))
    first = next(it)  # offsets 0..9 handed to "training", not trained yet
    done = {"point": 0}

    def train() -> None:
        time.sleep(0.3)
        done["point"] = int(first["offset"][-1]) + 1  # the tracker's point after the ack

    trainer = threading.Thread(target=train)
    trainer.start()
    t0 = time.monotonic()
    h.release([0], lambda p: done["point"])
    waited = time.monotonic() - t0
    trainer.join()
    assert 0.2 < waited < 4.0  # it waited for the step, not for its bound
    rest = list(it)
    assert sum(len(b["offset"]) for b in rest) == 0  # nothing more of the partition
    assert h.dropped == 90


def test_a_revocation_after_the_trainer_left_does_not_wait() -> None:
    """The pass is closing (a sibling shard's leave rebalances this one): nothing handed is
    trained any more, so the revocation blocks the partition and answers at once."""
    h = HandOver(ordered=True, wait_seconds=5.0)
    h.assign({0: 1})
    it = iter(h.attach(_batches([(0, o, 1) for o in range(100)], 10)))
    next(it)  # offsets 0..9 handed, never trained
    h.training = False
    t0 = time.monotonic()
    h.release([0], lambda p: 0)
    assert time.monotonic() - t0 < 1.0  # not its 5 s bound
    assert sum(len(b["offset"]) for b in it) == 0  # blocked all the same
