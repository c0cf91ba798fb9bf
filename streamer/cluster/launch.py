"""``streamer launch``: N workers of one model on this host, for demos and tests.

Picks free ports, gives each ``streamer run`` process its TF_CONFIG, prefixes each worker's
log lines with ``[wN]``, forwards SIGTERM/SIGINT to every worker once (a duplicate within
``GRACE_S`` -- a terminal's Ctrl-C reaches the workers directly too -- is the same stop; a
signal after that is forwarded again, and the workers exit at once), and exits non-zero if any
worker did (the others of a cluster that lost a worker exit by themselves within seconds;
any left after ``grace`` seconds are killed).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

from consumers.errors import ConfigError
from streamer.cluster.topology import tf_config
from streamer.ops.signals import GRACE_S

__all__ = ["launch", "worker_argv"]

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9464


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _flag_value(args: Sequence[str], flag: str) -> tuple[int, str] | None:
    """(index, value) of ``--flag value`` or ``--flag=value`` in ``args``."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return i, args[i + 1]
        if arg.startswith(flag + "="):
            return i, arg.split("=", 1)[1]
    return None


def worker_argv(run_args: Sequence[str], index: int) -> list[str]:
    """Worker ``index``'s ``streamer run`` arguments: ``{index}`` replaced by the index, the
    metrics port moved up by the index (0 stays 0: a free port), a worker id if none is given.

    >>> worker_argv(["--audit-log", "a-{index}.csv", "--metrics-port=9500"], 2)
    ['--audit-log', 'a-2.csv', '--metrics-port', '9502', '--worker-id', 'w2']
    """
    args = [a.replace("{index}", str(index)) for a in run_args]
    found = _flag_value(args, "--metrics-port")
    port = DEFAULT_METRICS_PORT if found is None else int(found[1])
    if found is not None:
        i = found[0]
        del args[i : i + (1 if args[i].startswith("--metrics-port=") else 2)]
    args += ["--metrics-port", str(port + index if port else 0)]
    if _flag_value(args, "--worker-id") is None:
        args += ["--worker-id", f"w{index}"]
    return args


def _pump(stream: IO[bytes], prefix: str, out: IO[str]) -> None:
    for raw in iter(stream.readline, b""):
        out.write(prefix + raw.decode("utf-8", errors="replace"))
        out.flush()


def launch(
    workers: int,
    run_args: Sequence[str],
    *,
    host: str = "127.0.0.1",
    grace: float = 60.0,
    env: Mapping[str, str] | None = None,
    out: IO[str] | None = None,
) -> int:
    """Run ``workers`` processes of one cluster until all have exited; the exit code."""
    if workers < 1:
        raise ConfigError("workers", workers, "a positive number of workers")
    if any(a == "--cluster-workers" or a.startswith("--cluster-workers=") for a in run_args):
        raise ConfigError("cluster_workers", "(given)", "launch makes the cluster itself")
    out = out or sys.stderr
    base = dict(os.environ if env is None else env)
    base.pop("STREAMER_CLUSTER_WORKERS", None)
    base.pop("STREAMER_WORKER_INDEX", None)
    hosts = [f"{host}:{_free_port(host)}" for _ in range(workers)]
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    for i in range(workers):
        worker_env = {**base, "TF_CONFIG": tf_config(hosts, i), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamer.cli", "run", *worker_argv(run_args, i)],
            env=worker_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        assert proc.stdout is not None
        pump = threading.Thread(target=_pump, args=(proc.stdout, f"[w{i}] ", out), daemon=True)
        pump.start()
        pumps.append(pump)
    out.write(f"launched {workers} workers: {', '.join(hosts)} (pids {[p.pid for p in procs]})\n")
    first: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        now = time.monotonic()
        if first and now - first[0] <= GRACE_S:
            return  # the same stop: the workers have it (and, from a terminal, saw it too)
        first[:] = [now]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        failed_at: float | None = None
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > grace:
                for p in procs:
                    if p.poll() is None:
                        out.write(
                            f"worker pid {p.pid} still running {grace:.0f}s after a "
                            "failure: killing it\n"
                        )
                        p.kill()
            time.sleep(0.1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for pump in pumps:
            pump.join(5)
    codes = [p.returncode for p in procs]
    out.write(f"workers exited with {codes}\n")
    return next((c for c in codes if c != 0), 0)
