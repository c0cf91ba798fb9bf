"""One model on N workers (MultiWorkerMirroredStrategy): the pure parts alone, then 2 worker
processes on localhost (CPU) against the real broker, judged from the outside: audit logs,
the group's commits, checkpoints, logs (every worker logs a CRC of its weights at each
checkpoint and at restore), /metrics and /healthz.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from consumers.errors import ConfigError
from streamer.config import load_config
from streamer.multiworker import (
    Control,
    decide,
    lost_worker,
    offsets_from_vector,
    offsets_vector,
    tf_config,
    topology_from,
    worker_partitions,
)
from streamer.padding import END, PaddedBatcher
from streamer.ragged import RaggedColumn
from streamer.schema import Schema
from streamer.simulator import SimulatorTask
from tests.workerutil import (
    ROOT,
    WorkerProcess,
    all_records,
    committed_offsets,
    end_offsets,
    free_port,
    http_get,
    parse_metrics,
    read_audit,
    summarize,
)

# ---- the pure parts ---------------------------------------------------------------------------


def test_tf_config_with_a_chief_and_workers() -> None:
    cfg = {
        "cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]},
        "task": {"type": "worker", "index": 1},
    }
    t = topology_from({"TF_CONFIG": json.dumps(cfg)})
    assert t is not None
    assert (t.index, t.count, t.chief, t.hosts) == (2, 3, False, ("c:1", "w:1", "w:2"))
    chief = topology_from({"TF_CONFIG": json.dumps({**cfg, "task": {"type": "chief"}})})
    assert chief is not None and chief.chief and chief.index == 0


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker"}}),
        json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}),
        json.dumps({"cluster": {"worker": ["a:1"]}}),
        json.dumps({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}}),
    ],
)
def test_bad_tf_config_is_a_config_error_naming_tf_config(text: str) -> None:
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        topology_from({"TF_CONFIG": text})


def test_cluster_workers_take_the_index_from_the_option_or_the_job() -> None:
    hosts = "h0:2222,h1:2222,h2:2222"
    t = topology_from({}, cluster_workers=hosts, worker_index=1)
    assert t is not None and t.describe() == "worker 1 of 3" and t.hosts[1] == "h1:2222"
    job = topology_from({"JOB_COMPLETION_INDEX": "2"}, cluster_workers=hosts)
    assert job is not None and job.index == 2
    with pytest.raises(ConfigError, match="worker_index"):
        topology_from({}, cluster_workers=hosts)
    with pytest.raises(ConfigError, match="worker_index"):
        topology_from({}, cluster_workers=hosts, worker_index=3)
    with pytest.raises(ConfigError, match="TF_CONFIG is set too"):
        topology_from({"TF_CONFIG": tf_config(["a:1", "b:1"], 0)}, cluster_workers=hosts)
    with pytest.raises(ConfigError, match="cluster_workers"):
        topology_from({}, cluster_workers="h0,h1", worker_index=0)
    assert topology_from({}) is None


@pytest.mark.parametrize(("partitions", "workers"), [(6, 2), (7, 3), (4, 4), (12, 5)])
def test_every_partition_has_exactly_one_worker(partitions: int, workers: int) -> None:
    shares = [worker_partitions(range(partitions), i, workers) for i in range(workers)]
    assert sorted(p for share in shares for p in share) == list(range(partitions))
    assert all(share == [p for p in range(partitions) if p % workers == i] for i, share in enumerate(shares))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_offsets_vector_sums_to_every_partition() -> None:
    per_worker = [{0: 10, 2: 0}, {1: 7, 3: 123_456_789_012}]
    total = sum(offsets_vector(o, 4) for o in per_worker)
    assert offsets_from_vector(total) == {0: 10, 1: 7, 2: 0, 3: 123_456_789_012}


def _ctrl(**kw: object) -> np.ndarray:
    base = dict(real=0, stop=False, done=False, checkpoint=False, full=False, loss_sum=0.0)
    base.update(kw)
    return Control.local(**base)  # type: ignore[arg-type]


def test_round_decisions_are_functions_of_the_all_reduced_vector() -> None:
    def d(ctrl: np.ndarray, **kw: object) -> object:
        args: dict[str, object] = dict(
            workers=2,
            step=10,
            last_checkpoint_step=0,
            checkpoint_every_steps=100,
            max_steps=None,
            stopping_here=None,
            stop_after_idle=None,
        )
        args.update(kw)
        return decide(ctrl, **args)  # type: ignore[arg-type]

    busy = _ctrl(real=256, full=True) + _ctrl(real=0)
    r = d(busy)
    assert (r.train, r.global_rows, r.stop, r.checkpoint, r.others_busy) == (  # type: ignore[attr-defined]
        True, 256, None, False, True
    )  # fmt: skip
    # One worker idle for --stop-after-idle: the cluster goes on; both idle: it stops.
    assert d(_ctrl(done=True) + _ctrl(real=3), stop_after_idle=5.0).stop is None  # type: ignore[attr-defined]
    both = d(_ctrl(done=True) + _ctrl(done=True), stop_after_idle=5.0)
    assert both.stop == "idle for 5s" and both.checkpoint  # type: ignore[attr-defined]
    # A stop asked of one worker: the others read who stopped them; a checkpoint first.
    stop = _ctrl(stop=True) + _ctrl()
    assert d(stop, stopping_here="signal SIGTERM").stop == "signal SIGTERM"  # type: ignore[attr-defined]
    assert d(stop).stop == "another worker was stopped"  # type: ignore[attr-defined]
    assert d(stop).checkpoint  # type: ignore[attr-defined]
    # No checkpoint when the step did not move since the last one, even at a stop.
    assert not d(stop, last_checkpoint_step=10).checkpoint  # type: ignore[attr-defined]
    assert d(_ctrl(checkpoint=True) + _ctrl()).checkpoint  # type: ignore[attr-defined]
    assert d(_ctrl(), step=100).checkpoint  # type: ignore[attr-defined]
    assert d(_ctrl(), max_steps=10).stop == "--max-steps 10"  # type: ignore[attr-defined]


def test_lost_worker_is_read_from_tensorflows_message() -> None:
    t = topology_from({"TF_CONFIG": tf_config(["a:1", "b:1", "c:1"], 1)})
    assert t is not None
    heartbeat = (
        "Collective ops is aborted by: Error reported from /job:worker/task:0: The following "
        "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:2"
    )
    assert lost_worker(heartbeat, t) == "worker 0"  # the first other task it names
    refused = "failed to connect ... remote target /job:worker/replica:0/task:0 while calling"
    assert lost_worker(refused, t) == "worker 0"
    assert lost_worker("no task named", t) == "a peer"


# ---- padding ------------------------------------------------------------------------------------

SCHEMA = SimulatorTask().schema()


def block(part: int, offsets: range, x0: float = 1.0) -> list[object]:
    n = len(offsets)
    x = np.full((n, 16), x0, np.float32) + np.arange(n, dtype=np.float32)[:, None]
    return [
        x,
        np.arange(n, dtype=np.float32),
        np.full(n, part, np.int32),
        np.asarray(offsets, np.int64),
        np.full(n, 1000, np.int64),
    ]


def test_batches_are_exactly_batch_size_rows_and_carry_the_rest() -> None:
    q: queue.Queue[object] = queue.Queue()
    b = PaddedBatcher(SCHEMA, 4, pad_after=5.0)
    q.put(block(0, range(0, 3)))
    q.put(block(1, range(100, 106)))
    first = b.next(q)
    assert (first.real, first.padded) == (4, 0)
    assert first.metadata()[1].tolist() == [0, 1, 2, 100]
    second = b.next(q)
    assert second.metadata()[1].tolist() == [101, 102, 103, 104]
    assert b.pending == 1
    t0 = time.monotonic()
    third = b.next(q, wait=False)  # other workers are busy: take what is here, now
    assert time.monotonic() - t0 < 0.5
    assert (third.real, third.padded) == (1, 3)
    part, off, _ = third.metadata()
    assert part.tolist() == [1] and off.tolist() == [105]
    assert third.weight.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert third.columns[3].tolist() == [105, -1, -1, -1]
    # Padding rows copy the batch's real row: a model sees inputs like its real ones.
    x = third.columns[0]
    assert isinstance(x, np.ndarray) and (x[1:] == x[0]).all()


def test_a_quiet_input_is_padded_after_the_window_and_never_waits_longer() -> None:
    q: queue.Queue[object] = queue.Queue()
    b = PaddedBatcher(SCHEMA, 8, pad_after=0.2)
    t0 = time.monotonic()
    batch = b.next(q)
    took = time.monotonic() - t0
    assert 0.15 <= took < 1.0, took
    assert (batch.real, batch.padded) == (0, 8) and not batch.weight.any()
    x = batch.columns[0]
    assert isinstance(x, np.ndarray) and x.shape == (8, 16) and not x.any()  # zeros: no row yet
    q.put(block(0, range(5), x0=3.0))
    q.put(END)
    last = b.next(q)
    assert last.real == 5 and b.ended
    again = b.next(q)  # the input ended: padding at once, no waiting
    assert again.real == 0 and again.waited < 0.1
    x = again.columns[0]
    assert isinstance(x, np.ndarray) and (x == 3.0).all()  # the last real row seen


def test_an_input_error_is_raised_by_the_batcher() -> None:
    q: queue.Queue[object] = queue.Queue()
    q.put(RuntimeError("shard 0 failed"))
    with pytest.raises(RuntimeError, match="shard 0 failed"):
        PaddedBatcher(SCHEMA, 2, pad_after=0.1).next(q)


def test_ragged_and_string_columns_are_cut_and_padded_whole() -> None:
    schema = Schema.from_dict(
        {
            "label": "y",
            "features": {
                "items": {"dtype": "int64", "shape": [-1]},
                "user": {"dtype": "string"},
                "y": {"dtype": "float32"},
            },
        }
    )
    items = RaggedColumn(np.arange(6, dtype=np.int64), np.array([1, 2, 3], np.int64))
    user = np.array([b"a", b"b", b"c"], dtype=object)
    meta = [np.zeros(3, np.int32), np.arange(3, dtype=np.int64), np.zeros(3, np.int64)]
    q: queue.Queue[object] = queue.Queue()
    q.put([items, user, np.ones(3, np.float32), *meta])
    b = PaddedBatcher(schema, 2, pad_after=0.05)
    first = b.next(q)
    col = first.columns[0]
    assert isinstance(col, RaggedColumn)
    assert col.values.tolist() == [0, 1, 2] and col.row_lengths.tolist() == [1, 2]
    second = b.next(q)
    col = second.columns[0]
    assert isinstance(col, RaggedColumn)
    assert col.row_lengths.tolist() == [3, 3] and col.values.tolist() == [3, 4, 5, 3, 4, 5]
    assert second.columns[1].tolist() == [b"c", b"c"]  # type: ignore[union-attr]
    empty = PaddedBatcher(schema, 2, pad_after=0.01).next(queue.Queue())
    col = empty.columns[0]
    assert isinstance(col, RaggedColumn) and col.row_lengths.tolist() == [0, 0]
    assert empty.columns[1].tolist() == [b"", b""]  # type: ignore[union-attr]


# ---- the step (in this process, no cluster) -----------------------------------------------------


def test_adam_moves_weights_on_zero_gradients_so_idle_rounds_skip_the_optimizer() -> None:
    import keras
    import tensorflow as tf

    v = keras.Variable(np.ones(3, np.float32))
    opt = keras.optimizers.Adam(0.1)
    opt.build([v])
    opt.apply_gradients([(tf.constant([1.0, 1.0, 1.0]), v)])
    before = v.numpy().copy()
    opt.apply_gradients([(tf.zeros(3), v)])
    assert not np.allclose(v.numpy(), before), "Adam no longer moves on zero gradients?"


def test_per_example_loss_gives_one_value_per_row() -> None:
    import keras
    import tensorflow as tf

    from streamer.mwms import per_example_loss

    y = tf.constant([1.0, 2.0, 3.0])
    pred = tf.constant([1.0, 0.0, 3.0])
    mse = per_example_loss(keras.losses.MeanSquaredError(), y, pred)
    assert mse.numpy().tolist() == [0.0, 4.0, 0.0]
    logits = tf.constant([[2.0, 0.0], [0.0, 2.0]])
    sparse = per_example_loss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), tf.constant([0, 1]), logits
    )
    assert sparse.shape == (2,)
    with pytest.raises(ConfigError, match="one value per example"):
        per_example_loss(lambda a, b: tf.reduce_mean(a - b), y, pred)


def test_options_without_meaning_for_several_workers_are_refused() -> None:
    from streamer.distributed import check_config

    topo = topology_from({"TF_CONFIG": tf_config(["a:1", "b:1"], 0)})
    assert topo is not None
    with pytest.raises(ConfigError, match="reads Kafka"):
        check_config(load_config({}, env={}), topo)
    base = {"bootstrap": "127.0.0.1:9092"}
    for key, value in (("eval_topic", "e"), ("export_dir", "/x"), ("pass_records", "10")):
        with pytest.raises(ConfigError, match=key):
            check_config(load_config({**base, key: value}, env={}), topo)
    check_config(load_config(base, env={}), topo)


def test_launch_gives_each_worker_its_index_and_port() -> None:
    from streamer.launch import worker_argv

    args = ["--audit-log", "audit-{index}.csv", "--metrics-port", "9500", "--topic", "t"]
    assert worker_argv(args, 1) == [
        "--audit-log", "audit-1.csv", "--topic", "t", "--metrics-port", "9501", "--worker-id", "w1"
    ]  # fmt: skip
    assert worker_argv(["--metrics-port", "0", "--worker-id", "x"], 3)[-4:] == [
        "--worker-id", "x", "--metrics-port", "0"
    ]  # fmt: skip
