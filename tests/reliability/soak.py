"""Soak (issue 6): broker restarts and worker kills, alternating at random, for N minutes; then
drain and check that every record in the topic was trained (zero lost).

Not a pytest test (the file name does not match ``test_*.py``, and it refuses to run under
pytest): a documented command for a quiet machine, from the repository root::

    python -m tests.reliability.soak --minutes 10
    python tests/reliability/soak.py --minutes 10 --seed 7 --keep
    python -m tests.reliability.soak --minutes 30 --producer java --compression zstd \
        --transactional --worker-every 30 --broker-every 300

It starts a private broker (``deploy/local/kafka.sh`` with its own state folder, never the
shared broker), a producer thread producing continuously, and one real worker process
(``streamer run --audit-log``). Events alternate: the broker is SIGKILLed or SIGTERMed, stays
down for a random while and is started again on the same ports and data; then the worker is
SIGKILLed or SIGTERMed and started again (same group and worker id); with a random gap in
between. Every worker incarnation writes its own audit file. At the end the producer stops,
the broker and a worker are up, the worker drains the topic, and every offset below each
partition's end offset must be in some audit file. Prints a summary; exits 1 on any loss.

``--producer java`` writes with Apache Kafka's Java producer instead (tests/interop), with
``--compression`` and, with ``--transactional``, transactions of 100 records of which every
third is aborted. Its manifest says which records reached the log in committed and aborted
transactions: every committed one must be trained, no aborted one may be. With
``--worker-every``/``--broker-every`` the worker is killed and the broker restarted on
schedules of their own (each gap drawn within +-30 %) instead of alternating.

``--brokers 3`` runs it on a 3-node cluster (``deploy/local/kafka-cluster.sh``, replication
factor 3, ``min.insync.replicas=2``): each broker event kills or stops one node chosen at
random and brings it back once down for a while (the cluster whole again before going on).
``--kafka-client`` picks the worker's client; the summary adds the longest time a partition
went without a newly trained record while the chaos ran::

    python -m tests.reliability.soak --brokers 3 --minutes 30 --producer java \
        --broker-every 120 --idle-timeout 60 --kafka-client confluent
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.interop.javaclients import JavaProducer, by_kind, read_manifest
from tests.reliability.brokers import PrivateBroker
from tests.reliability.cluster import KafkaCluster
from tests.reliability.relutil import error_lines, start_worker
from tests.workerutil import WorkerProcess, end_offsets, worker_args

PARTITIONS = 4


def _say(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Producer(threading.Thread):
    """Produces simulator records at about ``rate`` per second until stopped; counts acks.

    Sends that fail after the producer's own retries (the broker down for longer than the
    delivery timeout) are counted, not retried: those records never entered the topic.
    """

    def __init__(
        self, bootstrap: str, topic: str, rate: float, seed: int, compression: str = "none"
    ) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.bootstrap, self.topic, self.rate, self.seed = bootstrap, topic, rate, seed
        self.compression = None if compression == "none" else compression
        self.sent = self.acked = self.failed = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def _ok(self, _meta: Any) -> None:
        with self._lock:
            self.acked += 1

    def _failed(self, _exc: BaseException) -> None:
        with self._lock:
            self.failed += 1

    def run(self) -> None:
        import numpy as np
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        from streamer.input.simulator import SimulatorTask

        task = SimulatorTask()
        rng = np.random.default_rng(self.seed)
        chunk = max(1, int(self.rate / 10))
        try:
            producer = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                linger_ms=20,
                request_timeout_ms=10_000,
                max_block_ms=20_000,
                compression_type=self.compression,
            )
            try:
                t0 = time.monotonic()
                while not self._stop_event.is_set():
                    wait = t0 + self.sent / self.rate - time.monotonic()
                    if wait > 0 and self._stop_event.wait(wait):
                        break
                    for value in task.records(chunk, rng):
                        try:
                            future = producer.send(self.topic, value=value)
                        except KafkaError:  # buffer full while the broker is down
                            self._failed(RuntimeError("send blocked"))
                            continue
                        future.add_callback(self._ok)
                        future.add_errback(self._failed)
                    self.sent += chunk
                producer.flush(timeout=180)
            finally:
                producer.close(timeout=60)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join(300)
        if self.is_alive():
            raise RuntimeError("the producer thread did not stop")
        if self.error is not None:
            raise self.error


class ClusterNodes:
    """A local N-node cluster (deploy/local/kafka-cluster.sh) behind the soak's broker calls:
    each kill or stop takes one node chosen at random; ``start`` brings every node back and
    waits until the cluster is whole (every ISR full)."""

    def __init__(self, state: Path, nodes: int, rng: random.Random) -> None:
        self.cluster = KafkaCluster(state, nodes=nodes)
        self.rng = rng
        self.down: int | None = None

    @property
    def plaintext(self) -> str:
        return self.cluster.bootstrap

    def start(self) -> str:
        if not self.cluster.bootstrap:
            return self.cluster.start()
        self.cluster.heal()
        self.down = None
        return self.cluster.bootstrap

    def _pick(self) -> int:
        self.down = self.rng.randint(1, self.cluster.nodes)
        return self.down

    def kill(self) -> None:
        self.cluster.kill_node(self._pick())

    def stop(self) -> None:
        self.cluster.stop_node(self._pick())

    def running(self) -> bool:
        return all(state == "running" for state in self.cluster.status().values())

    def clean(self) -> None:
        self.cluster.clean()


class StallWatch(threading.Thread):
    """Follows the audit logs: per partition, the longest time in which no new record was
    trained while the chaos ran (the producer writes to every partition all along)."""

    def __init__(self, soak: Soak) -> None:
        super().__init__(name="stall-watch", daemon=True)
        self.soak = soak
        self.stop = threading.Event()
        self.top: dict[int, int] = {}
        self.since: dict[int, float] = {}
        self.longest = 0.0
        self.where = ""
        self._read: dict[int, int] = {}

    def run(self) -> None:
        while not self.stop.wait(0.5):
            now = time.monotonic()
            for n in range(len(self.soak.workers)):
                try:
                    with open(self.soak.audit(n), "rb") as fh:
                        if os.fstat(fh.fileno()).st_size < self._read.get(n, 0):
                            self._read[n] = 0  # a rollback dropped its last lines
                        fh.seek(self._read.get(n, 0))
                        chunk = fh.read()
                except FileNotFoundError:
                    continue
                end = chunk.rfind(b"\n") + 1
                self._read[n] = self._read.get(n, 0) + end
                for line in chunk[:end].decode("ascii").splitlines():
                    _, part, off = line.rsplit(",", 2)
                    if int(off) > self.top.get(int(part), -1):
                        self.top[int(part)] = int(off)
                        self.since[int(part)] = now
            for p, t in self.since.items():
                if now - t > self.longest:
                    self.longest = now - t
                    self.where = f"partition {p}, up to {time.strftime('%H:%M:%S')}"


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        (work / "broker").mkdir(parents=True)
        self.broker: PrivateBroker | ClusterNodes = (
            PrivateBroker(work / "broker")
            if args.brokers == 1
            else ClusterNodes(work / "broker", args.brokers, self.rng)
        )
        self.topic = f"soak-{uuid.uuid4().hex[:8]}"
        self.group = f"g-{self.topic}"
        self.workers: list[WorkerProcess] = []
        self.events: Counter[str] = Counter()

    # ---- parts --------------------------------------------------------------------------------

    @property
    def worker(self) -> WorkerProcess:
        return self.workers[-1]

    def audit(self, n: int) -> Path:
        return self.work / f"audit-{n}.csv"

    def start_worker(self) -> None:
        n = len(self.workers)
        args = worker_args(
            self.broker.plaintext,
            self.topic,
            self.group,
            self.audit(n),
            shards=2,
            batch_size=16,
            stop_after_idle=None,
            extra=[
                "--idle-timeout", str(self.args.idle_timeout),
                "--commit-every-seconds", "1",
                "--kafka-client", self.args.kafka_client,
            ],
        )  # fmt: skip
        self.workers.append(start_worker(args, self.work / f"worker-{n}.log"))

    def stop_worker(self, how: str) -> None:
        w = self.worker
        if how == "SIGTERM":
            w.terminate()
            try:
                w.proc.wait(120)
            except subprocess.TimeoutExpired:
                _say("worker did not stop within 120 s of SIGTERM: SIGKILL")
                self.events["worker SIGTERM timeouts"] += 1
                w.kill()
        else:
            w.kill()

    def trained(self) -> Counter[tuple[int, int]]:
        """(partition, offset) -> times trained, over every worker's audit file."""
        counts: Counter[tuple[int, int]] = Counter()
        for n in range(len(self.workers)):
            try:
                text = self.audit(n).read_text(encoding="ascii")
            except FileNotFoundError:
                continue
            for line in text.split("\n")[:-1]:  # the last element: "" or a line cut by SIGKILL
                _, p, o = line.rsplit(",", 2)
                counts[int(p), int(o)] += 1
        return counts

    # ---- the run ------------------------------------------------------------------------------

    def chaos(self, until: float) -> None:
        if self.args.worker_every or self.args.broker_every:
            self.scheduled_chaos(until)
            return
        turn = 0
        while True:
            gap = self.rng.uniform(self.args.min_gap, self.args.max_gap)
            if time.monotonic() + gap >= until:
                break
            self.watch_worker(time.monotonic() + gap)
            if turn % 2 == 0:
                self.restart_broker()
            else:
                self.kill_worker()
            turn += 1

    def watch_worker(self, deadline: float) -> None:
        """Until ``deadline``: start another worker if one exits by itself."""
        while time.monotonic() < deadline:
            if not self.worker.alive():
                code = self.worker.proc.returncode
                _say(f"worker exited by itself (code {code}): starting another")
                self.events["worker exits (unexpected)"] += 1
                self.start_worker()
            time.sleep(0.5)

    def restart_broker(self) -> None:
        how = self.rng.choice(["SIGKILL", "SIGTERM"])
        down = self.rng.uniform(self.args.min_down, self.args.max_down)
        t0 = time.monotonic()
        if how == "SIGKILL":
            self.broker.kill()
        else:
            self.broker.stop()
        node = getattr(self.broker, "down", None)
        _say(f"{'broker' if node is None else f'node {node}'} {how}, started after {down:.1f}s")
        time.sleep(down)
        self.broker.start()
        self.events[f"broker restarts ({how})"] += 1
        _say(f"broker back: down {time.monotonic() - t0:.1f}s in all (its start-up included)")

    def kill_worker(self) -> None:
        how = self.rng.choice(["SIGKILL", "SIGTERM"])
        _say(f"worker {how}")
        self.stop_worker(how)
        self.events[f"worker kills ({how})"] += 1
        self.start_worker()

    def scheduled_chaos(self, until: float) -> None:
        """Worker kills and broker restarts, each on its own schedule (gaps within +-30 %)."""

        def gap(every: float) -> float:
            return self.rng.uniform(0.7 * every, 1.3 * every) if every else float("inf")

        now = time.monotonic()
        next_worker = now + gap(self.args.worker_every)
        next_broker = now + gap(self.args.broker_every)
        while True:
            due = min(next_worker, next_broker)
            if due >= until:
                break
            self.watch_worker(due)
            if next_broker <= next_worker:
                self.restart_broker()
                next_broker = time.monotonic() + gap(self.args.broker_every)
            else:
                self.kill_worker()
                next_worker = time.monotonic() + gap(self.args.worker_every)

    def group_at_log_end(self) -> bool:
        """The group's commits are at every partition's log end (Kafka's LAG 0)."""
        from consumers.admin import group_lag

        rows = group_lag(
            self.broker.plaintext, self.group, self.topic, isolation_level="read_uncommitted"
        )
        return all(r.lag == 0 for r in rows)

    def drain(self, expected: set[tuple[int, int]]) -> float:
        t0 = time.monotonic()
        deadline = t0 + self.args.drain_timeout
        while True:
            if not self.worker.alive():
                _say(f"worker exited during the drain (code {self.worker.proc.returncode})")
                self.events["worker exits (unexpected)"] += 1
                self.start_worker()
            if not expected - self.trained().keys():
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                return float("nan")
            time.sleep(1.0)

    def run(self) -> int:
        args = self.args
        t_start = time.monotonic()
        _say(f"work folder {self.work}; starting a private broker")
        self.broker.start()
        from streamer.input.simulator import produce

        produce(self.broker.plaintext, self.topic, 0, partitions=PARTITIONS)  # creates it
        manifest = self.work / "manifest.csv"
        java: subprocess.Popen[bytes] | None = None
        producer: Producer | None = None
        if args.producer == "java":
            phase = f"records=0,codec={args.compression},rate={args.rate:g},seed={args.seed}"
            if args.transactional:
                phase += ",txn=100,abort_every=3"
            java = JavaProducer().start(
                self.broker.plaintext, self.topic, manifest, phase, log=self.work / "java.log"
            )
        else:
            producer = Producer(
                self.broker.plaintext, self.topic, args.rate, args.seed, args.compression
            )
            producer.start()
        self.start_worker()
        until = t_start + args.minutes * 60
        stalls = StallWatch(self)
        stalls.start()
        self.chaos(until)
        while time.monotonic() < until:
            time.sleep(0.5)
        stalls.stop.set()
        _say("chaos over: stopping the producer and draining")
        if not self.broker.running():
            self.broker.start()
        aborted: set[tuple[int, int]] = set()
        if java is not None:
            JavaProducer.stop(java, timeout=120)
            kinds = by_kind(read_manifest(manifest))
            expected = kinds.get("committed", set())
            aborted = kinds.get("aborted", set())
            # Batches the producer gave up on (the broker down longer than its timeouts).
            failed = (self.work / "java.log").read_text().count("batch failed:")
            produced, acked = len(expected) + len(aborted), len(expected)
        else:
            assert producer is not None
            producer.stop()
            ends = end_offsets(self.broker.plaintext, self.topic)
            expected = {(p, o) for p, end in ends.items() for o in range(end)}
            produced, acked, failed = producer.sent, producer.acked, producer.failed
        drain_seconds = self.drain(expected)
        self.stop_worker("SIGTERM")
        counts = self.trained()
        missing = sorted(expected - counts.keys())
        extra = set(counts.keys() - expected)
        errors = [ln for w in self.workers for ln in error_lines(w.log())]
        elapsed = time.monotonic() - t_start
        summary = {
            "elapsed_s": round(elapsed, 1),
            "producer": f"{args.producer} ({args.compression}"
            + (", transactional)" if args.transactional else ")"),
            "records_sent": produced,
            "records_acked": acked,
            "sends_failed": failed,
            "records_expected": len(expected),
            "records_aborted": len(aborted),
            "trained_unique": len(counts.keys() & expected),
            "trained_total": sum(counts.values()),
            "duplicates": sum(n - 1 for n in counts.values() if n > 1),
            "lost": len(missing),
            "aborted_trained": len(counts.keys() & aborted),
            "unknown_trained": len(extra - aborted),
            "group_at_log_end": self.group_at_log_end(),
            "broker_restarts": sum(n for k, n in self.events.items() if k.startswith("broker")),
            "worker_kills": sum(n for k, n in self.events.items() if k.startswith("worker kills")),
            "drain_seconds": round(drain_seconds, 1),
            "longest_stall_s": f"{stalls.longest:.1f} ({stalls.where})",
            "kafka_client": args.kafka_client,
            "brokers": args.brokers,
            "worker_error_lines": len(errors),
        }
        print("\nsoak summary")
        for key, value in summary.items():
            print(f"  {key:20s} {value}")
        for key, value in sorted(self.events.items()):
            print(f"  {key:28s} {value}")
        if missing:
            print(f"  LOST (first 20): {missing[:20]}")
        if errors:
            print("  worker ERROR lines (first 10):")
            for line in errors[:10]:
                print(f"    {line[:200]}")
        # Acked by the broker but not in the topic would be loss before the worker.
        ok = (
            not missing
            and not counts.keys() & aborted
            and (args.producer == "java" or acked <= len(expected))
        )
        print(f"\nsoak {'PASSED: zero lost records' if ok else 'FAILED'}")
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    if "PYTEST_CURRENT_TEST" in os.environ:
        raise RuntimeError("tests/reliability/soak.py is a command, not a pytest test")
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.soak",
        description="Broker restarts and worker kills for N minutes, then check zero lost.",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="chaos duration")
    parser.add_argument("--rate", type=float, default=300.0, help="records produced per second")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--min-gap", type=float, default=10.0, help="seconds between events")
    parser.add_argument("--max-gap", type=float, default=30.0)
    parser.add_argument("--min-down", type=float, default=1.0, help="broker downtime seconds")
    parser.add_argument("--max-down", type=float, default=10.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument(
        "--producer",
        choices=("python", "java"),
        default="python",
        help="who writes: a kafka-python producer thread, or Kafka's Java producer",
    )
    parser.add_argument(
        "--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="none"
    )
    parser.add_argument(
        "--transactional",
        action="store_true",
        help="java: transactions of 100 records, every third aborted",
    )
    parser.add_argument(
        "--worker-every", type=float, default=0.0, help="kill the worker about every S seconds"
    )
    parser.add_argument(
        "--broker-every", type=float, default=0.0, help="restart the broker about every S seconds"
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="1: a private broker; N>1: an N-node cluster (RF 3, min ISR 2) of which a random "
        "node is killed or stopped at each broker event",
    )
    parser.add_argument(
        "--kafka-client", choices=("kafka-python", "confluent"), default="kafka-python"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=3.0,
        help="the worker's --idle-timeout (a pass ends after this long without records)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args(argv)
    if args.transactional and args.producer != "java":
        parser.error("--transactional needs --producer java")
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    for tool in ("java", "bash"):
        if shutil.which(tool) is None:
            parser.error(f"needs {tool} on PATH")
    print(f"soak: seed {args.seed}, {args.minutes:g} minutes, {args.rate:g} records/s")
    work = Path(tempfile.mkdtemp(prefix="streamer-soak-"))
    soak = Soak(args, work)
    code = 1
    try:
        code = soak.run()
    finally:
        for w in soak.workers:
            if w.alive():
                w.signal(signal.SIGKILL)
        soak.broker.clean()
        if args.keep or code != 0:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
