"""Broker faults on a 3-node cluster while records flow (issue 24), on both Kafka clients.

A 6-partition topic, replication factor 3, ``min.insync.replicas=2``; a producer writes with
``acks=all`` all along (it never pauses, so a pass never ends by itself and only the clients'
own recovery can bring a partition back; --idle-timeout outlasts the producer's own stall at a
leader's death, so no pass ends during the faults). The worker trains with checkpoints (commits go with
them, every 3 s). Then, one after the other: ``kill -9`` of the node leading most partitions,
its restart, ``kill -9`` of the group's coordinator, its restart. Asserted, per client:

- every record in the log trained at least once, exit 0 to idle, the commits at the log ends;
- no record trained twice, and no rebalance caused by a broker fault (Kafka's own ``OffsetValidationTest`` requires none on
  a broker bounce): the worker's ``streamer_rebalances_total`` does not move after the start;
- no record acknowledged during the faults waits longer than ``STALL_BOUND_S`` to be trained
  (a partition that stopped training while its log grew would fail this); the duplicates and
  the longest wait are printed (docs/explanation/clusters.md table); the worker's own lag figure never stays the
  same for that long while records are produced (a frozen figure would never fire an alert).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.cluster import KafkaCluster
from tests.reliability.relutil import http_get, metrics_base, start_worker
from tests.workerutil import (
    WorkerProcess,
    all_records,
    committed_offsets,
    end_offsets,
    free_port,
    missing_and_extra,
    parse_metrics,
    read_audit,
    summarize,
    worker_args,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 6
RATE = 300  # records/s, all partitions
# A partition with records trains again within this after a broker fault: the client's
# failover (the broker session timeout of 9 s that ends the dead node's leadership, a
# metadata refresh, a reconnect) plus a checkpoint interval, with room for a loaded CI host.
STALL_BOUND_S = 45.0
STOP_AFTER_IDLE_S = 55
#: Once the cluster is whole again, a record waits at most this long past that (or past its
#: own ack, if later) to be trained, on every partition.
WHOLE_BOUND_S = 30.0
IDLE_TIMEOUT_S = 20
SOAK_IDLE_TIMEOUT_S = 60


class _Producer(threading.Thread):
    """Writes simulator records round-robin to every partition at ``RATE`` with ``acks=all``,
    noting when each was acknowledged (its partition and offset come with the ack)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name="acks-producer", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.acked: dict[tuple[int, int], float] = {}
        self.failed = 0
        self.error: BaseException | None = None
        self.stop_event = threading.Event()

    def _ack(self, md: object) -> None:
        self.acked[md.partition, md.offset] = time.monotonic()  # type: ignore[attr-defined]

    def _fail(self, exc: BaseException) -> None:
        self.failed += 1

    def run(self) -> None:
        import numpy as np
        from kafka import KafkaProducer

        from streamer.input.simulator import SimulatorTask

        rng = np.random.default_rng(0)
        task = SimulatorTask()
        chunk = max(1, RATE // 20)
        try:
            producer = KafkaProducer(
                bootstrap_servers=self.bootstrap.split(","), acks="all", linger_ms=10
            )
            try:
                t0, sent = time.monotonic(), 0
                while not self.stop_event.is_set():
                    wait = t0 + sent / RATE - time.monotonic()
                    if wait > 0 and self.stop_event.wait(wait):
                        break
                    for i, value in enumerate(task.records(chunk, rng)):
                        future = producer.send(self.topic, value=value, partition=(sent + i) % 6)
                        future.add_callback(self._ack).add_errback(self._fail)
                    sent += chunk
                producer.flush(timeout=120)
            finally:
                producer.close(timeout=30)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> int:
        self.stop_event.set()
        self.join(180)
        assert not self.is_alive(), "the producer did not stop"
        if self.error is not None:
            raise self.error
        return len(self.acked)


class _Trained(threading.Thread):
    """Follows the audit log: when each record was first seen trained (0.25 s resolution)."""

    def __init__(self, audit: Path) -> None:
        super().__init__(name="trained-monitor", daemon=True)
        self.audit = audit
        self.stop = threading.Event()
        self.first: dict[tuple[int, int], float] = {}
        self._read = 0

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.sample()

    def sample(self) -> None:
        try:
            with open(self.audit, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self._read:
                    self._read = 0  # cut back (a rollback dropped its lines): read it again
                fh.seek(self._read)
                chunk = fh.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1  # whole lines only
        self._read += end
        now = time.monotonic()
        for line in chunk[:end].decode("ascii").splitlines():
            _, p, o = line.rsplit(",", 2)
            self.first.setdefault((int(p), int(o)), now)

    def finish(self) -> None:
        self.stop.set()
        self.join(10)
        self.sample()


def _longest_wait(
    acked: dict[tuple[int, int], float],
    trained: dict[tuple[int, int], float],
    since: float,
    until: float,
) -> tuple[float, tuple[int, int] | None]:
    """The longest time a record acknowledged between ``since`` and ``until`` waited to be
    trained (after ``until`` the producer stops: the pass's last partial batch waits for the
    pass to end, --idle-timeout)."""
    worst, which = 0.0, None
    for key, at in acked.items():
        if since <= at <= until and key in trained and trained[key] - at > worst:
            worst, which = trained[key] - at, key
    return worst, which


def _left_behind_after(
    acked: dict[tuple[int, int], float],
    trained: dict[tuple[int, int], float],
    whole: float,
    until: float,
) -> dict[int, float]:
    """Per partition, the longest a record acknowledged before ``until`` waited to be trained
    past the moment the cluster was whole again (``whole``), or past its own ack if later."""
    worst: dict[int, float] = {}
    for key, at in acked.items():
        if at <= until and key in trained:
            past = trained[key] - max(at, whole)
            if past > worst.get(key[0], 0.0):
                worst[key[0]] = past
    return worst


class _LagWatch(threading.Thread):
    """Samples the worker's own lag (Σ ``streamer_consumer_lag_records``) twice a second: the
    longest time it stayed the same while records were produced, and its highest value. A
    figure frozen through a fault would never fire a lag alert."""

    def __init__(self, base: str) -> None:
        super().__init__(name="lag-watch", daemon=True)
        self.base = base
        self.stop = threading.Event()
        self.frozen = 0.0
        self.highest = 0.0
        self._last: tuple[float, float] | None = None  # (value, since)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                status, body = http_get(f"{self.base}/metrics", timeout=2)
            except OSError:
                continue
            if status != 200:
                continue
            samples = parse_metrics(body).get("streamer_consumer_lag_records", [])
            value, now = sum(v for _, v in samples), time.monotonic()
            self.highest = max(self.highest, value)
            if self._last is None or self._last[0] != value:
                self._last = (value, now)
            else:
                self.frozen = max(self.frozen, now - self._last[1])


def _rebalances(base: str) -> float:
    status, body = http_get(f"{base}/metrics")
    assert status == 200
    return sum(v for _, v in parse_metrics(body).get("streamer_rebalances_total", []))


def _most_leading(cluster: KafkaCluster, topic: str) -> int:
    leaders = Counter(cluster.leader_of(topic, p) for p in range(PARTITIONS))
    return leaders.most_common(1)[0][0]


Faults = Callable[[KafkaCluster, str, str], list[str]]


def _leader_then_coordinator(cluster: KafkaCluster, topic: str, group: str) -> list[str]:
    """kill -9 of the node leading most partitions, its restart; then of the coordinator."""
    leader = _most_leading(cluster, topic)
    cluster.kill_node(leader)
    time.sleep(15)
    cluster.restart_node(leader)
    time.sleep(5)
    coordinator = cluster.coordinator_of(group)
    cluster.kill_node(coordinator)
    time.sleep(15)
    cluster.restart_node(coordinator)
    return [
        f"kill -9 node {leader} (leading most partitions)",
        f"kill -9 node {coordinator} (the group's coordinator)",
    ]


def _rolling_restart(cluster: KafkaCluster, topic: str, group: str) -> list[str]:
    """The weekly upgrade: every node in turn stopped (SIGTERM) and started again, each once
    the cluster is whole (every ISR full)."""
    for node in range(1, cluster.nodes + 1):
        cluster.stop_node(node)
        time.sleep(5)
        cluster.restart_node(node)
        time.sleep(5)
    return [f"rolling restart of nodes 1..{cluster.nodes} (SIGTERM)"]


def _controller_bounce(cluster: KafkaCluster, topic: str, group: str) -> list[str]:
    controller = cluster.controller()
    cluster.stop_node(controller)
    time.sleep(10)
    cluster.restart_node(controller)
    return [f"SIGTERM of node {controller} (the active controller), restarted after 10 s"]


def _isr_below_minimum(cluster: KafkaCluster, topic: str, group: str) -> list[str]:
    """Two of three nodes down for 20 s: acks=all writes fail (NotEnoughReplicas) or wait, the
    KRaft quorum is lost; the worker keeps what it has and resumes."""
    down = [n for n in range(1, cluster.nodes + 1) if n != cluster.coordinator_of(group)][:2]
    for node in down:
        cluster.kill_node(node)
    time.sleep(20)
    for node in down:
        cluster.restart_node(node)
    return [f"kill -9 of nodes {down} (ISR below min.insync.replicas) for 20 s"]


def _coordinator_paused(cluster: KafkaCluster, topic: str, group: str) -> list[str]:
    """A network pause (SIGSTOP) of the coordinator longer than the broker session timeout."""
    coordinator = cluster.coordinator_of(group)
    cluster.pause_node(coordinator)
    time.sleep(20)
    cluster.resume_node(coordinator)
    cluster.wait_healthy(120)
    return [f"SIGSTOP of node {coordinator} (the group's coordinator) for 20 s"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("client", "idle_timeout"),
    [
        ("kafka-python", IDLE_TIMEOUT_S),
        ("confluent", IDLE_TIMEOUT_S),
        # Passes end while the producer stalls at a leader's death: a pass's last commit
        # meets the dead coordinator (kafka-python trained 754 records twice here before
        # a failed commit was asked for again).
        ("kafka-python", 3),
    ],
    ids=["kafka-python", "confluent", "kafka-python-passes-end"],
)
def test_leader_and_coordinator_killed_while_records_flow(
    kafka_cluster: KafkaCluster, tmp_path: Path, client: str, idle_timeout: int
) -> None:
    _run_faults(kafka_cluster, tmp_path, client, idle_timeout, _leader_then_coordinator)


@pytest.mark.soak
@pytest.mark.timeout(600)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
@pytest.mark.parametrize(
    "faults",
    [_rolling_restart, _controller_bounce, _isr_below_minimum, _coordinator_paused],
    ids=["rolling-restart", "controller-bounce", "isr-below-min", "coordinator-paused"],
)
def test_more_cluster_faults_while_records_flow(
    kafka_cluster: KafkaCluster, tmp_path: Path, client: str, faults: Faults
) -> None:
    """Not in CI (``-m soak``): the rest of the weekly and monthly faults, measured once.
    --idle-timeout outlasts every outage here (two nodes down stops the acks=all producer for
    as long), so a pass ending for want of records is not counted as a rebalance."""
    _run_faults(kafka_cluster, tmp_path, client, SOAK_IDLE_TIMEOUT_S, faults)


def _run_faults(
    cluster: KafkaCluster, tmp_path: Path, client: str, idle_timeout: int, faults: Faults
) -> None:
    cluster.heal()
    bootstrap = cluster.bootstrap
    topic = cluster.create_topic("faults", PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    audit = tmp_path / "audit.csv"
    args = worker_args(
        bootstrap,
        topic,
        group,
        audit,
        shards=2,
        batch_size=128,
        # The worker stops by itself once idle (the producer stopped): longer than any gap
        # in training the faults may cause (the stall bound, plus a margin), so a stall
        # within the bound does not stop it. (20 s stopped it once in CI: a coordinator's
        # death with passes ending left 21 s without a trained record, lag 3,680.)
        stop_after_idle=max(idle_timeout, STOP_AFTER_IDLE_S),
        checkpoint_dir=tmp_path / "ckpt",
        extra=[
            "--kafka-client", client,
            "--checkpoint-every-seconds", "3",
            # Longer than the producer's own stall at a leader's death: a pass never ends
            # during the faults, so only the clients' recovery brings a partition back.
            "--idle-timeout", str(idle_timeout),
            "--metrics-port", str(free_port()),
        ],
    )  # fmt: skip
    producer = _Producer(bootstrap, topic)
    producer.start()
    worker: WorkerProcess = start_worker(args, tmp_path / "worker.log")
    trained = _Trained(audit)
    try:
        base = metrics_base(worker)
        worker.wait_for(lambda: audit.exists() and audit.stat().st_size > 0, 120, "training")
        trained.start()
        time.sleep(5)  # the group settles, a checkpoint and a commit land
        rebalances = _rebalances(base)
        since = time.monotonic()
        lag = _LagWatch(base)
        lag.start()
        done = faults(cluster, topic, group)
        cluster.wait_healthy(120)
        whole = time.monotonic()  # every node back, every ISR full
        time.sleep(10)
        lag.stop.set()
        during = _rebalances(base) - rebalances
        until = time.monotonic() - 5  # later records may wait for the pass's last batch

        sent = producer.finish()
        ends = end_offsets(bootstrap, topic)
        # Once every record is trained, a SIGTERM: a clean stop (its checkpoint and commit)
        # instead of --stop-after-idle's 55 s of waiting (the idle stop stays as a bound).
        want = all_records(ends)
        worker.wait_for(
            lambda: want <= trained.first.keys(),  # the monitor follows the audit log
            max(idle_timeout, STOP_AFTER_IDLE_S) + 120,
            "every record trained",
        )
        worker.terminate()
        code = worker.wait(120)
        committed = committed_offsets(bootstrap, group, topic)
    finally:
        trained.finish()
        if producer.is_alive():
            producer.finish()
        worker.kill()
        cluster.heal()
    log = worker.log()
    assert code == 0, worker.tail()
    counts = read_audit(audit, topic)
    missing, extra = missing_and_extra(counts, all_records(ends))
    dups = sum(n - 1 for n in counts.values())
    wait, which = _longest_wait(producer.acked, trained.first, since, until)
    behind = _left_behind_after(producer.acked, trained.first, whole, until)
    print(
        f"{client}: {'; '.join(done)}: {sent} acked ({sum(ends.values())} in the log, "
        f"{producer.failed} sends failed), {len(counts)} trained, {dups} trained twice, "
        f"{during:g} rebalance callbacks, longest wait from ack to training {wait:.1f}s "
        f"(record {which}); lag at most {lag.highest:g}, the same for at most "
        f"{lag.frozen:.1f}s; 'Marking the coordinator dead' lines "
        f"{log.count('Marking the coordinator dead')}, ERROR lines {log.count(' ERROR ')}; "
        f"longest wait past the cluster whole again, per partition: "
        f"{ {p: round(w, 1) for p, w in sorted(behind.items())} }; "
        f"'left behind' warnings {log.count('left behind:')}"
    )
    assert committed == ends, f"commits {committed}, log ends {ends}"
    assert not missing, f"never trained: {summarize(sorted(missing))}\n{worker.tail()}"
    assert not extra, summarize(sorted(extra))
    assert dups == 0, f"{dups} records trained twice"
    if idle_timeout >= IDLE_TIMEOUT_S:  # else passes end (and close their consumers) by design
        assert during == 0, f"{during:g} rebalance callbacks during the broker faults"
        assert wait < STALL_BOUND_S, f"record {which} waited {wait:.0f}s to be trained"
        # Issue 35: every partition with waiting records trains within 30 s of the cluster
        # being whole again (kafka-python once left one behind for 110 s).
        late = {p: w for p, w in behind.items() if w > WHOLE_BOUND_S}
        assert not late, f"partitions left behind after the cluster was whole: {late}"
        assert lag.frozen < STALL_BOUND_S, f"the lag figure froze for {lag.frozen:.0f}s"


@pytest.mark.timeout(300)
def test_a_consumer_opened_while_a_node_is_down_reads_the_topic_from_the_others(
    kafka_cluster: KafkaCluster,
) -> None:
    """Every pass opens its shards' consumers, and each reads the topic's metadata first. With
    one node of three killed, kafka-python sent that read to the dead node now and then and
    raised its KafkaConnectionError (14 of 100 opens): the shard failed and the worker exited
    1 when a pass began during a broker's restart. The read now goes to another node."""
    from consumers.clients.kafka_python import open_client
    from consumers.settings import ConsumerSettings

    topic = kafka_cluster.create_topic("open", PARTITIONS)
    kafka_cluster.kill_node(1)
    try:
        failed: list[str] = []
        for _ in range(60):
            settings = ConsumerSettings(
                bootstrap_servers=kafka_cluster.bootstrap, topic=topic, group_id="g-open"
            )
            client = open_client(settings, 0)
            try:
                assert client.topic_partitions(refresh=True) == frozenset(range(PARTITIONS))
            except Exception as exc:
                failed.append(repr(exc))
            finally:
                client.close(1000)
        assert not failed, f"{len(failed)} of 60 opens failed: {failed[0]}"
    finally:
        kafka_cluster.heal()
