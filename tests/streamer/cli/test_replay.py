"""``streamer replay`` is a read-only side trip for the live system.

The rules (pure: no broker) and, against the real broker with real worker processes: a replay
beside a live worker, and with the live worker's config while its group is empty, leaves the
group's commits and the live checkpoint, export and audit files as they were; a replay group
with a live worker's commits or members is refused unless forced; outputs a live worker uses
are refused (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from consumers.errors import ConfigError
from streamer.config import load_config
from streamer.config.replay import (
    COMMIT_METADATA,
    MARKER_FILE,
    RANGE_FORMS,
    ReplaySpec,
    check_outputs,
    write_marker,
)
from streamer.train.lease import LEASE_FILE
from tests.workerutil import ROOT, WorkerProcess, end_offsets, free_port, read_audit

START_S = 180  # TensorFlow import + group join on a loaded 2-core machine


# ---- the rules (no broker) --------------------------------------------------------------------


def test_the_range_must_not_be_empty() -> None:
    for lo, hi in [
        ("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"),
        ("1767225600000", "1767225600000"),
        ("earliest", "earliest"),
        ("latest", "latest"),
        ("latest", "2026-01-01T00:00:00Z"),
        ("2026-01-01T00:00:00Z", "earliest"),
    ]:
        with pytest.raises(ConfigError, match=r"range from --from up to .* is empty") as info:
            ReplaySpec.parse(lo, hi)
        assert info.value.setting == "to"
    spec = ReplaySpec.parse("earliest", "2026-01-01T00:00:00+01:00")
    assert (spec.start, spec.stop) == ("earliest", 1767222000000)
    assert ReplaySpec.parse("1767225600000", "latest").start == 1767225600000


def test_bad_bounds_name_the_forms_the_help_shows() -> None:
    for setting, args in (("from", ("yesterday", "latest")), ("to", ("earliest", "soon"))):
        with pytest.raises(ConfigError) as info:
            ReplaySpec.parse(*args)
        assert info.value.setting == setting
        assert info.value.allowed == RANGE_FORMS
    with pytest.raises(ConfigError, match="only with --replay-group"):
        ReplaySpec.parse("earliest", "latest", force_live_group=True)


def test_a_replay_takes_the_live_workers_outputs_only_from_its_own_flags(tmp_path: Path) -> None:
    live = tmp_path / "live.toml"
    live.write_text(
        'bootstrap = "127.0.0.1:9092"\ntopic = "samples"\ngroup = "trainer"\n'
        f'checkpoint_dir = "{tmp_path / "ckpt"}"\nexport_dir = "{tmp_path / "models"}"\n'
        f'audit_log = "{tmp_path / "audit.csv"}"\nmetrics_port = 9999\nbatch_size = 64\n'
    )
    spec = ReplaySpec.parse("earliest", "latest")
    cfg = load_config({"config": str(live)}, env={}, replay=spec)
    assert cfg.bootstrap == "127.0.0.1:9092" and cfg.batch_size == 64  # inputs: from the file
    assert (cfg.checkpoint_dir, cfg.export_dir, cfg.audit_log) == (None, None, None)
    assert cfg.metrics_port == 0 and cfg.group == ""
    assert cfg.replay is not None
    assert set(cfg.replay.ignored) == {
        "checkpoint_dir",
        "export_dir",
        "audit_log",
        "metrics_port",
        "group",
    }
    assert not cfg.commits
    settings = cfg.consumer_settings(partitions=[0, 1])
    assert settings.mode == "static" and settings.group_id == "" and not settings.commits
    # The same from STREAMER_* variables; a flag is the replay's own.
    env = {"STREAMER_BOOTSTRAP": "127.0.0.1:9093", "STREAMER_EXPORT_DIR": "/srv/models"}
    cfg = load_config({"checkpoint_dir": str(tmp_path / "mine")}, env=env, replay=spec)
    assert cfg.bootstrap == "127.0.0.1:9093" and cfg.export_dir is None
    assert cfg.checkpoint_dir == str(tmp_path / "mine")
    # A replay group: commits there, marked as a replay's.
    spec = ReplaySpec.parse("earliest", "latest", group="replays")
    cfg = load_config({"config": str(live)}, env={}, replay=spec)
    settings = cfg.consumer_settings(partitions=[0])
    assert settings.group_id == "replays" and settings.commits
    assert settings.commit_metadata.startswith(COMMIT_METADATA)


def test_outputs_a_live_worker_uses_are_refused(tmp_path: Path) -> None:
    live = tmp_path / "live-ckpt"
    live.mkdir()
    (live / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    (live / "ckpt-10.index").write_bytes(b"x")
    spec = ReplaySpec.parse("earliest", "latest", restore_from=str(live))
    with pytest.raises(ConfigError, match="must differ from --restore-from") as info:
        check_outputs(spec, checkpoint_dir=str(live), export_dir=None, audit_log=None)
    assert info.value.setting == "checkpoint_dir"
    plain = ReplaySpec.parse("earliest", "latest")
    with pytest.raises(ConfigError, match="no replay wrote") as info:
        check_outputs(plain, checkpoint_dir=str(live), export_dir=None, audit_log=None)
    assert info.value.setting == "checkpoint_dir"
    with pytest.raises(ConfigError, match="must differ from --restore-from"):
        check_outputs(spec, checkpoint_dir=None, export_dir=str(live), audit_log=None)
    with pytest.raises(ConfigError, match="holds checkpoints"):
        bad = ReplaySpec.parse("earliest", "latest", restore_from=str(tmp_path / "empty"))
        check_outputs(bad, checkpoint_dir=None, export_dir=None, audit_log=None)
    models = tmp_path / "models"
    (models / "100" / "assets.extra").mkdir(parents=True)
    (models / "100" / "assets.extra" / "streamer.json").write_text('{"step": 100}')
    with pytest.raises(ConfigError, match="no replay exported"):
        check_outputs(plain, checkpoint_dir=None, export_dir=str(models), audit_log=None)
    audit = tmp_path / "audit.csv"
    audit.write_text("t,0,0\n")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        check_outputs(plain, checkpoint_dir=None, export_dir=None, audit_log=str(audit))
    # A new directory, and a replay's own (marked) ones, are fine.
    mine = tmp_path / "replay-ckpt"
    check_outputs(spec, checkpoint_dir=str(mine), export_dir=None, audit_log=None)
    write_marker(str(mine), spec, "samples")
    (mine / "checkpoint").write_text("")
    assert json.loads((mine / MARKER_FILE).read_text())["restore_from"] == str(live)
    (models / "100" / "assets.extra" / "streamer.json").write_text('{"replay": {"from": "x"}}')
    check_outputs(spec, checkpoint_dir=str(mine), export_dir=str(models), audit_log=None)


# ---- against the broker -----------------------------------------------------------------------


def streamer(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """``python -m streamer.cli ARGS`` from the worktree, without the test's STREAMER_* vars."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    base.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "streamer.cli", *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def produce_timed(bootstrap: str, topic: str, partitions: int, per: int, base_ms: int) -> None:
    """Record (p, offset i) gets timestamp base + 1000*i + p: known and increasing."""
    from kafka import KafkaProducer

    from streamer.input.simulator import SimulatorTask

    values = SimulatorTask().records(per * partitions, np.random.default_rng(3))
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for p in range(partitions):
        for i in range(per):
            producer.send(
                topic, value=values[p * per + i], partition=p, timestamp_ms=base_ms + 1000 * i + p
            )
    producer.flush(30)
    producer.close()


def commits(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, str]]:
    """The group's committed (offset, metadata) per partition of ``topic``."""
    from consumers.admin import group_activity

    return group_activity(bootstrap, group).committed_on(topic)


def snapshot(path: Path, ignore: str | None = None) -> dict[str, tuple[int, int, str]]:
    """Every file under ``path`` (but those whose name starts with ``ignore``): size, mtime
    and content hash."""
    out = {}
    files = [p for p in path.rglob("*") if not (ignore and p.name.startswith(ignore))]
    for file in sorted(p for p in files if p.is_file()):
        st = file.stat()
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        out[str(file.relative_to(path))] = (st.st_size, st.st_mtime_ns, digest)
    return out


def live_config(tmp_path: Path, bootstrap: str, topic: str, group: str) -> Path:
    """The live worker's TOML file: every output it has, and its metrics port."""
    path = tmp_path / "live.toml"
    path.write_text(
        f'bootstrap = "{bootstrap}"\ntopic = "{topic}"\ngroup = "{group}"\n'
        f'worker_id = "live-{group}"\nshards = 2\nbatch_size = 128\n'
        f'checkpoint_dir = "{tmp_path / "live-ckpt"}"\ncheckpoint_every_steps = 5\n'
        f'export_dir = "{tmp_path / "live-models"}"\nexport_every_steps = 10\n'
        f'audit_log = "{tmp_path / "live-audit.csv"}"\nmetrics_port = {free_port()}\n'
        "idle_timeout = 2.0\nstatus_interval = 1.0\nsession_timeout_ms = 6000\n"
    )
    return path


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def live_state(tmp_path: Path, bootstrap: str, group: str, topic: str) -> dict[str, Any]:
    # The live worker renews its own lease on its directory every 10 s (its writes, not the
    # replay's): what must not move is who holds it.
    ckpt = snapshot(tmp_path / "live-ckpt", ignore=LEASE_FILE)
    lease = tmp_path / "live-ckpt" / LEASE_FILE
    holder = json.loads(lease.read_text())["token"] if lease.exists() else None
    return {
        "commits": commits(bootstrap, group, topic),
        "lease": holder,
        "ckpt": ckpt,
        "models": snapshot(tmp_path / "live-models"),
        "audit": snapshot(tmp_path)["live-audit.csv"],
    }


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_replay_beside_a_live_worker_with_its_config_touches_nothing_of_it(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    topic = make_topic(3)
    base = int(time.time() * 1000) - 3_600_000
    produce_timed(kafka_bootstrap, topic, 3, 1000, base)
    ends = end_offsets(kafka_bootstrap, topic)
    config = live_config(tmp_path, kafka_bootstrap, topic, group_id)
    live = WorkerProcess.start(["--config", str(config)], tmp_path / "live.log")
    try:
        live.wait_for(
            lambda: {p: c[0] for p, c in commits(kafka_bootstrap, group_id, topic).items()} == ends,
            START_S,
            "the live worker to commit the whole topic",
        )
        # Quiet now: a pass ends every 2 s with nothing new to checkpoint, commit or export.
        before = live_state(tmp_path, kafka_bootstrap, group_id, topic)
        time.sleep(5)
        assert live_state(tmp_path, kafka_bootstrap, group_id, topic) == before
        assert before["ckpt"] and before["models"]

        lo, hi = base + 1000 * 100, base + 1000 * 400  # offsets 100..399 of each partition
        out = streamer(
            "replay", "--config", str(config), "--from", str(lo), "--to", str(hi),
            "--restore-from", str(tmp_path / "live-ckpt"),
            "--checkpoint-dir", str(tmp_path / "replay-ckpt"),
            "--export-dir", str(tmp_path / "replay-models"),
            "--audit-log", str(tmp_path / "replay-audit.csv"),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        assert live.alive(), live.tail()
        after = live_state(tmp_path, kafka_bootstrap, group_id, topic)
    finally:
        live.terminate()
    assert live.wait(60) == 0, live.tail()
    log = out.stderr
    assert "replay range is trained" in log
    assert f"restored {tmp_path / 'live-ckpt'}" in log  # it started from the live model
    assert f"of {topic} starts at 100: replay --from " in log  # the start's real reason
    assert "this worker's position" not in log  # not the checkpoint's offsets
    assert "not using the live worker's metrics_port, group from the config file" in log, log
    # Nothing of the live worker moved: its group's commits, checkpoints, exports, audit log.
    assert after == before
    # The replay trained exactly its range, into its own directories.
    trained = read_audit(tmp_path / "replay-audit.csv", topic)
    assert set(trained) == {(p, o) for p in range(3) for o in range(100, 400)}
    assert max(trained.values()) == 1
    assert (tmp_path / "replay-ckpt" / MARKER_FILE).exists()
    assert any(n.startswith("ckpt-") for n in os.listdir(tmp_path / "replay-ckpt"))
    versions = [n for n in os.listdir(tmp_path / "replay-models") if n.isdigit()]
    info = json.loads(
        (tmp_path / "replay-models" / versions[-1] / "assets.extra" / "streamer.json").read_text()
    )
    assert info["replay"]["group"] is None and info["offsets"] == {"0": 400, "1": 400, "2": 400}


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_replay_with_the_live_config_leaves_an_empty_live_group_as_it_was(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    topic = make_topic(3)
    base = int(time.time() * 1000) - 3_600_000
    produce_timed(kafka_bootstrap, topic, 3, 600, base)
    config = live_config(tmp_path, kafka_bootstrap, topic, group_id)
    live = WorkerProcess.start(
        ["--config", str(config), "--stop-after-idle", "3"], tmp_path / "live.log"
    )
    assert live.wait(START_S + 60) == 0, live.tail()
    # Static members stay until their session times out: then the group is empty (a commit
    # from outside would be accepted, as the issue saw it).
    from consumers.admin import group_activity

    wait_until(lambda: group_activity(kafka_bootstrap, group_id).members == 0, 60, "an empty group")
    before = live_state(tmp_path, kafka_bootstrap, group_id, topic)
    assert {p: c[0] for p, c in before["commits"].items()} == {0: 600, 1: 600, 2: 600}

    # The live worker's config and nothing else, an earlier range (the rewind), with
    # either client: a confluent consumer needs a group id, and gets a throwaway one.
    lo, hi = base + 1000 * 50, base + 1000 * 300
    for client in ("kafka-python", "confluent"):
        out = streamer(
            "replay", "--config", str(config), "--from", str(lo), "--to", str(hi),
            "--kafka-client", client, "--shards", "1",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        assert live_state(tmp_path, kafka_bootstrap, group_id, topic) == before, client
        assert "replay range is trained" in out.stderr
        # Its lag is what is left of its range: none (not the 300 records after --to each).
        final = [line for line in out.stderr.splitlines() if "(final:" in line]
        assert final and " lag=0 " in final[-1], out.stderr[-3000:]
        assert "group=(none: no commits)" in out.stderr
        for name in ("checkpoint_dir", "export_dir", "audit_log", "group"):
            assert name in out.stderr.split("not using the live worker's")[1].split("\n")[0]
    # No group at all committed on the topic but the live one.
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        others = [
            g["group_id"]
            for g in admin.list_groups()
            if g["group_id"] != group_id and commits(kafka_bootstrap, g["group_id"], topic)
        ]
    finally:
        admin.close()
    assert others == []

    # Given explicitly, a live worker's outputs are refused before anything starts (exit 2).
    live_ckpt, live_models = str(tmp_path / "live-ckpt"), str(tmp_path / "live-models")
    refused = {
        "holds checkpoints that no replay wrote": ["--checkpoint-dir", live_ckpt],
        "must differ from --restore-from": ["--restore-from", live_ckpt, "--checkpoint-dir", live_ckpt],
        "holds model versions that no replay exported": ["--export-dir", live_models],
        "exists and is not empty": ["--audit-log", str(tmp_path / "live-audit.csv")],
        "name one of its own with --replay-group": ["--group", group_id],
    }  # fmt: skip
    for message, extra in refused.items():
        out = streamer(
            "replay", "--config", str(config), "--from", "earliest", "--to", "latest", *extra
        )
        assert out.returncode == 2, (extra, out.stderr[-2000:])
        assert message in out.stderr, (extra, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
    assert live_state(tmp_path, kafka_bootstrap, group_id, topic) == before


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_replay_in_shard_processes_trains_its_whole_range(
    kafka_bootstrap: str, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A process shard's child said it had joined before its consumer had assigned the
    replay's partitions: each pass ended at once (no partitions, none to wait for) and the
    replay trained nothing until it was killed. Its shards now count as joining until then."""
    topic = make_topic(2)
    produce_timed(kafka_bootstrap, topic, 2, 500, int(time.time() * 1000) - 600_000)
    out = streamer(
        "replay", "--bootstrap", kafka_bootstrap, "--topic", topic,
        "--from", "earliest", "--to", "latest", "--shards", "2", "--shard-runtime", "process",
        "--batch-size", "100", "--checkpoint-dir", str(tmp_path / "ckpt"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert "replay range is trained" in out.stderr
    final = [line for line in out.stderr.splitlines() if "(final:" in line]
    assert final and "samples_trained=1000 " in final[-1], out.stderr[-3000:]


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_replay_group_must_not_be_a_live_one(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic = make_topic(2)
    base = int(time.time() * 1000) - 3_600_000
    produce_timed(kafka_bootstrap, topic, 2, 300, base)
    common = ["--bootstrap", kafka_bootstrap, "--topic", topic, "--shards", "1"]
    live_commits = {0: (250, ""), 1: (260, "")}
    owner = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=group_id, enable_auto_commit=False
    )
    owner.commit(
        {
            TopicPartition(topic, p): OffsetAndMetadata(o, m, -1)
            for p, (o, m) in live_commits.items()
        }
    )
    owner.close(autocommit=False)

    out = streamer(
        "replay", *common, "--from", "earliest", "--to", "latest", "--replay-group", group_id
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"replay_group='{group_id}'" in out.stderr
    assert "--force-replay-into-live-group" in out.stderr and "that no replay wrote" in out.stderr
    assert commits(kafka_bootstrap, group_id, topic) == live_commits

    hi = base + 1000 * 100  # offsets 0..99
    out = streamer(
        "replay", *common, "--from", "earliest", "--to", str(hi), "--replay-group", group_id,
        "--force-replay-into-live-group",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert "--force-replay-into-live-group: replaying into group" in out.stderr
    moved = commits(kafka_bootstrap, group_id, topic)
    assert {p: o for p, (o, _m) in moved.items()} == {0: 100, 1: 100}
    assert all(m == f"{COMMIT_METADATA} from=earliest to={hi}" for _o, m in moved.values()), moved

    # A group of its own: the replay commits there; its commits are a replay's, so running
    # the replay into it again needs no force.
    mine = f"{group_id}-replay"
    for _ in range(2):
        out = streamer(
            "replay", *common, "--from", "earliest", "--to", "latest", "--replay-group", mine
        )
        assert out.returncode == 0, out.stderr[-4000:]
    assert {p: o for p, (o, _m) in commits(kafka_bootstrap, mine, topic).items()} == {
        0: 300,
        1: 300,
    }

    # A group with a member (a live worker polling) is refused too.
    member = KafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, group_id=f"{group_id}-busy",
        enable_auto_commit=False, auto_offset_reset="earliest",
    )  # fmt: skip
    try:
        wait_until(lambda: bool(member.poll(500)) or bool(member.assignment()), 60, "a member")
        out = streamer(
            "replay", *common, "--from", "earliest", "--to", "latest",
            "--replay-group", f"{group_id}-busy",
        )  # fmt: skip
    finally:
        member.close(autocommit=False)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "1 active member(s)" in out.stderr
