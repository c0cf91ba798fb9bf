"""`streamer bench --json` smoke run on a small topic: it completes and reports every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(600)
def test_bench_json_reports_every_figure(kafka_bootstrap: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamer.cli",
            "bench",
            "--bootstrap",
            kafka_bootstrap,
            "--records",
            "3000",
            "--record-bytes",
            "256",
            "--shards",
            "2",
            "--repeats",
            "2",
            "--naive-records",
            "600",
            "--soak-seconds",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["records"] == 3000 and out["shards"] == 2
    assert set(out["modes"]) == {
        "raw",
        "naive",
        "pipeline",
        "pipeline-shuffle",
        "pipeline-process",
        "worker",
        "worker-process",
    }
    for mode, m in out["modes"].items():
        assert m["repeats"] == 2, mode
        assert (
            0
            < m["records_per_second_min"]
            <= m["records_per_second_median"]
            <= m["records_per_second_max"]
        )
    assert out["ratio_pipeline_raw"] > 0
    assert out["ratio_pipeline_naive"] > 0
    assert out["ratio_pipeline_shuffle_pipeline"] > 0
    assert 0 <= out["worker_input_wait_fraction"] <= 1
    assert 0 <= out["worker_process_input_wait_fraction"] <= 1
    assert out["ratio_worker_process_worker"] > 0
    # Cost per record for every mode but naive: CPU of this process and of the shard
    # processes (only the process modes have them), the GIL (the probe is built here).
    costs = out["costs"]
    assert set(costs) == set(out["modes"]) - {"naive"}, costs
    for mode, c in costs.items():
        assert c["main_cpu_us_per_record"] > 0 and c["total_cpu_us_per_record"] > 0, (mode, c)
        # Thread shards have no child; a child's clock ticks every 10 ms (3,000 records).
        assert c["child_cpu_us_per_record"] >= 0, (mode, c)
        if not mode.endswith("-process"):
            assert c["child_cpu_us_per_record"] == 0, (mode, c)
        if os.environ.get("REQUIRE_NATIVE_DECODER"):  # CI: the GIL probe must be built
            assert c["gil_us_per_record"] > 0 and 0 < c["gil_held_fraction"] <= 1, (mode, c)
        assert c["ceiling_records_per_second"] > 0, (mode, c)
    assert out["ceiling_cores"] == 16
    soak = out["soak"]
    # Every soak pass reads the whole topic again: whole multiples of it, at least two passes.
    assert soak["passes"] >= 2 and soak["records"] == soak["passes"] * 3000, soak
    assert soak["seconds"] >= 3 and soak["rss_start_mib"] > 0 and soak["rss_end_mib"] > 0


def test_bench_confluent_modes_and_soak(kafka_bootstrap: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamer.cli",
            "bench",
            "--bootstrap",
            kafka_bootstrap,
            "--records",
            "3000",
            "--record-bytes",
            "256",
            "--shards",
            "2",
            "--repeats",
            "1",
            "--modes",
            "pipeline,raw-confluent,pipeline-confluent,pipeline-confluent-process,"
            "worker-confluent-process",
            "--steps-per-execution",
            "1,4",
            "--ceiling-cores",
            "8",
            "--soak-seconds",
            "3",
            "--soak-client",
            "confluent",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert all(m["records_per_second_median"] > 0 for m in out["modes"].values()), out
    assert out["ratio_pipeline_confluent_pipeline"] > 0
    assert out["ratio_pipeline_confluent_raw_confluent"] > 0
    assert 0 <= out["worker_confluent_process_input_wait_fraction"] <= 1
    # Each worker and pipeline mode again with 4 steps a call (batches taken in the graph).
    spe = {m for m in out["modes"] if m.endswith("+spe4")}
    assert spe == {
        "pipeline+spe4",
        "pipeline-confluent+spe4",
        "pipeline-confluent-process+spe4",
        "worker-confluent-process+spe4",
    }, out["modes"]
    assert out["ceiling_cores"] == 8 and set(out["costs"]) == set(out["modes"]), out["costs"]
    soak = out["soak"]
    assert soak["client"] == "confluent"
    assert soak["passes"] >= 2 and soak["records"] == soak["passes"] * 3000, soak


MIXED_TOML = """
label = "y"
[features.x]
dtype = "float32"
shape = [16]
[features.items]
dtype = "int64"
shape = [-1]
max_len = 50
[features.user]
dtype = "string"
[features.y]
dtype = "float32"
"""


@pytest.mark.timeout(300)
def test_bench_schema_measures_it_beside_fixed_shape_records(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    schema = tmp_path / "mixed.toml"
    schema.write_text(MIXED_TOML)
    args = ["--bootstrap", kafka_bootstrap, "--schema", str(schema), "--records", "1500"]
    args += ["--shards", "2", "--repeats", "1", "--modes", "raw,pipeline", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "streamer.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert set(out["modes"]) == {"raw", "pipeline", "fixed:raw", "fixed:pipeline"}
    assert out["task"] == str(schema) and out["baseline_topic"] != out["topic"]
    assert out["record_bytes"] > 64 + 10  # the mean size of the mixed records
    assert out["ratio_pipeline_fixed"] > 0 and out["ratio_raw_fixed"] > 0
    # A mode that needs the regression schema is refused for a schema of one's own.
    bad = subprocess.run(
        [sys.executable, "-m", "streamer.cli", "bench", *args[:4], "--modes", "worker"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "modes" in bad.stderr


@pytest.mark.timeout(300)
def test_bench_scaling_modes_ceilings_and_freshness(kafka_bootstrap: str) -> None:
    """mode@N runs N shards; the decode-only and TensorFlow-only ceilings; each mode with each
    decoder; freshness quantiles."""
    args = ["--bootstrap", kafka_bootstrap, "--records", "1500", "--repeats", "1", "--json"]
    args += ["--modes", "pipeline@1,pipeline-process@2,decode-only,tf-only"]
    args += ["--freshness-rates", "1000", "--freshness-seconds", "3"]
    args += ["--decoders", "auto,python"]
    proc = subprocess.run(
        [sys.executable, "-m", "streamer.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    modes = {"pipeline@1", "pipeline-process@2", "decode-only", "tf-only"}
    assert set(out["modes"]) == modes | {f"{m}/python" for m in modes}
    assert all(m["records_per_second_median"] > 0 for m in out["modes"].values()), out
    assert set(out["ratio_auto_to_python_decoder"]) == modes
    clients = {q["client"] for q in out["freshness"]}
    assert clients == {"kafka-python", "confluent"}
    for q in out["freshness"]:
        assert 0 < q["p50"] <= q["p90"] <= q["p99"] < 60, q


def test_the_checkpoint_benchmark_measures_both_models() -> None:
    """``python -m benchmarks.checkpoint`` builds its models as the product does (it once
    passed a loss and an optimizer to ModelBundle, which no longer takes them, and crashed),
    and measures both: run as its README says, from the repository's root."""
    root = Path(__file__).resolve().parents[2]
    command = ["benchmarks.checkpoint", "--big-mb", "0.2", "--saves", "1", "--steps", "3"]
    out = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {
        cells[0]: cells[1:]
        for line in out.stdout.splitlines()
        if line.startswith("| ") and "MB |" in line
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {"built-in MLP", "0.2 MB embedding"}, out.stdout
    weights, on_disk, save, restore, step = rows["0.2 MB embedding"]
    assert float(weights.split()[0]) > 0.2 and float(on_disk.split()[0]) > 0.2, rows
    assert float(save.split()[0]) >= 0 and float(restore.split()[0]) >= 0, rows
    assert float(step.split()[0]) > 0, rows
