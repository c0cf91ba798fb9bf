"""Helpers for tests that run the worker as a real process (``python -m streamer.cli run``)."""

from __future__ import annotations

import ast
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_PROGRESS = re.compile(r"progress step=(\d+) .*?loss=(\S+) samples_trained=(\d+)")
_CHECKPOINT = re.compile(r"checkpoint \S+ at step (\d+)")
_RESTORED = re.compile(r"restored \S+: step (\d+), offsets (\{[^}]*\})")
_STARTING = re.compile(r"worker \S+ starting at step (\d+)")
_STOPPED = re.compile(r"stopped \((.*)\) at step (\d+)")
_HUNG = re.compile(r"^.*clean shutdown did not finish", re.M)
_ERROR = re.compile(r"^\S+ \S+ ERROR ", re.M)


@dataclass(frozen=True)
class Progress:
    step: int
    loss: float
    samples_trained: int


class WorkerProcess:
    """One ``streamer run`` process; stderr (the log) goes to ``log_path``.

    >>> w = WorkerProcess.start(["--bootstrap", b, "--topic", t], tmp_path / "w1.log")  # doctest: +SKIP
    >>> assert w.wait(120) == 0
    """

    #: Every worker a test started: the conftest kills those still alive after each test.
    started: list[WorkerProcess] = []

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, argv: list[str]) -> None:
        self.proc = proc
        self.log_path = log_path
        self.argv = argv
        WorkerProcess.started.append(self)

    @classmethod
    def start(
        cls,
        args: Sequence[str],
        log_path: Path,
        *,
        env_extra: Mapping[str, str] | None = None,
        new_group: bool = False,
    ) -> WorkerProcess:
        """``env_extra``: variables set for this worker only (TF_CONFIG of a cluster);
        ``new_group``: the worker leads a process group of its own (``signal_group`` sends to
        it and its shard children, as a terminal's Ctrl-C does)."""
        env = dict(os.environ)
        env.update(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        env.pop("TF_CONFIG", None)
        env.update(env_extra or {})
        # A STREAMER_* variable in the test environment must not change the worker under test.
        for key in [k for k in env if k.startswith("STREAMER_")]:
            del env[key]
        argv = [sys.executable, "-m", "streamer.cli", "run", *args]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as err:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=new_group,
            )
        return cls(proc, log_path, argv)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, chars: int = 4000) -> str:
        """The log's last ``chars``; before them, where a stop hung (the watchdog's thread dump)
        or else the first ERROR line, when those are earlier: the cause, not just its echo."""
        text = self.log()
        cause = _HUNG.search(text) or _ERROR.search(text)
        head = ""
        if cause is not None and cause.start() < len(text) - chars:
            head = (
                f"--- {self.log_path} (from char {cause.start()}) ---\n"
                f"{text[cause.start() : cause.start() + 8000]}\n"
            )
        return f"{head}--- {self.log_path} (last {chars} chars) ---\n{text[-chars:]}"

    def wait(self, timeout: float) -> int:
        """Exit code; kills the process and fails (with the log tail) if it outlives ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"worker did not exit within {timeout:.0f}s\n{self.tail()}"
            ) from None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, signum)

    def signal_group(self, signum: int) -> None:
        """``signum`` to every process of the worker's group (started with ``new_group``)."""
        if self.alive():
            os.killpg(self.proc.pid, signum)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``predicate`` until true; fail with the log tail on timeout or early exit."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if not self.alive():
                raise AssertionError(
                    f"worker exited (code {self.proc.returncode}) before {what}\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{self.tail()}"
                )
            time.sleep(0.05)

    # ---- what the log says ----------------------------------------------------------------------

    def progress(self) -> list[Progress]:
        """The ``progress step=... loss=... samples_trained=...`` lines, in order."""
        return [
            Progress(int(s), math.nan if x == "-" else float(x), int(n))  # "-": not known yet
            for s, x, n in _PROGRESS.findall(self.log())
        ]

    def samples_trained(self) -> int:
        lines = self.progress()
        return lines[-1].samples_trained if lines else 0

    def checkpoints(self) -> list[int]:
        """Steps of the checkpoints this process wrote."""
        return [int(s) for s in _CHECKPOINT.findall(self.log())]

    def restored(self) -> tuple[int, dict[int, int]] | None:
        """(step, offsets) from the worker's ``restored ...`` line, or None if it restored nothing."""
        m = _RESTORED.search(self.log())
        if m is None:
            return None
        return int(m.group(1)), {int(k): int(v) for k, v in ast.literal_eval(m.group(2)).items()}

    def starting_step(self) -> int | None:
        m = _STARTING.search(self.log())
        return None if m is None else int(m.group(1))

    def stopped(self) -> tuple[str, int] | None:
        """(reason, step) of the final ``stopped (...) at step N`` line."""
        m = _STOPPED.search(self.log())
        return None if m is None else (m.group(1), int(m.group(2)))


class RateProducer(threading.Thread):
    """Produces simulator records into ``topic`` at about ``rate`` records/s until ``stop()``.

    >>> producer = RateProducer(bootstrap, topic, rate=4000); producer.start()  # doctest: +SKIP
    >>> sent = producer.stop()
    """

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int = 0) -> None:
        super().__init__(name=f"rate-producer-{topic}", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.rate = rate
        self.seed = seed
        self.sent = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        import numpy as np
        from kafka import KafkaProducer

        from streamer.input.simulator import SimulatorTask

        task = SimulatorTask()
        rng = np.random.default_rng(self.seed)
        chunk = max(1, int(self.rate / 20))
        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=10)
            try:
                t0 = time.monotonic()
                while not self._stop_event.is_set():
                    wait = t0 + self.sent / self.rate - time.monotonic()
                    if wait > 0 and self._stop_event.wait(wait):
                        break
                    for value in task.records(chunk, rng):
                        producer.send(self.topic, value=value)
                    self.sent += chunk
                producer.flush(timeout=60)
            finally:
                producer.close(timeout=30)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> int:
        """Stop, flush, and return how many records were sent (raises what the thread raised)."""
        self._stop_event.set()
        self.join(90)
        assert not self.is_alive(), "the producer thread did not stop"
        if self.error is not None:
            raise self.error
        return self.sent


def worker_args(
    bootstrap: str | None,
    topic: str,
    group: str,
    audit: Path | None,
    *,
    shards: int = 4,
    batch_size: int = 256,
    stop_after_idle: float | None = 5,
    checkpoint_dir: Path | None = None,
    checkpoint_every_steps: int | None = None,
    worker_id: str = "w0",
    extra: Sequence[str] = (),
) -> list[str]:
    args = ["--topic", topic, "--shards", str(shards), "--batch-size", str(batch_size)]
    args += ["--metrics-port", "0", "--status-interval", "0.5", "--worker-id", worker_id]
    if bootstrap is not None:
        args += ["--bootstrap", bootstrap, "--group", group]
    if audit is not None:
        args += ["--audit-log", str(audit)]
    if stop_after_idle is not None:
        args += ["--stop-after-idle", str(stop_after_idle)]
    if checkpoint_dir is not None:
        args += ["--checkpoint-dir", str(checkpoint_dir)]
    if checkpoint_every_steps is not None:
        args += ["--checkpoint-every-steps", str(checkpoint_every_steps)]
    return [*args, *extra]


def read_audit(path: Path, topic: str) -> Counter[tuple[int, int]]:
    """How many times each (partition, offset) of ``topic`` was trained, from the audit log."""
    counts: Counter[tuple[int, int]] = Counter()
    if not path.exists():
        return counts
    for n, line in enumerate(path.read_text(encoding="ascii").splitlines(), 1):
        t, p, o = line.rsplit(",", 2)
        assert t == topic, f"{path}:{n}: unexpected topic in {line!r}"
        counts[int(p), int(o)] += 1
    return counts


def audit_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The log end offset of every partition of ``topic``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic)
        assert parts, f"topic {topic} has no partitions"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        return {tp.partition: int(o) for tp, o in consumer.end_offsets(tps).items()}
    finally:
        consumer.close(autocommit=False)


def all_records(ends: dict[int, int]) -> set[tuple[int, int]]:
    """Every (partition, offset) below the end offsets (a fresh topic, nothing deleted)."""
    return {(p, o) for p, end in ends.items() for o in range(end)}


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    from consumers.admin import group_lag

    return {row.partition: row.committed for row in group_lag(bootstrap, group, topic)}


def missing_and_extra(
    counts: Counter[tuple[int, int]], expected: set[tuple[int, int]]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Expected records absent from the audit, and audited records that were never produced."""
    missing = sorted(expected - counts.keys())
    extra = sorted(counts.keys() - expected)
    return missing, extra


def summarize(records: list[tuple[int, int]], limit: int = 10) -> str:
    return f"{len(records)} records, e.g. {records[:limit]}"


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """``(status, body)`` of a GET; status 0 (and the error as body) when nothing answered."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - test URLs
            return int(resp.status), resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", errors="replace")
    except (OSError, urllib.error.URLError) as exc:
        return 0, repr(exc)


def parse_metrics(body: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> sample name -> [(labels, value), ...]."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def metric_types(body: str) -> dict[str, str]:
    """Prometheus text exposition -> family name (counters without ``_total``) -> type."""
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: family.type for family in text_string_to_metric_families(body)}


def run_in_process(**options: Any) -> tuple[int, Any, str]:
    """Run the worker on the embedded simulator in this process; (exit code, worker, log)."""
    import io
    import logging

    from streamer.config import load_config
    from streamer.worker import Worker

    records = io.StringIO()
    handler = logging.StreamHandler(records)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("streamer")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        cfg = load_config({"metrics_port": 0, "shards": 1, "batch_size": 128, **options}, env={})
        worker = Worker(cfg, status_out=io.StringIO())
        code = worker.run()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return code, worker, records.getvalue()
