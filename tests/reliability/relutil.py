"""Helpers of the reliability tests: a worker process with secrets in its environment, HTTP."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.workerutil import ROOT, WorkerProcess

_METRICS_URL = re.compile(r"metrics on (http://\S+)/metrics")
_OUR_ERROR = re.compile(r"^\d{4}-\d\d-\d\d \S+ ERROR (?!kafka[.:])")


def start_worker(
    args: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> WorkerProcess:
    """Like ``WorkerProcess.start``, but with ``env`` (e.g. STREAMER_SASL_PASSWORD) added.

    Every other STREAMER_* variable of the test environment is removed, as there.
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    full.update(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    full.update(env or {})
    argv = [sys.executable, "-m", "streamer.cli", "run", *args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=full, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    return WorkerProcess(proc, log_path, argv)


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    full.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "streamer.cli", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def metrics_base(worker: WorkerProcess, timeout: float = 120) -> str:
    """``http://host:port`` of the worker's metrics server, from its log line."""
    found: list[str] = []

    def seen() -> bool:
        m = _METRICS_URL.search(worker.log())
        if m:
            found.append(m.group(1))
        return bool(m)

    worker.wait_for(seen, timeout, "the metrics server's log line")
    return found[0]


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    """(status, body) of a GET; HTTP errors (503 from /readyz) are answers too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - local test URL
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def error_lines(text: str) -> list[str]:
    """Our ERROR log lines and ``streamer: error:`` lines.

    kafka-python's own lines (logger ``kafka.*``) and TensorFlow's native ``E0000`` lines are
    not ours: a test counts the errors the project reports.
    """
    return [
        line
        for line in text.splitlines()
        if line.startswith("streamer: error:") or _OUR_ERROR.match(line)
    ]


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.2) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
