"""streamer.Stream, the public API, against the real broker: ``model.fit`` commits exactly
what Keras trained, a second fit (and a second Stream) resume where the first ended, a
``kill -9`` loses nothing, ``steps_per_execution``, ``class_weight`` and Keras' own callbacks
beside ours, a custom loop, and a JAX-backend model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import keras
import msgpack
import numpy as np
import pytest

import streamer
from consumers.errors import ConfigError
from streamer.input.simulator import SimulatorTask
from streamer.train.model import default_model
from tests.workerutil import committed_offsets, free_port, read_audit

BATCH = 32


def produce(bootstrap: str, topic: str, counts: dict[int, int], *, binary: bool = False) -> None:
    """``counts[p]`` records of the simulator's regression task into partition ``p``
    (``binary``: labels 0 or 1, for ``class_weight``)."""
    from kafka import KafkaProducer

    rng = np.random.default_rng(7)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for p, n in counts.items():
            if binary:
                x = rng.normal(size=(n, 16)).astype(np.float32)
                values = [msgpack.packb({"x": row.tolist(), "y": float(row[0] > 0)}) for row in x]
            else:
                values = SimulatorTask().records(n, rng)
            for value in values:
                producer.send(topic, value=value, partition=p)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=30)


def scrape(port: int) -> dict[str, float]:
    """Each family's total on the worker's /metrics (Prometheus' own parser)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def committed_total(bootstrap: str, group: str, topic: str) -> int:
    return sum(o or 0 for o in committed_offsets(bootstrap, group, topic).values())


def exactly_once_prefix(
    audit: Counter[tuple[int, int]], bootstrap: str, group: str, topic: str
) -> None:
    """Every record trained once, and the group's commit is exactly the trained prefix of
    each partition (nothing read and not trained is committed)."""
    assert audit and max(audit.values()) == 1, "a record was trained twice"
    committed = committed_offsets(bootstrap, group, topic)
    for p, o in committed.items():
        trained = sorted(off for (q, off) in audit if q == p)
        assert trained == list(range(len(trained))), f"partition {p}: a gap in what was trained"
        assert (o or 0) == len(trained), f"partition {p}: committed {o}, trained {len(trained)}"


@pytest.fixture
def topic4(kafka_bootstrap: str, make_topic) -> str:  # type: ignore[no-untyped-def]
    topic: str = make_topic(4)
    produce(kafka_bootstrap, topic, dict.fromkeys(range(4), 500))
    return topic


def test_fit_commits_what_keras_trained_and_the_next_fit_and_stream_go_on(
    kafka_bootstrap: str, topic4: str, group_id: str, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.log"
    settings = dict(
        bootstrap=kafka_bootstrap,
        topic=topic4,
        group=group_id,
        batch_size=BATCH,
        shards=2,
        audit_log=str(audit),
        commit_every_steps=5,
    )
    port = free_port()
    scraped: list[dict[str, float]] = []

    class Scrape(keras.callbacks.Callback):  # after ours: the epoch's records acknowledged
        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            # The shards' polls reach the lag a poll report later (a child's every 0.25 s).
            deadline = time.monotonic() + 15
            while True:
                scraped.append(scrape(port))
                lag = scraped[-1]["streamer_consumer_lag_records"]
                if lag == 2000 - (epoch + 1) * 10 * BATCH or time.monotonic() > deadline:
                    return
                time.sleep(0.2)

    with streamer.Stream(**settings, metrics_port=port) as stream:
        model = default_model(stream.schema)
        model.fit(
            stream.dataset(),
            steps_per_epoch=10,
            epochs=2,
            callbacks=[stream.callback(), Scrape()],
            verbose=0,
        )
        assert stream.step == 20
        # The worker's metrics, on the port asked for: what was trained, what waits, how fresh.
        assert stream.metrics_port == port
        last = scraped[-1]
        assert last["streamer_samples_trained_total"] == 20 * BATCH
        assert last["streamer_consumer_lag_records"] == 2000 - 20 * BATCH
        assert last["streamer_partition_last_trained_timestamp_seconds"] > 0
        # Each step's wait for its batch, measured (one step a call: known).
        assert last["streamer_input_wait_seconds_count"] == 20
        emitted = stream._input.source.records_emitted
        assert emitted > 20 * BATCH, "the test needs records read ahead of training"
        assert committed_total(kafka_bootstrap, group_id, topic4) == 20 * BATCH
        exactly_once_prefix(read_audit(audit, topic4), kafka_bootstrap, group_id, topic4)
        # A second fit with the same stream goes on from what was trained, not what was read.
        model.fit(stream.dataset(), steps_per_epoch=5, callbacks=[stream.callback()], verbose=0)
        assert committed_total(kafka_bootstrap, group_id, topic4) == 25 * BATCH
    # A new Stream of the same group (a restart) goes on from the commits.
    with streamer.Stream(**settings) as stream:
        model = default_model(stream.schema)
        model.fit(stream.dataset(), steps_per_epoch=7, callbacks=[stream.callback()], verbose=0)
    counts = read_audit(audit, topic4)
    assert sum(counts.values()) == 32 * BATCH
    exactly_once_prefix(counts, kafka_bootstrap, group_id, topic4)


def test_steps_per_execution_class_weight_and_keras_callbacks_beside_ours(
    kafka_bootstrap: str, make_topic, group_id: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, {0: 600, 1: 600}, binary=True)
    audit = tmp_path / "audit.log"
    with streamer.Stream(
        bootstrap=kafka_bootstrap,
        topic=topic,
        group=group_id,
        batch_size=BATCH,
        audit_log=str(audit),
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_every_steps=6,
    ) as stream:
        model = default_model(stream.schema)
        model.compile(optimizer="adam", loss="mse", steps_per_execution=4)
        saved = tmp_path / "keras.weights.h5"
        model.fit(
            stream.dataset(),
            steps_per_epoch=10,
            epochs=3,
            class_weight={0: 1.0, 1: 3.0},
            callbacks=[
                stream.callback(),
                keras.callbacks.ModelCheckpoint(str(saved), save_weights_only=True, save_freq=4),
                keras.callbacks.EarlyStopping(monitor="loss", patience=1),
            ],
            verbose=0,
        )
        trained = int(model.optimizer.iterations.numpy())  # Keras' own count of steps
        assert stream.step == trained
        assert saved.exists()
    # steps_per_execution 4 over 10 steps an epoch: Keras runs whole calls of 4.
    assert trained % 4 == 0 and trained >= 12
    counts = read_audit(audit, topic)
    assert sum(counts.values()) == trained * BATCH
    exactly_once_prefix(counts, kafka_bootstrap, group_id, topic)
    latest = sorted((tmp_path / "ckpt").glob("ckpt-*.index"))
    assert latest, "no checkpoint written"


def test_a_fit_that_raises_keeps_what_it_trained_and_the_next_fit_goes_on(
    kafka_bootstrap: str, topic4: str, group_id: str, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.log"

    class Fails(keras.callbacks.Callback):  # a user's callback, after ours
        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if batch == 6:
                raise RuntimeError("a bug in the user's callback")

    import tensorflow as tf

    with streamer.Stream(
        bootstrap=kafka_bootstrap,
        topic=topic4,
        group=group_id,
        batch_size=BATCH,
        audit_log=str(audit),
    ) as stream:
        # Built under a distribution strategy: Keras takes a batch from an iterator of its
        # own before training (its symbolic build), which must not count.
        with tf.distribute.MirroredStrategy().scope():
            model = default_model(stream.schema)
        with pytest.raises(RuntimeError, match="user's callback"):
            model.fit(
                stream.dataset(),
                steps_per_epoch=50,
                callbacks=[stream.callback(), Fails()],
                verbose=0,
            )
        assert stream.step == 7
        model.fit(stream.dataset(), steps_per_epoch=5, callbacks=[stream.callback()], verbose=0)
        assert stream.step == 12
    counts = read_audit(audit, topic4)
    assert sum(counts.values()) == 12 * BATCH
    exactly_once_prefix(counts, kafka_bootstrap, group_id, topic4)


def test_a_custom_loop_commits_what_it_gave_back(
    kafka_bootstrap: str, topic4: str, group_id: str, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.log"
    settings = dict(
        bootstrap=kafka_bootstrap,
        topic=topic4,
        group=group_id,
        batch_size=BATCH,
        audit_log=str(audit),
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    with streamer.Stream(**settings) as stream:
        model = default_model(stream.schema)
        for i, batch in enumerate(stream.batches(model)):
            if i == 7:
                break  # read, not trained: never committed
            logs = model.train_on_batch(*batch.data, return_dict=True)
            stream.trained(batch, loss=logs["loss"])
        assert stream.step == 7
        # The loop's end checkpointed the model with the stream position.
        assert (tmp_path / "ckpt" / "ckpt-7.index").exists()
    assert committed_total(kafka_bootstrap, group_id, topic4) == 7 * BATCH
    exactly_once_prefix(read_audit(audit, topic4), kafka_bootstrap, group_id, topic4)
    # Restarted: the checkpoint's step and position.
    with streamer.Stream(**settings) as stream:
        model = default_model(stream.schema)
        model.fit(
            stream.dataset(model), steps_per_epoch=3, callbacks=[stream.callback()], verbose=0
        )
        assert stream.step == 10
    counts = read_audit(audit, topic4)
    assert sum(counts.values()) == 10 * BATCH
    exactly_once_prefix(counts, kafka_bootstrap, group_id, topic4)


FIT_SCRIPT = """
import sys, streamer
from streamer.train.model import default_model
bootstrap, topic, group, audit = sys.argv[1:5]
stream = streamer.Stream(bootstrap=bootstrap, topic=topic, group=group, batch_size=32,
                         audit_log=audit, commit_every_steps=2, commit_every_seconds=0.5)
model = default_model(stream.schema)
model.fit(stream.dataset(), steps_per_epoch=int(sys.argv[5]), epochs=int(sys.argv[6]),
          callbacks=[stream.callback()], verbose=0)
print("STEPS", stream.step, flush=True)
stream.close()
"""


def test_kill_9_during_fit_loses_nothing(
    kafka_bootstrap: str, topic4: str, group_id: str, tmp_path: Path
) -> None:
    script = tmp_path / "fit.py"
    script.write_text(FIT_SCRIPT)
    first = tmp_path / "first.log"
    proc = subprocess.Popen(
        [sys.executable, str(script), kafka_bootstrap, topic4, group_id, str(first), "1000", "1"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while committed_total(kafka_bootstrap, group_id, topic4) < 300:
            assert proc.poll() is None, "the fit ended before it was killed"
            assert time.monotonic() < deadline, "nothing committed in 120 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    at_kill = committed_total(kafka_bootstrap, group_id, topic4)
    assert 300 <= at_kill < 2000
    # The rest, from the group's commits: the dataset ends once the topic is drained.
    second = tmp_path / "second.log"
    with streamer.Stream(
        bootstrap=kafka_bootstrap,
        topic=topic4,
        group=group_id,
        batch_size=BATCH,
        audit_log=str(second),
        idle_timeout=3.0,
    ) as stream:
        model = default_model(stream.schema)
        model.fit(stream.dataset(), epochs=1, callbacks=[stream.callback()], verbose=0)
    before, after = read_audit(first, topic4), read_audit(second, topic4)
    everything = {(p, o) for p in range(4) for o in range(500)}
    missing = everything - before.keys() - after.keys()
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:5]}"
    assert max(after.values()) == 1
    # The second run began at the commits: what the killed run trained after its last
    # commit is trained again (at least once without a checkpoint), nothing before it.
    assert sum(after.values()) == 2000 - at_kill
    assert committed_total(kafka_bootstrap, group_id, topic4) == 2000


JAX_SCRIPT = """
import os, sys
os.environ["KERAS_BACKEND"] = "jax"
import keras, streamer
from streamer.train.model import default_model
assert keras.backend.backend() == "jax", keras.backend.backend()
bootstrap, topic, group, audit = sys.argv[1:5]
with streamer.Stream(bootstrap=bootstrap, topic=topic, group=group, batch_size=32,
                     audit_log=audit, commit_every_steps=3) as stream:
    model = default_model(stream.schema)
    model.fit(stream.dataset(), steps_per_epoch=6, epochs=2, callbacks=[stream.callback()],
              verbose=0)
    model.fit(stream.dataset(), steps_per_epoch=4, callbacks=[stream.callback()], verbose=0)
    print("STEPS", stream.step, int(model.optimizer.iterations.numpy()), flush=True)
"""


def test_a_jax_backend_model_fits_from_the_stream_with_exact_commits(
    kafka_bootstrap: str, topic4: str, group_id: str, tmp_path: Path
) -> None:
    script = tmp_path / "fit_jax.py"
    script.write_text(JAX_SCRIPT)
    audit = tmp_path / "audit.log"
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, str(script), kafka_bootstrap, topic4, group_id, str(audit)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("STEPS"))
    assert line.split()[1:] == ["16", "16"]
    counts = read_audit(audit, topic4)
    assert sum(counts.values()) == 16 * BATCH
    exactly_once_prefix(counts, kafka_bootstrap, group_id, topic4)


# ---- settings (no broker) -------------------------------------------------------------------


def test_settings_are_the_worker_options_by_name_and_bad_ones_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"batch_sise.*did you mean batch_size"):
        streamer.Stream(batch_sise=3)
    with pytest.raises(ConfigError, match=r"steps_per_execution.*model\.compile"):
        streamer.Stream(steps_per_execution=4)
    with pytest.raises(ConfigError, match=r"max_steps=5.*steps_per_epoch"):
        toml = tmp_path / "loop.toml"
        toml.write_text("max_steps = 5\n")
        streamer.Stream.from_config(toml)
    with pytest.raises(ConfigError, match="batch_size"):
        streamer.Stream(batch_size=0)


def test_from_config_and_the_environment_with_the_worker_precedence(tmp_path: Path) -> None:
    path = tmp_path / "streamer.toml"
    path.write_text('batch_size = 8\nshards = 1\ntopic = "from-file"\n')
    env = {"STREAMER_BATCH_SIZE": "16"}
    with streamer.Stream.from_config(path, env=env, topic="from-keyword") as stream:
        assert stream.config.batch_size == 16  # the variable over the file
        assert stream.config.shards == 1
        assert stream.config.topic == "from-keyword"  # a keyword over both
        assert stream.metrics_port is None  # a library serves no port unless asked
        model = default_model(stream.schema)
        model.fit(stream.dataset(), steps_per_epoch=3, callbacks=[stream.callback()], verbose=0)
        assert stream.step == 3


def test_a_schema_object_and_the_simulator_with_sample_weight(tmp_path: Path) -> None:
    schema = SimulatorTask().schema()
    with streamer.Stream(schema=schema, batch_size=4) as stream:
        x, y = next(iter(stream.dataset()))
        assert set(x) == {"x"} and x["x"].shape == (4, 16) and y.shape == (4,)
    with pytest.raises(ConfigError, match="passwords are sasl_password=") as info:
        streamer.Stream(sasl_pasword="hunter2")
    assert "hunter2" not in str(info.value)


def test_the_example_script_fits_from_kafka_and_goes_on_from_its_checkpoint(
    kafka_bootstrap: str, topic4: str, group_id: str, tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[2]
    args = [
        sys.executable,
        str(root / "examples" / "fit_from_kafka.py"),
        "--bootstrap",
        kafka_bootstrap,
        "--topic",
        topic4,
        "--group",
        group_id,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--batch-size",
        str(BATCH),
        "--steps-per-epoch",
        "5",
        "--epochs",
        "2",
    ]
    for run, steps in ((1, 10), (2, 20)):
        out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"trained {steps} steps" in out.stdout, (run, out.stdout)
        assert committed_total(kafka_bootstrap, group_id, topic4) == steps * BATCH


def test_strings_and_variable_length_features_reach_fit_and_a_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from examples.recommender import build

    # The worker's environment beside a script: its loop's settings are not a Stream's.
    with streamer.Stream(
        sim_task="recommender", batch_size=16, env={"STREAMER_STATUS_INTERVAL": "3"}
    ) as stream:
        assert "STREAMER_STATUS_INTERVAL ignored" in caplog.text
        model = build(stream.schema)
        model.fit(
            stream.dataset(model), steps_per_epoch=3, callbacks=[stream.callback()], verbose=0
        )
        for batch in stream.batches(model):
            assert batch.x["items"].shape.rank == 2  # ragged: [batch, None]
            model.train_on_batch(*batch.data)
            stream.trained(batch)
            if stream.step == 5:
                break
        assert sum(stream.position().values()) == 5 * 16


def test_between_fits_the_script_is_not_a_stall_and_not_ready() -> None:
    """A script evaluates or exports between fits for as long as it likes: /healthz stays
    200 (a liveness probe must not restart it), /readyz says it is not training."""
    import urllib.error
    import urllib.request

    port = free_port()
    with streamer.Stream(batch_size=8, metrics_port=port, stall_timeout=1.0) as stream:
        model = default_model(stream.schema)
        model.fit(stream.dataset(), steps_per_epoch=2, callbacks=[stream.callback()], verbose=0)
        time.sleep(2.5)  # past stall_timeout, doing "something else"
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10)
        assert health.status == 200
        with pytest.raises(urllib.error.HTTPError) as ready:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert ready.value.code == 503 and b"between passes" in ready.value.read()


def test_one_iteration_at_a_time_and_a_refused_model_can_be_fixed(tmp_path: Path) -> None:
    """validation_data=stream.dataset() would mix a second iterator's batches into what the
    callback acknowledges: refused, naming the fix. A model refused at train begin (no
    weights yet to restore into) is bound once fixed, with its checkpoint."""

    class Unbuilt(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x: dict[str, object]) -> object:
            return self.dense(x["x"])

    with streamer.Stream(batch_size=8, checkpoint_dir=str(tmp_path / "ckpt")) as stream:
        model = Unbuilt()
        model.compile(optimizer="adam", loss="mse")
        with pytest.raises(ConfigError, match="no weights yet"):
            model.fit(stream.dataset(), steps_per_epoch=2, callbacks=[stream.callback()])
        model({"x": np.zeros((1, 16), np.float32)})  # built now
        model.fit(stream.dataset(), steps_per_epoch=2, callbacks=[stream.callback()], verbose=0)
        assert stream.step == 2 and (tmp_path / "ckpt" / "ckpt-2.index").exists()
        with pytest.raises(Exception, match="one iteration at a time"):
            model.fit(
                stream.dataset(),
                steps_per_epoch=2,
                validation_data=stream.dataset(),
                validation_steps=1,
                callbacks=[stream.callback()],
                verbose=0,
            )


def test_the_worker_loop_settings_from_the_environment_are_not_applied() -> None:
    with streamer.Stream(env={"STREAMER_PASS_RECORDS": "16", "STREAMER_MAX_STEPS": "3"}) as s:
        assert s.config.pass_records is None and s.config.max_steps is None
