"""Multi-worker figures for the README (not part of CI): samples/s of 1 worker against 2 workers
on the same input, and the time from ``kill -9`` of a worker to the other's exit.

    KAFKA_BOOTSTRAP=$(deploy/local/kafka.sh start) .venv/bin/python -m benchmarks.multiworker rate
    KAFKA_BOOTSTRAP=... .venv/bin/python -m benchmarks.multiworker kill --victim 1

samples/s is timed from outside, polling every worker's /metrics, from the first trained sample
to the last full batch (a single worker trains its last partial batch only when its pass ends
at idle, so every configuration stops the clock at ``records - 256``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streamer.input.simulator import produce

OUT = Path("runs/multiworker-bench")

#: The line a cluster worker logs for each checkpoint (``streamer.cluster.worker``).
_CHECKPOINT = re.compile(r"checkpoint \S+ at step (\d+) weights [0-9a-f]+")


class WorkerProcess:
    """One ``streamer run`` process, its output in a log file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamer.cli", "run", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, seconds: float) -> int:
        return self.proc.wait(seconds)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self) -> str:
        return self.log()[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(
    n: int, args_of: Callable[[int], list[str]], logs: Path, tag: str
) -> list[WorkerProcess]:
    """N workers of one model, each with its TF_CONFIG (what ``streamer launch`` does)."""
    hosts = [f"127.0.0.1:{free_port()}" for _ in range(n)]

    def tf_config(i: int) -> str:
        return json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}})

    return [
        WorkerProcess(
            [*args_of(i), "--worker-id", f"{tag}-w{i}"],
            logs / f"{tag}-w{i}.log",
            {"TF_CONFIG": tf_config(i)},
        )
        for i in range(n)
    ]


def checkpoints(text: str) -> list[int]:
    """The steps of the checkpoints a worker logged."""
    return [int(step) for step in _CHECKPOINT.findall(text)]


def _trained(ports: list[int]) -> float | None:
    total = 0.0
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(body):
            if family.name == "streamer_samples_trained":  # the parser drops _total
                total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


def _clock(workers: list[WorkerProcess], ports: list[int], records: int) -> tuple[float, float]:
    first: tuple[float, float] | None = None
    while True:
        n = _trained(ports)
        now = time.monotonic()
        if n and first is None:
            first = (now, n)
        if n is not None and first is not None and n >= records - 256:
            return (n - first[1]) / (now - first[0]), now - first[0]
        assert all(w.alive() for w in workers), "\n".join(w.tail() for w in workers)
        time.sleep(0.05)


def _args(bootstrap: str, topic: str, group: str, batch: int, shards: int, port: int) -> list[str]:
    return [
        "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--shards", str(shards),
        "--batch-size", str(batch), "--metrics-port", str(port), "--status-interval", "5",
        "--stop-after-idle", "3",
    ]  # fmt: skip


def rate(bootstrap: str, records: int, rounds: int) -> None:
    topic = f"mw-bench-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, records, partitions=4)

    def single(batch: int, shards: int) -> tuple[float, float]:
        group, port = f"g-{uuid.uuid4().hex[:8]}", free_port()
        w = WorkerProcess(_args(bootstrap, topic, group, batch, shards, port), OUT / f"{group}.log")
        result = _clock([w], [port], records)
        assert w.wait(120) == 0, w.tail()
        return result

    def pair(batch: int) -> tuple[float, float]:
        group, ports = f"g-{uuid.uuid4().hex[:8]}", [free_port(), free_port()]
        ws = start_cluster(
            2, lambda i: _args(bootstrap, topic, group, batch, 1, ports[i]), OUT, group
        )
        result = _clock(ws, ports, records)
        assert [w.wait(120) for w in ws] == [0, 0]
        return result

    runs: list[tuple[str, Callable[[], tuple[float, float]]]] = [
        ("1 worker, --shards 1, batch 256", lambda: single(256, 1)),
        ("1 worker, --shards 2 (process shards), batch 256", lambda: single(256, 2)),
        ("2 workers, --shards 1 each, batch 256 each", lambda: pair(256)),
        ("2 workers, --shards 1 each, batch 128 each", lambda: pair(128)),
    ]
    for r in range(rounds):
        for name, run in runs:
            per_s, seconds = run()
            print(f"round {r}: {name}: {per_s:,.0f} samples/s ({seconds:.1f}s)", flush=True)


def kill(bootstrap: str, victim: int, rounds: int) -> None:
    for _ in range(rounds):
        topic = f"mw-bench-{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, 80_000, partitions=4)
        args = [
            "--bootstrap", bootstrap, "--topic", topic, "--group", f"g-{topic}", "--shards", "1",
            "--batch-size", "128", "--metrics-port", "0", "--checkpoint-every-steps", "20",
            "--checkpoint-dir", str(OUT / f"ckpt-{topic}"),
        ]  # fmt: skip
        ws = start_cluster(2, lambda _i, a=tuple(args): list(a), OUT, f"kill-{topic}")  # type: ignore[misc]
        deadline = time.monotonic() + 300
        while len(checkpoints(ws[0].log())) < 2:
            assert time.monotonic() < deadline and all(w.alive() for w in ws)
            time.sleep(0.2)
        time.sleep(1.0)
        dead, survivor = ws[victim], ws[1 - victim]
        os.kill(dead.pid, signal.SIGKILL)
        t0 = time.monotonic()
        code = survivor.proc.wait(60)
        took = time.monotonic() - t0
        dead.proc.wait(10)
        line = next((x for x in survivor.log().splitlines() if "lost worker" in x), "")
        print(f"kill -9 of worker {victim}: the other exited {code} after {took:.1f}s: "
              f"{line.partition(' ERROR ')[2].partition(': ')[2][:140]}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("rate", "kill"))
    parser.add_argument("--records", type=int, default=240_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--victim", type=int, default=1, choices=(0, 1))
    args = parser.parse_args()
    bootstrap = os.environ["KAFKA_BOOTSTRAP"]
    OUT.mkdir(parents=True, exist_ok=True)
    if args.what == "rate":
        rate(bootstrap, args.records, args.rounds)
    else:
        kill(bootstrap, args.victim, args.rounds)


if __name__ == "__main__":
    main()
