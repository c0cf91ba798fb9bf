"""Files, endpoints and settings of a real worker on the real broker (issue 21, items 7-8).

- ``--export-dir`` that already holds what the worker did not write (a ``2019/`` with a
  report, a ``.tmp-notes/`` folder): the worker exports and prunes its own versions only.
- The metrics server of a running worker caps its connections: one too many is answered 503
  at once, and the server serves again when they close.
- A setting of the wrong type, from TOML, the environment or a flag: exit 2 with a message that
  names the setting, before the worker joins the group (nothing read, nothing committed).
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from streamer.input.simulator import produce
from streamer.ops.health import MAX_CONNECTIONS
from streamer.train.export import INFO_FILE
from tests.reliability.relutil import http_get, metrics_base, run_cli, start_worker
from tests.workerutil import committed_offsets, end_offsets, free_port, read_audit, worker_args

pytestmark = pytest.mark.kafka

RECORDS = 3000


def _get(url: str) -> int:
    return http_get(url, timeout=10)[0]


@pytest.mark.timeout(300)
def test_exports_prune_only_their_own_versions_and_idle_clients_hold_no_endpoint(
    kafka_bootstrap: str, make_topic: Any, group_id: str, tmp_path: Path
) -> None:
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, RECORDS, partitions=2)
    export_dir = tmp_path / "models"
    (export_dir / "2019").mkdir(parents=True)
    (export_dir / "2019" / "report.txt").write_text("mine", encoding="utf-8")
    (export_dir / ".tmp-notes").mkdir()
    (export_dir / ".tmp-notes" / "n.txt").write_text("notes", encoding="utf-8")
    audit = tmp_path / "audit.csv"
    args = worker_args(
        kafka_bootstrap, topic, group_id, audit, shards=2, batch_size=64, stop_after_idle=8,
        extra=[
            *("--metrics-port", str(free_port())),  # worker_args' 0 turns the server off
            *("--export-dir", str(export_dir), "--export-every-steps", "10"),
            *("--export-keep", "2"),
        ],
    )  # fmt: skip
    worker = start_worker(args, tmp_path / "worker.log")
    try:
        base = metrics_base(worker)
        # Idle and trickling connections hold no handler thread: the endpoints answer at once
        # (32 of them once made every answer 503 until they went away). Opened one at a
        # time on a loaded machine: the listen backlog holds what the accept loop has not
        # taken yet.
        port = int(base.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2 * MAX_CONNECTIONS)]
        try:
            for conn in idle[:MAX_CONNECTIONS]:
                conn.sendall(b"GET /met")  # and never the rest
            assert _get(base + "/metrics") == 200
            assert _get(base + "/healthz") == 200
        finally:
            for conn in idle:
                conn.close()
        code = worker.wait(180)
    finally:
        worker.kill()
    assert code == 0, worker.tail()
    assert sum(read_audit(audit, topic).values()) == RECORDS
    # What the worker did not write is untouched; of its own versions, the newest 2 are kept.
    assert (export_dir / "2019" / "report.txt").read_text(encoding="utf-8") == "mine"
    assert (export_dir / ".tmp-notes" / "n.txt").read_text(encoding="utf-8") == "notes"
    versions = sorted(int(p.name) for p in export_dir.iterdir() if (p / INFO_FILE).exists())
    assert len(versions) == 2 and 2019 not in versions, sorted(export_dir.iterdir())
    steps = RECORDS // 64
    assert versions[-1] >= steps, versions  # the last export at the stop: every step
    assert sorted(p.name for p in export_dir.iterdir()) == sorted(
        ["2019", ".tmp-notes", *map(str, versions)]
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("where", "setting", "named"),
    [
        # One per source (unit tests in tests/streamer/cli/test_config.py take every type).
        ("toml", "partitions = [1.9, 0.2]", "partitions"),
        ("env", "STREAMER_LEARNING_RATE=nan", "learning_rate"),
        ("flag", "--shards=2.7", "shards"),
    ],
)
def test_a_setting_of_the_wrong_type_is_exit_2_before_the_group_is_joined(
    kafka_bootstrap: str,
    make_topic: Any,
    group_id: str,
    tmp_path: Path,
    where: str,
    setting: str,
    named: str,
) -> None:
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, 100, partitions=1)
    args = ["run", "--bootstrap", kafka_bootstrap, "--group", group_id, "--stop-after-idle", "3"]
    env: dict[str, str] = {}
    if where == "toml":
        config = tmp_path / "worker.toml"
        config.write_text(setting + "\n", encoding="utf-8")
        args += ["--config", str(config)]
    elif where == "env":
        key, value = setting.split("=", 1)
        env[key] = value
    else:
        args.append(setting)
    if "topic" not in setting:  # else the topic comes from the file alone
        args += ["--topic", topic]
    done = run_cli(args, env, timeout=120)
    assert done.returncode == 2, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    assert named in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert committed_offsets(kafka_bootstrap, group_id, topic) == {0: None}
    assert end_offsets(kafka_bootstrap, topic) == {0: 100}


def _in_ci() -> bool:
    import os

    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.mark.timeout(300)
def test_a_full_checkpoint_disk_is_one_line_not_ready_retried_and_then_a_clear_stop(
    tmp_path: Path,
) -> None:
    """A 8 MiB tmpfs as --checkpoint-dir, filled while the worker trains (on the simulator):
    one ERROR line (not ten a second), /readyz 503 naming the checkpoints, no ckpt-N_temp left
    behind; freed, checkpoints work again; filled again, past --checkpoint-failure-seconds
    the worker stops with exit 1 and a message that says what to do."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        if _in_ci():
            pytest.fail(f"CI must be able to mount a tmpfs: {mounted.stderr!r}")
        pytest.skip("mounting a tmpfs needs root")  # a developer's machine without it
    filler = disk / "filler"

    def fill() -> None:
        with open(filler, "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * (1 << 16))

    ckpt = disk / "ckpt"
    port = free_port()
    args = [
        *("--checkpoint-dir", str(ckpt), "--checkpoint-every-steps", "20"),
        *("--checkpoint-failure-seconds", "15", "--batch-size", "32", "--sim-rate", "3000"),
        *("--metrics-port", str(port), "--status-interval", "1"),
    ]
    worker = start_worker(args, tmp_path / "worker.log")
    base = f"http://127.0.0.1:{port}"
    try:
        worker.wait_for(lambda: any(ckpt.glob("ckpt-*.index")), 120, "a first checkpoint")
        worker.wait_for(lambda: _get(base + "/readyz") == 200, 60, "ready")
        fill()
        worker.wait_for(
            lambda: "checkpoint at step" in worker.log() and "failed" in worker.log(),
            60,
            "a failed checkpoint",
        )
        worker.wait_for(lambda: _get(base + "/readyz") == 503, 10, "not ready")  # a 1 s watch
        status, body = http_get(base + "/readyz")
        assert status == 503 and "checkpoints to" in body, body
        time.sleep(5)  # steps go on meanwhile (at ~90 steps/s: hundreds of due checkpoints)
        filler.unlink()
        worker.wait_for(lambda: "work again" in worker.log(), 60, "checkpoints working again")
        worker.wait_for(lambda: _get(base + "/readyz") == 200, 30, "ready again")
        fill()
        code = worker.wait(120)
    finally:
        worker.kill()
        leftovers = sorted(p.name for p in ckpt.glob("*_temp*"))
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert not leftovers, leftovers  # a failed write's temp files are removed
    log = worker.log()
    assert code == 1, worker.tail()
    assert "have failed for" in log and "Free the disk" in log, worker.tail()
    errors = [ln for ln in log.splitlines() if " ERROR " in ln and "checkpoint at step" in ln]
    assert len(errors) == 2, errors  # one per run of failures, not one per step
    assert "Traceback" not in log, worker.tail()
