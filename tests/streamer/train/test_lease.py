"""One writer per checkpoint directory (streamer/train/lease.py): a live holder refuses a
second worker, naming itself; a dead or lapsed one does not lock the directory out; a holder
whose lease was taken over knows it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamer.train.lease import (
    LEASE_FILE,
    CheckpointDirInUseError,
    CheckpointLeaseLostError,
    Lease,
)

_HOLD = """
import sys, time
from streamer.train.lease import Lease
lease = Lease.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def _holder_process(directory: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _write(directory: Path, **fields: object) -> None:
    now = time.time()
    lease = {"host": "elsewhere", "pid": 1, "token": "t", "since": now, "renewed": now}
    lease |= {"ttl_seconds": 30.0, **fields}
    (directory / LEASE_FILE).write_text(json.dumps(lease))


def test_a_second_worker_is_refused_while_the_first_lives_and_not_after_it_died(
    tmp_path: Path,
) -> None:
    proc = _holder_process(tmp_path)
    try:
        with pytest.raises(CheckpointDirInUseError) as refused:
            Lease.acquire(str(tmp_path))
        text = str(refused.value)
        assert str(tmp_path) in text and f"pid {proc.pid}" in text
        assert socket.gethostname() in text and refused.value.exit_code == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # Its process is gone: on the same host that frees the lease at once, not after the ttl.
    lease = Lease.acquire(str(tmp_path))
    try:
        held = json.loads((tmp_path / LEASE_FILE).read_text())
        assert held["pid"] == os.getpid() and held["token"] == lease.holder.token
    finally:
        lease.close()
    assert not (tmp_path / LEASE_FILE).exists()  # released at a clean stop


def test_another_hosts_lease_holds_until_it_lapses(tmp_path: Path) -> None:
    _write(tmp_path, host="other-host", pid=4242)
    with pytest.raises(CheckpointDirInUseError, match="host other-host, pid 4242"):
        Lease.acquire(str(tmp_path))
    _write(tmp_path, host="other-host", pid=4242, renewed=time.time() - 31)
    lease = Lease.acquire(str(tmp_path))
    lease.close()


def test_a_predecessor_with_this_very_pid_is_not_a_live_holder(tmp_path: Path) -> None:
    # A restarted container is often pid 1 again: its predecessor's lease names its pid.
    _write(tmp_path, host=socket.gethostname(), pid=os.getpid(), token="before")
    lease = Lease.acquire(str(tmp_path))
    assert lease.holder.token != "before"
    lease.close()


def test_a_holder_whose_lease_was_taken_over_stops_and_leaves_the_new_holders_lease(
    tmp_path: Path,
) -> None:
    lease = Lease(str(tmp_path), ttl_seconds=30.0)
    lease._take()  # without the renewing thread: renewals are called here
    lease.renew()
    lease.check()  # still ours
    _write(tmp_path, host="other-host", pid=7, token="theirs")  # took over while we slept
    lease.renew()
    with pytest.raises(CheckpointLeaseLostError, match="host other-host, pid 7") as lost:
        lease.check()
    assert lost.value.exit_code == 1
    lease.close()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["token"] == "theirs"


def test_a_lease_renews_itself(tmp_path: Path) -> None:
    lease = Lease.acquire(str(tmp_path), ttl_seconds=0.3)
    try:
        first = json.loads((tmp_path / LEASE_FILE).read_text())["renewed"]
        time.sleep(0.5)
        assert json.loads((tmp_path / LEASE_FILE).read_text())["renewed"] > first
        assert lease.lost is None
    finally:
        lease.close()


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_streamer_run_on_a_held_directory_exits_2_before_it_joins_the_group(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    from tests.workerutil import WorkerProcess, committed_offsets, worker_args

    topic = make_topic(2)
    ckpt = tmp_path / "ckpt"
    holder = _holder_process(ckpt)  # the other worker, as far as the directory can tell
    try:
        args = worker_args(kafka_bootstrap, topic, group_id, None, shards=2, checkpoint_dir=ckpt)
        second = WorkerProcess.start(args, tmp_path / "second.log")
        assert second.wait(60) == 2, second.tail()
        log = second.log()
        assert f"--checkpoint-dir {ckpt} is in use by another worker" in log, second.tail()
        assert f"pid {holder.pid}" in log and "Give each worker its own directory" in log
        assert "assigned partitions" not in log and "Traceback" not in log, second.tail()
        assert committed_offsets(kafka_bootstrap, group_id, topic) == {0: None, 1: None}
        assert json.loads((ckpt / LEASE_FILE).read_text())["pid"] == holder.pid  # untouched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
