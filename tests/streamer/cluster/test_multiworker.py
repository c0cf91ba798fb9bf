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
from streamer.cluster.padding import END, PaddedBatcher
from streamer.cluster.topology import (
    Control,
    decide,
    lost_worker,
    offsets_from_vector,
    offsets_vector,
    tf_config,
    topology_from,
    worker_partitions,
)
from streamer.config import load_config
from streamer.decode.ragged import RaggedColumn
from streamer.decode.schema import Schema
from streamer.input.simulator import SimulatorTask
from streamer.stopping import StopReason
from tests.workerutil import (
    ROOT,
    WorkerProcess,
    all_records,
    committed_offsets,
    end_offsets,
    free_port,
    http_get,
    missing_and_extra,
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
    assert all(
        share == [p for p in range(partitions) if p % workers == i]
        for i, share in enumerate(shares)
    )
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
    assert (r.train, r.global_rows, r.stop, r.checkpoint) == (True, 256, None, False)  # type: ignore[attr-defined]
    # One worker idle for --stop-after-idle: the cluster goes on; both idle: it stops.
    assert d(_ctrl(done=True) + _ctrl(real=3), stop_after_idle=5.0).stop is None  # type: ignore[attr-defined]
    both = d(_ctrl(done=True) + _ctrl(done=True), stop_after_idle=5.0)
    assert both.stop == StopReason.idle(5) and both.checkpoint  # type: ignore[attr-defined]
    # A stop asked of one worker: every worker drains first (stops reading, trains what it
    # read) until all report done; the others read who stopped them; a checkpoint first.
    stop = _ctrl(stop=True) + _ctrl()
    first = d(stop, stopping_here=StopReason.signal("SIGTERM"))
    assert (first.drain, first.stop, first.checkpoint) == (True, None, False)  # type: ignore[attr-defined]
    half = _ctrl(stop=True, done=True) + _ctrl(real=64)
    assert (d(half, draining=True).drain, d(half, draining=True).stop) == (False, None)  # type: ignore[attr-defined]
    stop = _ctrl(stop=True, done=True) + _ctrl(done=True)
    assert d(
        stop, stopping_here=StopReason.signal("SIGTERM"), draining=True
    ).stop == StopReason.signal("SIGTERM")  # type: ignore[attr-defined]
    assert d(stop, draining=True).stop == StopReason.peer()  # type: ignore[attr-defined]
    assert d(stop, draining=True).checkpoint  # type: ignore[attr-defined]
    # No checkpoint when the step did not move since the last one, even at a stop.
    assert not d(stop, last_checkpoint_step=10, draining=True).checkpoint  # type: ignore[attr-defined]
    assert d(_ctrl(checkpoint=True) + _ctrl()).checkpoint  # type: ignore[attr-defined]
    assert d(_ctrl(), step=100).checkpoint  # type: ignore[attr-defined]
    assert d(_ctrl(), max_steps=10).stop == StopReason.max_steps(10)  # type: ignore[attr-defined]


def test_a_quiet_worker_never_holds_up_one_with_records() -> None:
    from streamer.cluster.topology import should_wait

    full_other = _ctrl(real=128, full=True) + _ctrl(real=0)
    assert not should_wait(full_other, mine=0, full=False)
    partial_other = _ctrl(real=40) + _ctrl(real=0)
    assert not should_wait(partial_other, mine=0, full=False)  # the other paces the round
    assert should_wait(partial_other, mine=40, full=False)  # fill my batch: nobody is full
    both_trickle = _ctrl(real=5) + _ctrl(real=7)
    assert should_wait(both_trickle, mine=5, full=False)
    assert should_wait(_ctrl() + _ctrl(), mine=0, full=False)  # all quiet: wait to collect
    mine_full = _ctrl(real=128, full=True) + _ctrl(real=3)
    assert should_wait(mine_full, mine=128, full=True)


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


def test_a_batch_output_without_a_per_example_axis_is_refused() -> None:
    """Keras' mse on a [batch] output is one number per batch: padding could not weigh 0."""
    import keras

    from streamer.cluster.strategy import check_per_example_loss

    x = keras.Input((3,))
    check_per_example_loss(keras.Model(x, keras.layers.Dense(1)(x)))  # [batch, 1]: fine
    flat = keras.Model(x, keras.layers.Reshape(())(keras.layers.Dense(1)(x)))
    with pytest.raises(ConfigError, match=r"outputs of shape \[batch, k\]"):
        check_per_example_loss(flat)


def test_options_without_meaning_for_several_workers_are_refused() -> None:
    from streamer.cluster.worker import check_config

    topo = topology_from({"TF_CONFIG": tf_config(["a:1", "b:1"], 0)})
    assert topo is not None
    with pytest.raises(ConfigError, match="reads Kafka"):
        check_config(load_config({}, env={}), topo)
    base = {"bootstrap": "127.0.0.1:9092"}
    for key, value in (
        ("eval_topic", "e"),
        ("pass_records", "10"),
        ("start_from", "earliest"),  # the chief's checkpoint would hold unread partitions
    ):
        with pytest.raises(ConfigError, match=key):
            check_config(load_config({**base, key: value}, env={}), topo)
    with pytest.raises(ConfigError, match=r"mixed_precision.*loss scaling"):
        check_config(load_config({**base, "mixed_precision": True}, env={}), topo)
    check_config(load_config(base, env={}), topo)
    # The chief exports and writes TensorBoard summaries and the profile (issue 33).
    check_config(load_config({**base, "export_dir": "/x", "logdir": "/l"}, env={}), topo)


def test_launch_gives_each_worker_its_index_and_port() -> None:
    from streamer.cluster.launch import worker_argv

    args = ["--audit-log", "audit-{index}.csv", "--metrics-port", "9500", "--topic", "t"]
    assert worker_argv(args, 1) == [
        "--audit-log", "audit-1.csv", "--topic", "t", "--metrics-port", "9501", "--worker-id", "w1"
    ]  # fmt: skip
    assert worker_argv(["--metrics-port", "0", "--worker-id", "x"], 3)[-4:] == [
        "--worker-id", "x", "--metrics-port", "0"
    ]  # fmt: skip


# ---- worker processes on localhost against the real broker --------------------------------------

START_S = 150  # TensorFlow import, cluster start and first round of 2 processes on 2 cores
_CKPT = re.compile(r"checkpoint (\S+) at step (\d+) weights ([0-9a-f]+)")
_RESTORE = re.compile(r"cluster restore: step (\d+), offsets (\{[^}]*\}) weights ([0-9a-f]+)")
_CHIEF_RESTORED = re.compile(r"restored \S+: step (\d+), offsets (\{[^}]*\})")
_METRICS_URL = re.compile(r"metrics on (http://[^/\s]+)/metrics")
_STOPPED = re.compile(r"stopped \((.*)\) at step (\d+)")


def produce_to(bootstrap: str, topic: str, counts: dict[int, int], seed: int = 0) -> None:
    """``counts[p]`` simulator records into partition ``p`` of ``topic``."""
    from kafka import KafkaProducer

    rng = np.random.default_rng(seed)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for p, n in counts.items():
            for value in SimulatorTask().records(n, rng):
                producer.send(topic, value=value, partition=p)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=30)


class PartitionProducer:
    """Produces into some partitions at about ``rate`` records/s until ``stop()``."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], rate: float) -> None:
        import threading

        self.args = (bootstrap, topic, partitions, rate)
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        bootstrap, topic, partitions, rate = self.args
        chunk = max(1, int(rate / 10 / len(partitions)))
        t0 = time.monotonic()
        while not self._stop.is_set():
            produce_to(bootstrap, topic, dict.fromkeys(partitions, chunk), seed=self.sent)
            self.sent += chunk * len(partitions)
            self._stop.wait(max(0.0, t0 + self.sent / rate - time.monotonic()))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        return self.sent


def mw_args(
    bootstrap: str, topic: str, group: str, audit: Path, *extra: str, ckpt: Path | None = None
) -> list[str]:
    args = ["--bootstrap", bootstrap, "--topic", topic, "--group", group, "--shards", "1"]
    args += ["--batch-size", "128", "--metrics-port", str(free_port()), "--status-interval", "0.5"]
    args += ["--audit-log", str(audit), "--pad-after-seconds", "0.3"]
    if ckpt is not None:
        args += ["--checkpoint-dir", str(ckpt)]
    return [*args, *extra]


def start_cluster(
    n: int, args_of: Callable[[int], list[str]], logs: Path, tag: str
) -> list[WorkerProcess]:
    hosts = [f"127.0.0.1:{free_port()}" for _ in range(n)]
    return [
        WorkerProcess.start(
            [*args_of(i), "--worker-id", f"{tag}-w{i}"],
            logs / f"{tag}-w{i}.log",
            env_extra={"TF_CONFIG": tf_config(hosts, i)},
        )
        for i in range(n)
    ]


def checkpoints(text: str) -> dict[int, str]:
    """step -> weights CRC of every checkpoint a worker logged."""
    return {int(step): crc for _, step, crc in _CKPT.findall(text)}


def metric(worker: WorkerProcess, name: str) -> float:
    m = _METRICS_URL.search(worker.log())
    assert m, worker.tail()
    status, body = http_get(m.group(1) + "/metrics")
    assert status == 200, body
    return sum(v for _, v in parse_metrics(body).get(name, []))


def healthz(worker: WorkerProcess) -> tuple[int, str]:
    m = _METRICS_URL.search(worker.log())
    assert m, worker.tail()
    return http_get(m.group(1) + "/healthz")


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, *ws: WorkerProcess
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        dead = [w for w in ws if not w.alive()]
        if dead or time.monotonic() > deadline:
            why = "a worker exited" if dead else f"timed out after {timeout:.0f}s"
            raise AssertionError(f"{why} waiting for {what}\n" + tails(*ws))
        time.sleep(0.2)


def tails(*ws: WorkerProcess) -> str:
    return "\n".join(w.tail(2500) for w in ws)


def audits(*paths: Path, topic: str) -> Counter[tuple[int, int]]:
    total: Counter[tuple[int, int]] = Counter()
    for p in paths:
        total += read_audit(p, topic)
    return total


def latest_checkpoint(directory: Path) -> tuple[int, dict[int, int]]:
    """Step and offsets of the chief's latest checkpoint, read from its files."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(str(directory))
    assert path, f"no checkpoint in {directory}"
    reader = tf.train.load_checkpoint(path)
    step = int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
    parts = reader.get_tensor("offset_partitions/.ATTRIBUTES/VARIABLE_VALUE").tolist()
    offs = reader.get_tensor("offset_values/.ATTRIBUTES/VARIABLE_VALUE").tolist()
    return step, dict(zip(parts, offs, strict=True))


@pytest.mark.kafka
@pytest.mark.slow
def test_two_workers_on_uneven_input_train_every_record_once_with_identical_weights(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    """`streamer launch`, run to idle: worker 1's partitions hold a tenth of worker 0's, so it
    pads most rounds; nothing deadlocks, every record is trained once over the union of the
    audit logs, the commits reach the end offsets, and both workers hold the same weights at
    every checkpoint. The chief exports the cluster's model (every partition's position in
    it, the last at the stop) and writes TensorBoard summaries."""
    topic = make_topic(4)
    produce_to(kafka_bootstrap, topic, {0: 3000, 2: 2500, 1: 300, 3: 200})
    ends = end_offsets(kafka_bootstrap, topic)
    args = mw_args(
        kafka_bootstrap,
        topic,
        group_id,
        tmp_path / "audit-{index}.csv",
        "--stop-after-idle", "4", "--checkpoint-every-steps", "8", "--metrics-port", "0",
        "--export-dir", str(tmp_path / "export"), "--export-every-steps", "10",
        "--logdir", str(tmp_path / "tb"),
        ckpt=tmp_path / "ckpt",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    log_path = tmp_path / "launch.log"
    with open(log_path, "wb") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "streamer.cli", "launch", "--workers", "2", "--", *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        rc = launcher.wait(START_S + 90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(30)
    text = log_path.read_text(errors="replace")
    assert rc == 0, text[-6000:]
    lines = {i: "\n".join(x for x in text.splitlines() if x.startswith(f"[w{i}] ")) for i in (0, 1)}
    assert "cluster=0/2 chief=yes partitions=0,2" in lines[0]
    assert "cluster=1/2 chief=no partitions=1,3" in lines[1]
    stops = [_STOPPED.search(lines[i]) for i in (0, 1)]
    assert all(stops), text[-4000:]
    assert {s.group(1) for s in stops if s} == {"idle for 4s"}
    assert stops[0].group(2) == stops[1].group(2)  # type: ignore[union-attr]

    counts = audits(tmp_path / "audit-0.csv", tmp_path / "audit-1.csv", topic=topic)
    expected = all_records(ends)
    assert counts.keys() == expected, summarize(sorted(expected ^ counts.keys()))
    assert max(counts.values()) == 1, "records trained more than once"
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends
    # Worker 0 trained its own partitions only, worker 1 its own.
    assert {p for p, _ in read_audit(tmp_path / "audit-1.csv", topic)} == {1, 3}

    crcs = [checkpoints(lines[i]) for i in (0, 1)]
    assert len(crcs[0]) >= 2 and crcs[0] == crcs[1], crcs
    assert max(crcs[0]) == int(stops[0].group(2))  # type: ignore[union-attr]

    from streamer.train.export import Exporter, read_info

    versions = Exporter(str(tmp_path / "export")).versions()
    assert len(versions) >= 2 and versions[-1] == max(crcs[0]), (versions, text[-3000:])
    info = read_info(str(tmp_path / "export" / str(versions[-1])))
    assert info["offsets"] == ends  # every partition, both workers' (all-reduced)
    assert "exported" in lines[0] and "exported" not in lines[1]  # a copy, thrown away
    assert list((tmp_path / "tb").glob("events.out.tfevents.*")), "no TensorBoard summaries"


@pytest.mark.kafka
@pytest.mark.slow
def test_ctrl_c_to_launch_is_one_coordinated_clean_stop(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    """A terminal's Ctrl-C reaches `streamer launch` and both workers (one process group),
    and launch forwards it once more: every worker takes the duplicates as the same stop,
    they checkpoint at one step and exit 0, and the commits are that checkpoint's offsets."""
    topic = make_topic(4)
    produce_to(kafka_bootstrap, topic, dict.fromkeys(range(4), 6000))
    ckpt = tmp_path / "ckpt"
    args = mw_args(
        kafka_bootstrap,
        topic,
        group_id,
        tmp_path / "audit-{index}.csv",
        "--checkpoint-every-steps", "10", "--metrics-port", "0",
        ckpt=ckpt,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    log_path = tmp_path / "launch.log"
    with open(log_path, "wb") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "streamer.cli", "launch", "--workers", "2", "--", *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_S + 60
        while len(checkpoints(log_path.read_text(errors="replace"))) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        os.killpg(launcher.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole group
        rc = launcher.wait(90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(30)
    text = log_path.read_text(errors="replace")
    assert rc == 0, text[-6000:]
    assert "workers exited with [0, 0]" in text, text[-4000:]
    assert "exiting at once" not in text and "lost worker" not in text, text[-4000:]
    stops = [_STOPPED.search("\n".join(x for x in text.splitlines() if x.startswith(f"[w{i}] ")))
             for i in (0, 1)]  # fmt: skip
    assert all(stops), text[-4000:]
    assert stops[0].group(2) == stops[1].group(2)  # type: ignore[union-attr]
    # Each worker's final frame counts the commits it made (it read commits=0 after launch).
    for i in (0, 1):
        final = [x for x in text.splitlines() if x.startswith(f"[w{i}] ") and "(final:" in x]
        assert final and int(re.findall(r"commits=(\d+)", final[-1])[0]) >= 1, text[-4000:]
    step, offsets = latest_checkpoint(ckpt)
    assert step == int(stops[0].group(2))  # type: ignore[union-attr]
    assert committed_offsets(kafka_bootstrap, group_id, topic) == offsets
    counts = audits(tmp_path / "audit-0.csv", tmp_path / "audit-1.csv", topic=topic)
    below = {(p, o) for p, end in offsets.items() for o in range(end)}
    missing, extra = missing_and_extra(counts, below)
    assert not missing and not extra, (
        f"checkpoint {offsets}: never trained below it: {summarize(missing)}; trained past "
        f"it: {summarize(extra)}\n{text[-4000:]}"
    )
    assert max(counts.values()) == 1


@pytest.mark.kafka
@pytest.mark.slow
def test_an_idle_worker_never_stalls_the_cluster_and_sigterm_checkpoints_all(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    """Worker 1's partitions go quiet while worker 0's flow: steps go on, worker 1 pads and
    its offsets stay where they were; with nothing anywhere the rounds go on as idle steps
    and /healthz stays 200. SIGTERM to worker 1 mid-stream: both checkpoint at the same step
    with the same weights and exit 0, and the commits equal that checkpoint's offsets, below
    which every record was trained exactly once."""
    topic = make_topic(4)
    produce_to(kafka_bootstrap, topic, dict.fromkeys(range(4), 300))
    ckpt = tmp_path / "ckpt"
    ws = start_cluster(
        2,
        lambda i: mw_args(
            kafka_bootstrap,
            topic,
            group_id,
            tmp_path / f"audit-{i}.csv",
            "--checkpoint-every-seconds",
            "1",
            "--stall-timeout",
            "10",
            ckpt=ckpt,
        ),
        tmp_path,
        "idle",
    )
    w0, w1 = ws
    committed = lambda: committed_offsets(kafka_bootstrap, group_id, topic)  # noqa: E731
    wait_until(lambda: committed() == dict.fromkeys(range(4), 300), START_S, "the first 1,200", *ws)
    # Nothing anywhere: rounds go on as idle steps, no weight changes, both live.
    wait_until(
        lambda: min(metric(w, "streamer_idle_steps_total") for w in ws) >= 3, 30, "idle steps", *ws
    )
    assert [healthz(w)[0] for w in ws] == [200, 200]

    producer = PartitionProducer(kafka_bootstrap, topic, [0, 2], rate=1500)
    try:
        steps = metric(w0, "streamer_train_steps_total")
        padded = metric(w1, "streamer_padded_rows_total")
        wait_until(
            lambda: min(committed()[p] or 0 for p in (0, 2)) >= 300 + 2000,
            60,
            "worker 0's partitions to move on",
            *ws,
        )
        assert metric(w0, "streamer_train_steps_total") >= steps + 2000 * 2 / 128 * 0.9
        assert metric(w1, "streamer_padded_rows_total") > padded + 1000
        c = committed()
        assert (c[1], c[3]) == (300, 300), c  # the idle worker's offsets did not move
        assert [healthz(w)[0] for w in ws] == [200, 200]
        w1.terminate()  # mid-stream
        codes = [w.wait(60) for w in ws]
    finally:
        producer.stop()
    assert codes == [0, 0], tails(*ws)
    assert w1.stopped()[0] == "signal SIGTERM"  # type: ignore[index]
    assert w0.stopped()[0] == "another worker was stopped"  # type: ignore[index]
    final = w0.stopped()[1]  # type: ignore[index]
    assert w1.stopped()[1] == final  # type: ignore[index]
    crcs = [checkpoints(w.log()) for w in ws]
    assert max(crcs[0]) == max(crcs[1]) == final, tails(*ws)
    assert crcs[0][final] == crcs[1][final]

    step, offsets = latest_checkpoint(ckpt)
    assert step == final
    assert committed() == offsets, tails(*ws)
    counts = audits(tmp_path / "audit-0.csv", tmp_path / "audit-1.csv", topic=topic)
    below = {(p, o) for p, end in offsets.items() for o in range(end)}
    assert counts.keys() == below, summarize(sorted(below ^ counts.keys()))
    assert max(counts.values()) == 1


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0], ids=["worker-1", "chief"])
def test_kill9_ends_the_cluster_and_a_restart_resumes_from_the_checkpoint(
    victim: int,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    tmp_path: Path,
) -> None:
    """kill -9 of one worker while records flow: the other exits non-zero within 30 s naming
    the lost worker (a stopped worker first fails the other's /healthz). All restarted (after
    the chief's death, as 3 workers: offsets are per partition, so any N resumes): they resume
    with the model, step and offsets of the last checkpoint, and when they have run to idle
    nothing is lost and the commits are at the end offsets."""
    topic = make_topic(4)
    produce_to(kafka_bootstrap, topic, dict.fromkeys(range(4), 500))
    ckpt = tmp_path / "ckpt"

    def args_of(run: str, *extra: str) -> Callable[[int], list[str]]:
        return lambda i: mw_args(
            kafka_bootstrap, topic, group_id, tmp_path / f"audit-{run}-{i}.csv",
            "--checkpoint-every-steps", "5", *extra, ckpt=ckpt,
        )  # fmt: skip

    producer = PartitionProducer(kafka_bootstrap, topic, [0, 1, 2, 3], rate=800)
    try:
        first = start_cluster(2, args_of("a", "--stall-timeout", "2"), tmp_path, "a")
        chief = first[0]
        wait_until(lambda: len(checkpoints(chief.log())) >= 3, START_S, "3 checkpoints", *first)
        dead, survivor = first[victim], first[1 - victim]
        if victim == 1:
            # Hung but alive: the other's rounds stop, and so does its /healthz.
            dead.signal(signal.SIGSTOP)
            wait_until(lambda: healthz(survivor)[0] == 503, 8, "/healthz 503", survivor)
            assert "trainer made no progress" in healthz(survivor)[1]
        dead.kill()
        t0 = time.monotonic()
        rc = survivor.wait(30)
        took = time.monotonic() - t0
    finally:
        sent = producer.stop()
    assert rc != 0, survivor.tail()
    assert f"lost worker {victim}" in survivor.log(), survivor.tail()
    print(f"kill -9 of worker {victim}: the other exited ({rc}) {took:.1f}s later; {sent} produced")

    step, offsets = latest_checkpoint(ckpt)
    logged = checkpoints(chief.log())
    n = 3 if victim == 0 else 2
    second = start_cluster(n, args_of("b", "--stop-after-idle", "4"), tmp_path, "b")
    assert [w.wait(START_S + 90) for w in second] == [0] * n, tails(*second)
    for i, w in enumerate(second):
        m = _RESTORE.search(w.log())
        assert m, w.tail()
        assert int(m.group(1)) == step
        if step in logged:  # logged unless the kill fell between the save and the log line
            assert m.group(3) == logged[step], "restored weights differ from the checkpoint's"
        mine = ast.literal_eval(m.group(2))
        assert mine == {p: o for p, o in offsets.items() if p in worker_partitions(range(4), i, n)}
    chief_line = _CHIEF_RESTORED.search(second[0].log())
    assert chief_line and ast.literal_eval(chief_line.group(2)) == offsets

    ends = end_offsets(kafka_bootstrap, topic)
    again = audits(*(tmp_path / f"audit-b-{i}.csv" for i in range(n)), topic=topic)
    assert all(o >= offsets.get(p, 0) for p, o in again), (
        "the restart retrained records below the checkpoint"
    )
    counts = audits(*(tmp_path / f"audit-{r}-{i}.csv" for r in "ab" for i in range(n)), topic=topic)
    missing = all_records(ends) - counts.keys()
    assert not missing, f"lost: {summarize(sorted(missing))}"
    assert again.keys() >= all_records(ends) - all_records(offsets)
    assert max(again.values()) == 1
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends
