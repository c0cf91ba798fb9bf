"""A user's compiled Keras model through ``streamer run`` against the real broker: trained as
``model.fit`` trains it, and never poisoned by a NaN or Inf (DESIGN.md section 4a)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import keras
import msgpack
import numpy as np
import pytest
import tensorflow as tf

from streamer.decode.records import encode_record
from streamer.decode.schema import Schema
from streamer.train.trainer import nonfinite_variables
from tests.streamer.train import keras_models as km
from tests.workerutil import (
    ROOT,
    WorkerProcess,
    committed_offsets,
    read_audit,
    worker_args,
)

pytestmark = pytest.mark.kafka

ROWS = 8 * 32 + 7


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for v in values:
        producer.send(topic, value=v, partition=0)
    producer.flush(60)
    producer.close()


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, 8)).astype(np.float32)
    return {
        "x": x,
        "y": (x @ rng.normal(size=8)).astype(np.float32),
        "w": rng.uniform(0.0, 2.0, size=ROWS).astype(np.float32),
    }


def _records(schema: Schema, data: dict[str, np.ndarray]) -> list[bytes]:
    names = schema.feature_names
    return [encode_record(schema, {n: data[n][i] for n in names}) for i in range(ROWS)]


def _schema_file(tmp_path: Path, schema: Schema) -> Path:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema.to_dict()), encoding="utf-8")
    return path


def _checkpointed_model(build: Any, schema: Schema, directory: Path) -> keras.Model:
    model = build(schema)
    checkpoint = tf.train.Checkpoint(model=model)
    checkpoint.restore(tf.train.latest_checkpoint(str(directory))).expect_partial()
    return model


def _run(args: list[str], log: Path, timeout: float = 240) -> WorkerProcess:
    worker = WorkerProcess.start(args, log, env_extra={"PYTHONPATH": str(ROOT)})
    worker.wait(timeout)
    return worker


def test_streamer_run_trains_a_compiled_model_exactly_as_model_fit(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    """Sample weights from the schema, a [batch, 1] head, ``loss="mse"``: the checkpoint of
    ``streamer run`` equals ``model.fit`` over the same records in the same order."""
    schema = km.schema_regression(weight=True)
    data = _data()
    topic = make_topic(1)
    _produce(kafka_bootstrap, topic, _records(schema, data))
    ckpt = tmp_path / "ckpt"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        None,
        shards=1,
        batch_size=32,
        stop_after_idle=4,
        checkpoint_dir=ckpt,
        extra=[
            "--schema",
            str(_schema_file(tmp_path, schema)),
            "--model",
            "tests.streamer.train.keras_models:build_weighted",
            "--shard-runtime",
            "thread",
        ],
    )
    worker = _run(args, tmp_path / "w.log")
    assert worker.wait(1) == 0, worker.tail()
    assert worker.stopped() is not None and worker.stopped()[1] == 9, worker.tail()  # type: ignore[index]
    trained = _checkpointed_model(km.build_weighted, schema, ckpt)
    keras.utils.set_random_seed(km.SEED)
    reference = km.build_weighted(schema)
    reference.fit(
        {"x": data["x"]},
        data["y"],
        sample_weight=data["w"],
        batch_size=32,
        epochs=1,
        shuffle=False,
        verbose=0,
    )
    worst = 0.0
    for a, b in zip(trained.get_weights(), reference.get_weights(), strict=True):
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12)))
    print(f"streamer run against model.fit: weights rel diff {worst:.2e}")
    assert worst < 1e-5
    assert committed_offsets(kafka_bootstrap, group_id, topic) == {0: ROWS}


def _bad_records(schema: Schema) -> dict[str, bytes]:
    """One record of each kind of non-finite value, in the encodings producers use."""
    x = np.ones(8, np.float32)
    nan_x = x.copy()
    nan_x[3] = np.nan
    return {
        "NaN label (msgpack float)": msgpack.packb({"x": x.tobytes(), "y": math.nan}),
        "NaN in a raw bin vector": msgpack.packb({"x": nan_x.tobytes(), "y": 1.0}),
        "Inf msgpack float in a list": msgpack.packb(
            {"x": [1.0, 1.0, math.inf, 1.0, 1.0, 1.0, 1.0, 1.0], "y": 1.0}
        ),
        "-Inf as a float64 scalar": b"\x82\xa1x\xc4\x20"
        + x.tobytes()
        + b"\xa1y\xcb"
        + struct.pack(">d", -math.inf),
    }


def test_nan_and_inf_records_are_dead_lettered_and_never_reach_the_weights(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    schema = km.schema_regression()
    data = _data(1)
    good = _records(schema, data)
    bad = _bad_records(schema)
    values = good[:100] + list(bad.values()) + good[100:]
    bad_offsets = set(range(100, 100 + len(bad)))
    topic = make_topic(1)
    dlq = f"{topic}-dlq"
    _produce(kafka_bootstrap, topic, values)
    ckpt, export, audit = tmp_path / "ckpt", tmp_path / "export", tmp_path / "audit.csv"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        audit,
        shards=1,
        batch_size=32,
        stop_after_idle=4,
        checkpoint_dir=ckpt,
        extra=[
            "--schema",
            str(_schema_file(tmp_path, schema)),
            "--model",
            "tests.streamer.train.keras_models:build_string_loss",
            "--dead-letter-topic",
            dlq,
            "--export-dir",
            str(export),
            "--export-every-steps",
            "4",
        ],
    )
    worker = _run(args, tmp_path / "w.log")
    assert worker.wait(1) == 0, worker.tail()
    log = worker.log()
    assert log.count("rejected record") == len(bad), log[-3000:]
    assert "dtype" in log
    # Every good record trained once, no bad one; the commit covers them all.
    counts = read_audit(audit, topic)
    assert {o for _, o in counts} == set(range(len(values))) - bad_offsets
    assert set(counts.values()) == {1}
    assert committed_offsets(kafka_bootstrap, group_id, topic) == {0: len(values)}
    # Finite checkpoint and exports; the dead letters name the reason.
    model = _checkpointed_model(km.build_string_loss, schema, ckpt)
    assert not nonfinite_variables(model.variables)
    versions = sorted(p for p in export.iterdir() if p.name.isdigit())
    assert versions
    for version in versions:
        loaded = tf.saved_model.load(str(version))
        assert not nonfinite_variables(loaded.variables), version
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        dlq,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    letters = list(consumer)
    consumer.close()
    assert len(letters) == len(bad)
    reasons = {dict(m.headers)["streamer.reason"] for m in letters}
    assert reasons == {b"dtype"}


def test_a_skipped_steps_records_go_to_the_dead_letter_topic_whole(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    """A finite but extreme label (3e38) overflows the loss: the step is skipped (nothing
    applied) and, once a later step is applied, its records, good ones included, are written
    to the dead-letter topic (reason nonfinite_step) with their keys, not committed past
    silently; every other record trains once and the group commits the end."""
    from kafka import KafkaConsumer, KafkaProducer

    schema = km.schema_regression()
    data = _data(3)
    data["y"][70] = 3e38
    values = _records(schema, data)
    topic = make_topic(1)
    dlq = f"{topic}-dlq"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    for i, v in enumerate(values):
        producer.send(topic, key=b"k%d" % i, value=v, partition=0)
    producer.flush(60)
    producer.close()
    audit = tmp_path / "audit.csv"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        audit,
        shards=1,
        batch_size=32,
        stop_after_idle=4,
        extra=[
            "--schema",
            str(_schema_file(tmp_path, schema)),
            "--model",
            "tests.streamer.train.keras_models:build_string_loss",
            "--dead-letter-topic",
            dlq,
        ],
    )
    worker = _run(args, tmp_path / "w.log")
    assert worker.wait(1) == 0, worker.tail()
    log = worker.log()
    assert log.count("update skipped") == 1, log[-3000:]
    assert f"go to the dead-letter topic {dlq!r} (reason nonfinite_step)" in log
    trained = read_audit(audit, topic)
    untrained = set(range(ROWS)) - {o for _, o in trained}
    assert 70 in untrained and len(untrained) == 32, sorted(untrained)
    consumer = KafkaConsumer(
        dlq,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    letters = list(consumer)
    consumer.close()
    by_offset = {int(dict(m.headers)["streamer.input.source.offset"]): m for m in letters}
    assert set(by_offset) == untrained
    for offset, letter in by_offset.items():
        assert dict(letter.headers)["streamer.reason"] == b"nonfinite_step"
        assert (letter.key, letter.value) == (b"k%d" % offset, values[offset])
    assert committed_offsets(kafka_bootstrap, group_id, topic) == {0: ROWS}


def test_a_diverging_model_stops_with_exit_3_and_keeps_the_last_good_checkpoint(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    """A learning rate that overflows: steps are skipped (never applied), counted, and after
    --max-nonfinite-steps in a row the worker stops; no checkpoint of the diverged model."""
    schema = km.schema_regression()
    data = _data(2)
    topic = make_topic(1)
    _produce(kafka_bootstrap, topic, _records(schema, data))
    ckpt, export = tmp_path / "ckpt", tmp_path / "export"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        None,
        shards=1,
        batch_size=16,
        stop_after_idle=30,
        checkpoint_dir=ckpt,
        checkpoint_every_steps=1,
        extra=[
            "--schema",
            str(_schema_file(tmp_path, schema)),
            "--model",
            "tests.streamer.train.keras_models:build_diverging",
            "--max-nonfinite-steps",
            "3",
            "--export-dir",
            str(export),
            "--export-every-steps",
            "1",
        ],
    )
    worker = _run(args, tmp_path / "w.log")
    code = worker.wait(1)
    log = worker.log()
    assert code == 3, log[-4000:]
    assert "the model diverged: 3 steps in a row" in log
    assert log.count("update skipped") == 3
    checkpoints = worker.checkpoints()
    assert checkpoints, log[-3000:]
    # The last checkpoint was written before the run of skipped steps, with finite weights.
    model = _checkpointed_model(km.build_diverging, schema, ckpt)
    assert not nonfinite_variables(model.variables)
    step = tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64))
    step.restore(tf.train.latest_checkpoint(str(ckpt))).expect_partial()
    # Nothing committed past what the last checkpoint trained.
    committed = committed_offsets(kafka_bootstrap, group_id, topic).get(0) or 0
    assert committed <= 16 * int(step.step.numpy())
    assert committed < ROWS
    # No export of the diverged model either: every version served holds finite weights.
    versions = sorted(p for p in export.iterdir() if p.name.isdigit())
    assert versions, log[-3000:]
    for version in versions:
        loaded = tf.saved_model.load(str(version))
        assert not nonfinite_variables(loaded.variables), version
