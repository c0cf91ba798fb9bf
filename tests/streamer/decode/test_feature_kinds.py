"""Records as producers write them: ragged, padded, string and optional features end to end.

Against the real broker, every record is written by plain ``msgpack.packb`` in the test (never
through our simulator or encoder): lists of ids of any length, str and bin strings, fields
left out, fields the schema does not know. The first test reads them through the real
StreamSource (with a shuffle window) and checks every value of every record; the second
trains the example recommender model on them in a real worker process, evaluates, exports,
and calls the exported SavedModel with the same inputs. The last ones run the embedded
simulator's recommender task, and random records of a schema file, in-process.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import tensorflow as tf
from kafka import KafkaProducer

from consumers.settings import ConsumerSettings
from streamer.decode.schema import Schema
from streamer.input.pipeline import PipelineSettings
from streamer.input.source import StreamSource
from streamer.worker import Worker
from tests.workerutil import (
    WorkerProcess,
    all_records,
    end_offsets,
    read_audit,
    run_in_process,
    worker_args,
)

KINDS_TOML = """
label = "y"

[features.user]
dtype = "string"

[features.items]
dtype = "int64"
shape = [-1]
max_len = 10
default = []

[features.clicks]
dtype = "float32"
shape = [-1, 2]
pad_to = 3
pad_value = -1.0
default = []

[features.tags]
dtype = "string"
shape = [-1]
max_len = 4
default = []

[features.country]
dtype = "string"
default = "unknown"

[features.x]
dtype = "float32"
shape = [4]

[features.y]
dtype = "float32"
"""


def _record(i: int) -> dict[str, Any]:
    """Record ``i`` as a producer writes it; ``y`` = i identifies it after the shuffle."""
    record: dict[str, Any] = {
        # bin for every fifth: bytes that need not be UTF-8
        "user": f"u{i}" if i % 5 else f"u{i}\xff".encode("latin-1"),
        "x": np.arange(i, i + 4, dtype="<f4").tobytes(),
        "y": float(i),
        "added_later": {"by": "a newer producer", "n": [i]},  # unknown: ignored
    }
    if i % 11:
        record["items"] = list(range(i % 11))  # 1..10 ids; left out when empty
    if i % 5:
        record["clicks"] = [[float(i), float(r)] for r in range(i % 5)]  # 1..4 rows, pad_to 3
    if i % 3:
        record["tags"] = ["t\u00e9", f"#{i}"][: i % 3]
    if i % 2:
        record["country"] = "fr"
    return record


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10)
    try:
        for n, value in enumerate(values):
            producer.send(topic, value=value, partition=n % partitions)
        producer.flush(60)
    finally:
        producer.close(timeout=30)


@pytest.mark.kafka
def test_every_feature_kind_arrives_through_the_real_source_with_a_shuffle_window(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    schema = Schema.from_toml_text(KINDS_TOML)
    n = 600
    topic = make_topic(3)
    values = [msgpack.packb(_record(i)) for i in range(n)]
    too_many_items = msgpack.packb({**_record(1), "items": list(range(11))})
    not_utf8 = msgpack.packb({**_record(2), "tags": ["\x01\x02"]}).replace(
        b"\xa2\x01\x02", b"\xa2\xff\xfe"
    )
    _produce(kafka_bootstrap, topic, [*values[:300], too_many_items, not_utf8, *values[300:]], 3)

    cs = ConsumerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group_id,
        num_shards=2,
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
        max_poll_records=100,
    )
    pipeline = PipelineSettings(
        num_shards=2, batch_size=64, idle_timeout_seconds=3, shuffle_buffer=200
    )
    source = StreamSource(schema, pipeline, consumer=cs)
    rows: dict[int, dict[str, Any]] = {}
    arrival: list[int] = []
    for batch in source.dataset():
        assert isinstance(batch["items"], tf.RaggedTensor)
        assert isinstance(batch["tags"], tf.RaggedTensor)
        assert batch["items"].dtype == tf.int64 and batch["tags"].dtype == tf.string
        assert batch["user"].dtype == tf.string and batch["user"].shape.rank == 1
        assert batch["clicks"].shape[1:] == (3, 2) and batch["clicks_length"].dtype == tf.int32
        source.tracker.ack(batch["partition"].numpy(), batch["offset"].numpy())
        cols = {
            "user": batch["user"].numpy().tolist(),
            "items": batch["items"].to_list(),
            "clicks": batch["clicks"].numpy().tolist(),
            "clicks_length": batch["clicks_length"].numpy().tolist(),
            "tags": batch["tags"].to_list(),
            "country": batch["country"].numpy().tolist(),
            "x": batch["x"].numpy().tolist(),
        }
        for r, y in enumerate(batch["y"].numpy().tolist()):
            i = int(y)
            assert i not in rows, f"record {i} delivered twice"
            rows[i] = {k: v[r] for k, v in cols.items()}
            arrival.append(i)
    source.close()

    assert sorted(rows) == list(range(n))
    assert source.records_rejected == 2
    assert arrival != sorted(arrival)  # the window mixed them
    for i, got in rows.items():
        sent = _record(i)
        user = sent["user"]
        assert got["user"] == (user if isinstance(user, bytes) else user.encode()), i
        assert got["items"] == sent.get("items", []), i
        clicks = sent.get("clicks", [])[:3]
        assert got["clicks_length"] == len(clicks), i
        assert got["clicks"] == clicks + [[-1.0, -1.0]] * (3 - len(clicks)), i
        assert got["tags"] == [t.encode() for t in sent.get("tags", [])], i
        assert got["country"] == (b"fr" if i % 2 else b"unknown"), i
        assert got["x"] == [float(i + k) for k in range(4)], i


# ---- the recommender, end to end through a worker process ------------------------------------

RECOMMENDER_TOML = """
label = "y"

[features.user]
dtype = "string"

[features.items]
dtype = "int64"
shape = [-1]
max_len = 50
default = []

[features.x]
dtype = "float32"
shape = [8]

[features.y]
dtype = "float32"
"""

_HIDDEN = np.random.default_rng(42)
_BIAS = _HIDDEN.normal(size=200)
_SCORE = 2.0 * _HIDDEN.normal(size=500)
_W = _HIDDEN.normal(size=8) / math.sqrt(8)
_EVAL = re.compile(r"eval step=(\d+) loss=(\S+) records=(\d+) seconds=\S+ mae=(\S+)")


def _recommender_samples(n: int, seed: int) -> list[dict[str, Any]]:
    """Plain Python records; y = tanh(0.8 bias[user] + mean(score[items]) + 0.5 x.w)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        user = int(rng.integers(0, len(_BIAS)))
        items = rng.integers(0, len(_SCORE), size=int(rng.integers(0, 51))).tolist()
        x = rng.normal(size=8).astype(np.float32)
        mean = float(_SCORE[items].mean()) if items else 0.0
        y = math.tanh(0.8 * _BIAS[user] + mean + 0.5 * float(x @ _W))
        record: dict[str, Any] = {"user": f"user-{user}", "x": x.tolist(), "y": y}
        if items:
            record["items"] = items
        out.append(record)
    return out


def _inputs(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "user": tf.constant([s["user"] for s in samples]),
        "items": tf.ragged.constant([s.get("items", []) for s in samples], dtype=tf.int64),
        "x": tf.constant([s["x"] for s in samples], dtype=tf.float32),
    }


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_recommender_trains_end_to_end_and_its_export_serves_the_same_inputs(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    schema_file = tmp_path / "recommender.toml"
    schema_file.write_text(RECOMMENDER_TOML)
    topic = make_topic(2)
    eval_topic = make_topic(1)
    train = _recommender_samples(12_000, seed=1)
    _produce(kafka_bootstrap, topic, [msgpack.packb(s) for s in train], 2)
    _produce(
        kafka_bootstrap, eval_topic, [msgpack.packb(s) for s in _recommender_samples(512, 2)], 1
    )
    audit = tmp_path / "audit.csv"
    export_dir = tmp_path / "models"
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        audit,
        shards=2,
        batch_size=64,
        extra=[
            *("--schema", str(schema_file), "--model", "examples.recommender:build"),
            *("--shuffle-buffer", "1000", "--export-dir", str(export_dir)),
            *("--eval-topic", eval_topic, "--eval-records", "512", "--eval-every-steps", "60"),
        ],
    )
    worker = WorkerProcess.start(args, tmp_path / "worker.log")
    assert worker.wait(240) == 0, worker.tail()

    counts = read_audit(audit, topic)
    assert set(counts) == all_records(end_offsets(kafka_bootstrap, topic)), worker.tail()
    evals = [(int(s), float(loss), int(n)) for s, loss, n, _ in _EVAL.findall(worker.log())]
    assert len(evals) >= 2 and all(n == 512 for _, _, n in evals), worker.tail()
    assert evals[-1][1] < evals[0][1], evals  # the held-out loss falls

    versions = sorted(int(v) for v in (p.name for p in export_dir.iterdir()) if v.isdigit())
    assert versions, list(export_dir.iterdir())
    loaded = tf.saved_model.load(str(export_dir / str(versions[-1])))
    fresh = _recommender_samples(256, seed=3)
    fresh[0].pop("items", None)  # an example without items, as the worker saw them
    inputs = _inputs(fresh)
    # The serve function takes the model's own inputs: the same ragged ids as in training.
    pred = loaded.serve(inputs).numpy()
    # The serving signature takes them flat: values and row lengths, named after the feature.
    signature = loaded.signatures["serving_default"]
    (flat,) = signature(
        user=inputs["user"],
        items=inputs["items"].values,
        items_row_lengths=inputs["items"].row_lengths(),
        x=inputs["x"],
    ).values()
    assert pred.shape == (256, 1)
    np.testing.assert_allclose(flat.numpy(), pred, rtol=1e-5, atol=1e-6)
    labels = np.array([s["y"] for s in fresh])
    mse = float(np.mean((pred[:, 0] - labels) ** 2))
    assert mse < 0.7 * float(np.var(labels)), (mse, float(np.var(labels)))


# ---- the embedded simulator -------------------------------------------------------------------


def _run_in_process(**options: Any) -> Worker:
    code, worker, log = run_in_process(**{"shards": 2, "batch_size": 64, **options})
    assert code == 0, log
    return worker  # type: ignore[no-any-return]


@pytest.mark.timeout(180)
def test_embedded_recommender_task_trains_and_a_schema_of_ones_own_gets_random_records(
    tmp_path: Path,
) -> None:
    worker = _run_in_process(
        sim_task="recommender", model="examples.recommender:build", max_steps=30
    )
    assert worker.step == 30 and math.isfinite(worker.loss)
    assert worker.metrics.snapshot()["decode_errors"] == 0
    # A schema file without --bootstrap: random valid records of it, every kind decoded.
    schema = tmp_path / "kinds.toml"
    schema.write_text(KINDS_TOML)
    worker = _run_in_process(schema=str(schema), model="examples.recommender:build", max_steps=10)
    assert worker.step == 10 and math.isfinite(worker.loss)
    assert worker.metrics.snapshot()["decode_errors"] == 0
