"""Serving and observability: SavedModel export, TensorBoard scalars, profiling, evaluation.

Export and evaluation run the worker as a real process against the real broker and judge it
from the outside (the export directory, the event files, the broker's committed offsets, the
log); the TensorBoard and profiler tests run the worker in-process on the embedded simulator.
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import re
import statistics
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from streamer.config import load_config
from streamer.input.simulator import SimulatorTask, produce
from streamer.train.evaluate import Evaluator
from streamer.train.export import INFO_FILE, Exporter, read_info
from streamer.train.model import load_model
from streamer.train.trainer import Trainer
from tests.workerutil import (
    RateProducer,
    WorkerProcess,
    committed_offsets,
    end_offsets,
    free_port,
    http_get,
    run_in_process,
    worker_args,
)

START_S = 120  # TensorFlow import + group join on a loaded 2-core machine

_EXPORTED = re.compile(r"exported \S+ at step (\d+) in ([\d.]+)s")
_EVAL = re.compile(r"eval step=(\d+) loss=(\S+) records=(\d+) seconds=([\d.]+)")
_EVAL_LINE = re.compile(
    r"^(\S+ \S+) INFO \S+: eval step=(\d+) loss=(\S+) records=(\d+) seconds=\S+ mae=(\S+)$",
    re.M,
)


# ---- helpers ----------------------------------------------------------------------------------


def serve(version_dir: str, n: int = 8) -> np.ndarray:
    """Load one exported version and run its serving signature on a simulator batch."""
    loaded = tf.saved_model.load(version_dir)
    fn = loaded.signatures["serving_default"]
    batch = SimulatorTask().sample(n, np.random.default_rng(7))
    out = fn(x=tf.constant(batch["x"]))
    (pred,) = out.values()
    return np.asarray(pred)


def complete(version_dir: str) -> bool:
    return (
        os.path.isfile(os.path.join(version_dir, "saved_model.pb"))
        and os.path.isfile(os.path.join(version_dir, "variables", "variables.index"))
        and os.path.isfile(os.path.join(version_dir, INFO_FILE))
    )


class DirectoryWatcher(threading.Thread):
    """Polls an export directory the way TF Serving does; notes every partial version it sees."""

    def __init__(self, directory: Path) -> None:
        super().__init__(name="export-watcher", daemon=True)
        self.directory = directory
        self.partial: list[str] = []
        self.first_seen: list[int] = []  # versions in the order they appeared
        self.max_present = 0
        self.polls = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                names = []
            present = 0
            for name in names:
                if not name.isdigit():
                    continue
                path = os.path.join(self.directory, name)
                if complete(path):
                    present += 1
                    if int(name) not in self.first_seen:
                        self.first_seen.append(int(name))
                elif os.path.isdir(path):  # still there under its version name, yet incomplete
                    self.partial.append(f"{name}: {sorted(os.listdir(path))}")
            self.max_present = max(self.max_present, present)
            self.polls += 1
            self._stop_event.wait(0.002)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def groups_with_offsets(bootstrap: str, topic: str) -> set[str]:
    """Every consumer group on the broker that has a committed offset on ``topic``."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="streamer-tests-groups")
    try:
        out = set()
        for row in admin.list_groups():
            group = row["group_id"]
            offsets = admin.list_group_offsets(group).get(group, {})
            if any(
                tp.topic == topic and om is not None and om.offset >= 0
                for tp, om in offsets.items()
            ):
                out.add(group)
        return out
    finally:
        admin.close()


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from every event file under ``logdir`` (scalars plugin only)."""
    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(glob.glob(str(logdir / "events.out.tfevents.*")))
    assert files, f"no event file in {logdir}: {os.listdir(logdir)}"
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name == "scalars", value
                scalar = float(tf.make_ndarray(value.tensor))
                out.setdefault(value.tag, []).append((int(event.step), scalar))
    return out


# ---- 1. the exporter alone --------------------------------------------------------------------


def test_exporter_versions_increase_across_restarts_prune_and_load(tmp_path: Path) -> None:
    export_dir = tmp_path / "models"
    bundle = load_model(None, SimulatorTask().schema())
    exporter = Exporter(str(export_dir), keep=2)
    first = exporter.export(bundle.model, 50, {0: 10, 1: 12}, "samples")
    assert os.path.basename(first) == "50"
    # A crash mid-export leaves a temporary directory: never a version, cleaned up at start.
    stale = export_dir / ".streamer-tmp-77-deadbeef"
    (stale / "variables").mkdir(parents=True)
    # A restart without a checkpoint counts steps from 0 again: versions still increase.
    restarted = Exporter(str(export_dir), keep=2)
    assert not stale.exists()
    second = restarted.export(bundle.model, 10, {0: 20, 1: 22}, "samples")
    third = restarted.export(bundle.model, 20, {0: 30, 1: 32}, "samples")
    versions = [int(os.path.basename(p)) for p in (first, second, third)]
    assert versions == sorted(set(versions)) and versions[0] == 50, versions
    assert restarted.versions() == versions[1:], "keep=2: the oldest version is gone"
    assert sorted(os.listdir(export_dir)) == sorted(str(v) for v in versions[1:])
    info = read_info(third)
    assert info == {**info, "topic": "samples", "step": 20, "offsets": {0: 30, 1: 32}}
    assert restarted.latest_step() == 20
    pred = serve(third)
    expected = bundle.model({"x": SimulatorTask().sample(8, np.random.default_rng(7))["x"]})
    np.testing.assert_allclose(pred, np.asarray(expected), rtol=1e-5, atol=1e-6)


def test_exporter_prunes_only_versions_it_wrote(tmp_path: Path) -> None:
    """Someone else's numbered directory or dot-folder in --export-dir is never touched."""
    export_dir = tmp_path / "models"
    (export_dir / "2019").mkdir(parents=True)
    (export_dir / "2019" / "report.txt").write_text("mine", encoding="utf-8")
    (export_dir / ".tmp-notes").mkdir()
    (export_dir / ".tmp-notes" / "todo").write_text("mine too", encoding="utf-8")
    bundle = load_model(None, SimulatorTask().schema())
    exporter = Exporter(str(export_dir), keep=1)
    paths = [exporter.export(bundle.model, step, {0: step}, "samples") for step in (5, 2019, 7)]
    assert (export_dir / "2019" / "report.txt").read_text(encoding="utf-8") == "mine"
    assert (export_dir / ".tmp-notes" / "todo").exists()
    assert os.path.basename(paths[1]) == "2020"  # 2019 is taken by someone else
    assert exporter.versions() == [int(os.path.basename(paths[2]))]
    assert sorted(os.listdir(export_dir)) == sorted(
        [".tmp-notes", "2019", os.path.basename(paths[2])]
    )


# ---- 2. export while training, against the broker ---------------------------------------------


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_export_publishes_complete_increasing_versions_while_training(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    topic = make_topic(4)
    produce(kafka_bootstrap, topic, 20_000, partitions=4)
    ends = end_offsets(kafka_bootstrap, topic)
    export_dir = tmp_path / "models"
    keep = 3
    watcher = DirectoryWatcher(export_dir)
    watcher.start()
    extra = ["--export-dir", str(export_dir), "--export-every-steps", "10"]
    extra += ["--export-keep", str(keep)]
    worker = WorkerProcess.start(
        worker_args(
            kafka_bootstrap, topic, group_id, None, shards=2, stop_after_idle=3, extra=extra
        ),
        tmp_path / "worker.log",
    )
    try:
        worker.wait_for(lambda: len(watcher.first_seen) >= 2, START_S, "two exported versions")
        # Serve a version while the worker goes on training and exporting.
        for _ in range(5):
            newest = max(int(n) for n in os.listdir(export_dir) if n.isdigit())
            try:
                pred = serve(str(export_dir / str(newest)))
                break
            except (OSError, tf.errors.NotFoundError):  # pruned while we loaded it: next one
                continue
        else:
            raise AssertionError("could not load any exported version")
        assert pred.shape == (8, 1) and np.isfinite(pred).all(), pred
        served_while_training = worker.alive()
        assert worker.wait(START_S) == 0, worker.tail()
    finally:
        watcher.stop()
        if worker.alive():
            worker.kill()
    log = worker.log()
    assert served_while_training, f"the worker had already stopped\n{worker.tail()}"
    assert watcher.polls > 100, watcher.polls
    assert not watcher.partial, f"a reader saw partial versions: {watcher.partial[:5]}"
    seen = watcher.first_seen
    assert seen == sorted(seen) and len(seen) >= 4, f"versions appeared out of order: {seen}"
    assert watcher.max_present <= keep + 1, watcher.max_present  # +1: new one before pruning
    versions = sorted(int(n) for n in os.listdir(export_dir) if n.isdigit())
    assert 1 <= len(versions) <= keep, versions
    assert not [n for n in os.listdir(export_dir) if not n.isdigit()], os.listdir(export_dir)
    infos = [read_info(str(export_dir / str(v))) for v in versions]
    steps = [info["step"] for info in infos]
    assert steps == sorted(set(steps)), steps
    for info in infos:
        assert info["topic"] == topic
        assert set(info["offsets"]) == set(ends), info
        assert all(0 < info["offsets"][p] <= ends[p] for p in ends), (info, ends)
    # The clean stop exported the final model: trained up to the end of every partition.
    assert infos[-1]["offsets"] == ends, (infos[-1], ends)
    for v in versions:
        out = serve(str(export_dir / str(v)))
        assert out.shape == (8, 1) and np.isfinite(out).all()
    times = [float(t) for _, t in _EXPORTED.findall(log)]
    assert len(times) == len(seen), (times, seen)
    print(
        f"export: {len(times)} versions, {statistics.median(times):.2f}s median, "
        f"{max(times):.2f}s max per version; {watcher.polls} directory polls"
    )


# ---- 3. TensorBoard scalars -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_tensorboard_event_files_hold_the_training_scalars(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    code, worker, log = run_in_process(
        max_steps=40, logdir=str(logdir), status_interval=0.1, sim_rate=3_000.0
    )
    assert code == 0, log
    scalars = read_scalars(logdir)
    for tag in (
        "train/loss",
        "train/samples_per_second",
        "train/input_wait_fraction",
        "kafka/consumer_lag_records",
    ):
        assert len(scalars.get(tag, [])) >= 2, (tag, scalars.keys())
    steps = [s for s, _ in scalars["train/loss"]]
    assert steps == sorted(steps) and 0 < steps[-1] <= worker.step, steps
    assert all(math.isfinite(v) and v > 0 for _, v in scalars["train/loss"])
    assert all(v > 0 for _, v in scalars["train/samples_per_second"])
    assert all(0.0 <= v <= 1.0 for _, v in scalars["train/input_wait_fraction"])
    assert all(v >= 0 for _, v in scalars["kafka/consumer_lag_records"])
    # Throttled input (--sim-rate): the trainer mostly waits, and says so.
    assert max(v for _, v in scalars["train/input_wait_fraction"]) > 0.5, scalars


# ---- 4. profiling -----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_profile_steps_capture_a_trace(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    code, _worker, log = run_in_process(max_steps=30, logdir=str(logdir), profile_steps="5:12")
    assert code == 0, log
    assert "profiling steps 5:12" in log and "profile written" in log, log
    traces = glob.glob(str(logdir / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(traces) == 1, os.listdir(logdir)
    assert os.path.getsize(traces[0]) > 1000, traces


def test_no_profile_without_profile_steps(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    code, _worker, log = run_in_process(max_steps=5, logdir=str(logdir))
    assert code == 0, log
    assert not (logdir / "plugins").exists()


# ---- 5. evaluation ----------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_evaluation_loss_falls_and_never_moves_eval_offsets(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic = make_topic(4)
    eval_topic = make_topic(2, prefix="eval")
    produce(kafka_bootstrap, topic, 20_000, partitions=4)
    produce(kafka_bootstrap, eval_topic, 1_500, partitions=2, seed=99)
    # The training group already holds offsets on the eval topic: they must stay put.
    before = {0: 7, 1: 3}
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=group_id, enable_auto_commit=False
    )
    try:
        consumer.commit(
            {TopicPartition(eval_topic, p): OffsetAndMetadata(o, "", -1) for p, o in before.items()}
        )
    finally:
        consumer.close(autocommit=False)
    logdir = tmp_path / "tb"
    extra = ["--eval-topic", eval_topic, "--eval-every-steps", "10", "--eval-records", "1024"]
    extra += ["--logdir", str(logdir)]
    worker = WorkerProcess.start(
        worker_args(
            kafka_bootstrap, topic, group_id, None, shards=2, stop_after_idle=3, extra=extra
        ),
        tmp_path / "worker.log",
    )
    assert worker.wait(START_S + 60) == 0, worker.tail()
    evals = [(int(s), float(x), int(n), float(t)) for s, x, n, t in _EVAL.findall(worker.log())]
    assert len(evals) >= 4, worker.tail()
    assert [s for s, *_ in evals] == list(range(10, 10 * len(evals) + 1, 10)), evals
    assert all(n == 1024 for _, _, n, _ in evals), evals
    first, last = evals[0][1], evals[-1][1]
    assert last < 0.8 * first, f"eval loss did not fall: {[x for _, x, _, _ in evals]}"
    # The same losses reached TensorBoard.
    tb = dict(read_scalars(logdir)["eval/loss"])
    assert sorted(tb) == [s for s, *_ in evals], tb
    assert all(abs(tb[s] - x) < 1e-4 for s, x, _, _ in evals), (tb, evals)
    # Nothing moved on the eval topic: the group's offsets are the ones set above, and no
    # other group (the eval consumers have none) has any.
    assert committed_offsets(kafka_bootstrap, group_id, eval_topic) == before
    for other in groups_with_offsets(kafka_bootstrap, eval_topic) - {group_id}:
        raise AssertionError(f"group {other} has offsets on the eval topic")
    # Training committed as usual.
    assert committed_offsets(kafka_bootstrap, group_id, topic) == end_offsets(
        kafka_bootstrap, topic
    )
    seconds = [t for *_, t in evals]
    print(
        f"eval: {len(evals)} evaluations of 1024 records, loss {first:.4f} -> {last:.4f}, "
        f"{statistics.median(seconds):.2f}s median per evaluation"
    )


def test_eval_topic_needs_kafka(tmp_path: Path) -> None:
    # A configuration that cannot work is refused when it is built (the CLI exits 2 on it).
    from consumers.errors import ConfigError

    with pytest.raises(ConfigError, match=r"eval_topic.*needs --bootstrap"):
        run_in_process(max_steps=5, eval_topic="held-out")


# ---- 6. compiled metrics and --eval-every-seconds ---------------------------------------------


def read_topic(bootstrap: str, topic: str, n: int) -> dict[str, np.ndarray]:
    """Every simulator record of ``topic`` (``n`` of them), decoded with msgpack."""
    import msgpack
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    try:
        values = [msgpack.unpackb(m.value) for m in consumer]
    finally:
        consumer.close(autocommit=False)
    assert len(values) == n, len(values)
    x = np.stack([np.frombuffer(v["x"], "<f4") for v in values])
    return {"x": x, "y": np.asarray([v["y"] for v in values], np.float32)}


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_evaluator_computes_the_compiled_metric_over_the_held_out_records(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    eval_topic = make_topic(2, prefix="eval")
    produce(kafka_bootstrap, eval_topic, 700, partitions=2, seed=5)
    cfg = load_config({"bootstrap": kafka_bootstrap, "topic": "unused"}, env={})
    bundle = load_model(None, SimulatorTask().schema())
    trainer = Trainer(bundle)
    # Some training first, so the predictions are not all near 0.
    rng = np.random.default_rng(1)
    for _ in range(30):
        trainer.step(SimulatorTask().sample(128, rng))
    # records > the topic: the whole topic, every time (idle timeout ends the pass).
    evaluator = Evaluator(
        cfg.consumer_settings(),
        eval_topic,
        SimulatorTask().schema(),
        trainer,
        records=1000,
        batch_size=128,
        idle_timeout=1.0,
    )
    try:
        first = evaluator.evaluate()
        second = evaluator.evaluate()
    finally:
        evaluator.close()
    assert first is not None and second is not None
    data = read_topic(kafka_bootstrap, eval_topic, 700)
    pred = np.asarray(bundle.model({"x": tf.constant(data["x"])}))[:, 0]  # [n, 1] head
    mse = float(np.mean((pred - data["y"]) ** 2))
    mae = float(np.mean(np.abs(pred - data["y"])))
    for result in (first, second):  # the metric state is reset between evaluations
        assert result.records == 700
        assert set(result.metrics) == {"mae"}
        assert result.loss == pytest.approx(mse, rel=1e-4), (result, mse)
        assert result.metrics["mae"] == pytest.approx(mae, rel=1e-4), (result, mae)
    print(f"evaluator: 700 records, loss {first.loss:.5f} (numpy {mse:.5f}), mae {mae:.5f}")


def _log_time(stamp: str) -> float:
    import datetime

    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_eval_every_seconds_exports_compiled_metrics_to_prometheus_and_tensorboard(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    import shutil
    import subprocess

    topic = make_topic(2)
    eval_topic = make_topic(1, prefix="eval")
    produce(kafka_bootstrap, eval_topic, 600, partitions=1, seed=99)
    every_seconds = 1.5
    logdir = tmp_path / "tb"
    port = free_port()
    # The step condition can never be due: every evaluation is triggered by the clock.
    extra = ["--eval-topic", eval_topic, "--eval-every-steps", "1000000"]
    extra += ["--eval-every-seconds", str(every_seconds), "--eval-records", "512"]
    extra += ["--logdir", str(logdir), "--metrics-port", str(port)]
    producer = RateProducer(kafka_bootstrap, topic, rate=2_000)
    producer.start()
    worker = WorkerProcess.start(
        worker_args(
            kafka_bootstrap,
            topic,
            group_id,
            None,
            shards=1,
            batch_size=64,
            stop_after_idle=3,
            extra=extra,
        ),
        tmp_path / "worker.log",
    )
    try:
        worker.wait_for(
            lambda: len(_EVAL_LINE.findall(worker.log())) >= 4, START_S + 60, "four evaluations"
        )
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        logged = _EVAL_LINE.findall(worker.log())
    finally:
        producer.stop()
    assert worker.wait(START_S) == 0, worker.tail()
    assert status == 200, body
    evals = [
        (_log_time(t), int(s), float(x), int(n), float(m))
        for t, s, x, n, m in _EVAL_LINE.findall(worker.log())
    ]
    assert len(evals) >= 4, worker.tail()
    steps = [s for _, s, *_ in evals]
    assert steps == sorted(set(steps)) and steps[0] > 0, f"once per step at most: {steps}"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(evals)]
    # Logged at the end of each evaluation; the next one starts every_seconds after that end.
    assert min(gaps) >= every_seconds - 0.01, gaps
    assert all(n == 512 for *_, n, _ in evals), evals
    for _, _, loss, _, mae in evals:
        # Same records: MAE <= RMSE (up to the log's rounding), positive (the task has noise).
        assert mae > 0 and mae**2 <= loss + 2e-5, (loss, mae)
    # Prometheus: the last evaluation before the scrape, as a gauge per metric.
    scraped = {
        name: float(value)
        for name, value in re.findall(
            r"^(streamer_eval_loss|streamer_eval_metric\{metric=\"mae\"\}) (\S+)$", body, re.M
        )
    }
    assert set(scraped) == {"streamer_eval_loss", 'streamer_eval_metric{metric="mae"}'}, body
    at_scrape = [(float(x), float(m)) for _, _, x, _, m in logged]
    assert any(
        abs(scraped["streamer_eval_loss"] - x) < 1e-4
        and abs(scraped['streamer_eval_metric{metric="mae"}'] - m) < 1e-4
        for x, m in at_scrape
    ), (scraped, at_scrape)
    promtool = shutil.which("promtool")
    if promtool is not None:
        check = subprocess.run(
            [promtool, "check", "metrics"],
            input=body,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
    # TensorBoard: eval/loss and eval/mae at every evaluation's step.
    scalars = read_scalars(logdir)
    tb_loss, tb_mae = dict(scalars["eval/loss"]), dict(scalars["eval/mae"])
    assert sorted(tb_loss) == sorted(tb_mae) == steps, (tb_loss, tb_mae, steps)
    assert all(abs(tb_mae[s] - m) < 1e-4 for _, s, _, _, m in evals), (tb_mae, evals)
    print(
        f"eval every {every_seconds}s: {len(evals)} evaluations at steps {steps}, gaps "
        f"{min(gaps):.2f}-{max(gaps):.2f}s, loss {evals[0][2]:.4f} -> {evals[-1][2]:.4f}, "
        f"mae {evals[0][4]:.4f} -> {evals[-1][4]:.4f}; sent {producer.sent} records"
    )
