"""Consumer-group faults, with the worker run as real processes and judged from the outside.

1. A second worker joins the group mid-stream, then leaves (SIGTERM): nothing is lost, each
   partition has one owner at a time, duplicates stay within the in-flight bound.
2. Two workers with the same --worker-id (group instance id): the newcomer fences the first,
   which exits non-zero with a clear error and commits nothing afterwards.
3. A train step slower than max_poll_interval_ms: backpressure keeps polling, so no rebalance.

Judged by each worker's audit log (``topic,partition,offset`` per trained sample), its log,
its /metrics and the group's committed offsets on the broker.
"""

from __future__ import annotations

import itertools
import re
import socket
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from streamer.input.simulator import produce
from tests.workerutil import (
    ROOT,
    RateProducer,
    WorkerProcess,
    all_records,
    audit_lines,
    committed_offsets,
    end_offsets,
    missing_and_extra,
    read_audit,
    summarize,
    worker_args,
)

START_S = 120  # TensorFlow import + group join on a loaded 2-core machine
SHUTDOWN_S = 20

# ---- helpers ------------------------------------------------------------------------------------

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_SHARD_EVENT = re.compile(
    _STAMP + r" \w+ consumers\.shard: shard (\d+): "
    r"(?:assigned partitions \[([\d, ]*)\] of \S+|partitions \[([\d, ]*)\] (revoked|lost))"
)
_ANY_STAMP = re.compile(r"^" + _STAMP, re.M)


def _time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _parts(text: str) -> set[int]:
    return {int(p) for p in text.split(",") if p.strip()}


@dataclass(frozen=True)
class ShardEvent:
    t: float
    worker: str
    shard: int
    kind: str  # "assigned", "revoked" or "lost"
    partitions: frozenset[int]


def shard_events(worker: str, log: str) -> list[ShardEvent]:
    """The ``assigned partitions`` / ``partitions ... revoked|lost`` lines of one worker's log."""
    out = []
    for m in _SHARD_EVENT.finditer(log):
        stamp, shard, assigned, gone, kind = m.groups()
        parts = _parts(assigned) if assigned is not None else _parts(gone)
        out.append(
            ShardEvent(_time(stamp), worker, int(shard), kind or "assigned", frozenset(parts))
        )
    return out


@dataclass(frozen=True)
class Ownership:
    partition: int
    owner: tuple[str, int]  # (worker, shard)
    start: float
    end: float


def ownership(events: list[ShardEvent], log_end: dict[str, float]) -> list[Ownership]:
    """Per partition, the intervals during which one shard of one worker held it.

    An interval opens at the ``assigned`` line that gives the partition to a shard (an
    assignment adds partitions: all of them after an eager revocation, those that moved in a
    cooperative rebalance) and closes at the line that takes it away (``revoked``/``lost``),
    else at the last line of that worker's log.
    """
    held: dict[tuple[str, int], dict[int, float]] = {}
    out: list[Ownership] = []
    for ev in sorted(events, key=lambda e: e.t):
        owner = (ev.worker, ev.shard)
        mine = held.setdefault(owner, {})
        closing = set() if ev.kind == "assigned" else ev.partitions & set(mine)
        for p in sorted(closing):
            out.append(Ownership(p, owner, mine.pop(p), ev.t))
        if ev.kind == "assigned":
            for p in ev.partitions:
                mine.setdefault(p, ev.t)
    for owner, mine in held.items():
        for p, start in mine.items():
            out.append(Ownership(p, owner, start, log_end[owner[0]]))
    return out


def overlaps(intervals: list[Ownership]) -> list[tuple[Ownership, Ownership]]:
    """Pairs of intervals of one partition held by different shards at the same time."""
    bad = []
    by_partition: dict[int, list[Ownership]] = {}
    for iv in intervals:
        by_partition.setdefault(iv.partition, []).append(iv)
    for ivs in by_partition.values():
        ivs.sort(key=lambda iv: (iv.start, iv.end))
        for a, b in itertools.pairwise(ivs):
            if a.owner != b.owner and b.start < a.end:
                bad.append((a, b))
    return bad


def revoke_rounds(events: list[ShardEvent], gap_s: float = 1.0) -> int:
    """Rebalance rounds in which this worker gave up partitions (revoked or lost).

    Its shards give their partitions up in the same round within milliseconds of each other
    (every member revokes before it rejoins, and a round waits for all members), so lines
    less than ``gap_s`` apart count as one round.
    """
    times = sorted(ev.t for ev in events if ev.kind != "assigned" and ev.partitions)
    rounds = 0
    last = float("-inf")
    for t in times:
        if t - last >= gap_s:
            rounds += 1
        last = t
    return rounds


def last_stamp(log: str) -> float:
    stamps = _ANY_STAMP.findall(log)
    assert stamps, "the worker log has no timestamped line"
    return _time(stamps[-1])


def extra_copies(counts: Counter[tuple[int, int]]) -> int:
    return sum(n - 1 for n in counts.values())


def tails(*workers: WorkerProcess) -> str:
    return "\n".join(w.tail(3000) for w in workers)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    """One /metrics scrape as {(sample name, sorted labels): value}; None if it failed."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def metric(
    sample: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of ``name`` over the series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in sample.items() if n == name and want <= set(ls))


class CommitWatcher(threading.Thread):
    """Samples the group's committed offsets every ``interval`` seconds until ``stop()``."""

    def __init__(self, bootstrap: str, group: str, interval: float = 0.2) -> None:
        super().__init__(name=f"commit-watcher-{group}", daemon=True)
        self.bootstrap = bootstrap
        self.group = group
        self.interval = interval
        self.history: list[tuple[float, dict[int, int]]] = []
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        from kafka.admin import KafkaAdminClient

        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="commit-watcher")
            try:
                while not self._stop_event.wait(self.interval):
                    offsets = admin.list_group_offsets(self.group).get(self.group, {})
                    self.history.append(
                        (
                            time.time(),
                            {
                                tp.partition: om.offset
                                for tp, om in offsets.items()
                                if om is not None and om.offset >= 0
                            },
                        )
                    )
            finally:
                admin.close()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> list[tuple[float, dict[int, int]]]:
        self._stop_event.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return self.history


def backwards(history: list[tuple[float, dict[int, int]]]) -> list[str]:
    """Every sample in which a partition's committed offset went below an earlier one."""
    seen: dict[int, int] = {}
    bad = []
    for t, offsets in history:
        for p, off in offsets.items():
            if off < seen.get(p, -1):
                bad.append(f"partition {p}: {seen[p]} -> {off} at {t:.3f}")
            seen[p] = max(off, seen.get(p, -1))
    return bad


# ---- 1. a second worker joins mid-stream, then leaves -------------------------------------------

PARTITIONS = 6
SHARDS = 2
BATCH = 256
MAX_POLL = 500
SESSION_MS = 6000
IDLE_S = 8

# Records one worker can train twice (or leave to its successor to train again) each time it
# gives up partitions in a rebalance. On revoke the shard commits the tracker's low
# watermark (the lowest emitted offset not yet trained) and drops its queued blocks (never
# trained, so never duplicated); whoever owns the partition next (another worker, or this
# one again after the rewind of a partition that came back) resumes at that watermark. The
# records trained twice are those this worker emitted into tf.data at or above the watermark:
# either still in its pipeline (it trains them after the revoke; the tracker ignores their
# acks) or already trained out of order above an older block. That is the pipeline's
# content, at most (like the kill -9 bound of test_worker_process.py):
#   2 blocks per shard in the interleave buffers, SHARDS + 4 decode calls (the dataset's
#   private thread pool), the block rebatch is cutting, each block one poll of <= MAX_POLL;
#   plus the batches the AUTOTUNE prefetch holds. Training here is far faster than input
#   (a tiny MLP on 3,000 records/s), so the prefetch buffer stays near empty; we allow
#   PREFETCH_BATCHES full batches.
# A clean stop (SIGTERM) revokes at close too: the same bound covers it.
PREFETCH_BATCHES = 16
PIPELINE_BLOCKS = 2 * SHARDS + (SHARDS + 4) + 1
DUPLICATES_PER_REVOKE = PIPELINE_BLOCKS * MAX_POLL + PREFETCH_BATCHES * BATCH


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_second_worker_joins_then_leaves_nothing_lost_one_owner_at_a_time(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    topic = make_topic(PARTITIONS)
    audit = {"a": tmp_path / "audit-a.csv", "b": tmp_path / "audit-b.csv"}

    def args(name: str) -> list[str]:
        return worker_args(
            kafka_bootstrap,
            topic,
            group_id,
            audit[name],
            shards=SHARDS,
            batch_size=BATCH,
            stop_after_idle=IDLE_S,
            worker_id=name,
            extra=[
                "--session-timeout-ms",
                str(SESSION_MS),
                "--max-poll-records",
                str(MAX_POLL),
                "--shutdown-timeout",
                str(SHUTDOWN_S),
            ],
        )

    producer = RateProducer(kafka_bootstrap, topic, rate=3000, seed=11)
    producer.start()
    a = b = None
    try:
        a = WorkerProcess.start(args("a"), tmp_path / "worker-a.log")
        a.wait_for(lambda: a.samples_trained() >= 3000, START_S, "worker a training")
        b = WorkerProcess.start(args("b"), tmp_path / "worker-b.log")
        b.wait_for(lambda: b.samples_trained() >= 3000, START_S, "worker b training")
        time.sleep(3)
        assert a.alive(), tails(a, b)
        b.terminate()
        assert b.wait(SHUTDOWN_S + 10) == 0, tails(a, b)
        stopped = b.stopped()
        assert stopped is not None and stopped[0] == "signal SIGTERM", b.tail()

        # Static members do not leave the group on close: b's partitions go back to a only
        # when the broker expires b's session. Keep producing until a holds all of them.
        def a_holds_all() -> bool:
            held: dict[int, set[int]] = {}
            for ev in shard_events("a", a.log()):
                if ev.kind == "assigned":  # adds (eager: after revoking everything)
                    held[ev.shard] = held.get(ev.shard, set()) | ev.partitions
                else:
                    held[ev.shard] = held.get(ev.shard, set()) - ev.partitions
            return set().union(*held.values()) == set(range(PARTITIONS)) if held else False

        a.wait_for(a_holds_all, SESSION_MS / 1000 + 30, "worker a holding every partition again")
        time.sleep(2)
    finally:
        sent = producer.stop()
        if b is not None and b.alive():
            b.kill()
    assert a is not None and b is not None
    rc = a.wait(START_S)
    logs = tails(a, b)
    assert rc == 0, logs
    a_stopped = a.stopped()
    assert a_stopped is not None and a_stopped[0] == f"idle for {IDLE_S}s", a.tail()

    ends = end_offsets(kafka_bootstrap, topic)
    assert sum(ends.values()) == sent
    counts = {name: read_audit(path, topic) for name, path in audit.items()}
    union = counts["a"] + counts["b"]
    missing, extra = missing_and_extra(union, all_records(ends))
    assert not missing, f"records never trained: {summarize(missing)}\n{logs}"
    assert not extra, f"audited records never produced: {summarize(extra)}\n{logs}"
    assert counts["b"], f"worker b trained nothing\n{logs}"
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends, logs

    # One owner at a time, from the workers' own assignment lines (same host, same clock):
    # with eager rebalancing every member revokes before it rejoins, so a partition's next
    # owner is assigned it only after the previous owner logged its revoke.
    log_text = {"a": a.log(), "b": b.log()}
    events = {name: shard_events(name, text) for name, text in log_text.items()}
    intervals = ownership(
        events["a"] + events["b"], {name: last_stamp(text) for name, text in log_text.items()}
    )
    clash = overlaps(intervals)
    assert not clash, f"partitions held by two shards at once: {clash[:5]}\n{logs}"
    b_parts = {iv.partition for iv in intervals if iv.owner[0] == "b"}
    assert b_parts, f"worker b was never assigned a partition\n{logs}"
    assert {p for p, _ in counts["b"]} <= b_parts, "b trained a partition it never held"
    assert not [ev for name in events for ev in events[name] if ev.kind == "lost"], logs
    # b left cleanly, but as a static member (no LeaveGroup on close): its partitions went
    # back to a when the broker expired b's session, SESSION_MS after b's consumers closed.
    b_closed = last_stamp(log_text["b"])
    back = [ev.t for ev in events["a"] if ev.kind == "assigned" and ev.t > b_closed]
    assert back, f"a got no assignment after b closed\n{logs}"
    back_s = back[0] - b_closed
    assert back_s <= SESSION_MS / 1000 + 10, f"{back_s:.1f}s until a got b's partitions\n{logs}"

    # Duplicates: only at rebalances, at most one pipeline's content per round a worker gave
    # partitions up in (see DUPLICATES_PER_REVOKE).
    rounds = {name: revoke_rounds(evs) for name, evs in events.items()}
    total = extra_copies(union)
    bound = sum(rounds.values()) * DUPLICATES_PER_REVOKE
    assert total <= bound, (
        f"{total} duplicate trainings, bound {bound} ({rounds} revoke rounds x "
        f"{DUPLICATES_PER_REVOKE})\n{logs}"
    )
    within = {name: extra_copies(c) for name, c in counts.items()}
    across = len(counts["a"].keys() & counts["b"].keys())
    print(
        f"join/leave: {sent} records; duplicates {total} (within a {within['a']}, within b "
        f"{within['b']}, trained by both {across}); revoke rounds {rounds}, bound {bound}; "
        f"b held {sorted(b_parts)}; a reassigned {back_s:.1f}s after b closed"
    )


# ---- 2. two workers with one group instance id -------------------------------------------------

_FENCED_ERROR = re.compile(r"ERROR streamer\.lifecycle: .*fenced.*'same-shard-0'")


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_same_group_instance_id_fences_the_first_worker(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str, tmp_path: Path
) -> None:
    topic = make_topic(2)
    audit = {"first": tmp_path / "audit-first.csv", "second": tmp_path / "audit-second.csv"}

    def args(name: str) -> list[str]:
        return worker_args(
            kafka_bootstrap,
            topic,
            group_id,
            audit[name],
            shards=1,
            batch_size=64,
            stop_after_idle=IDLE_S,
            worker_id="same",
        )

    watcher = CommitWatcher(kafka_bootstrap, group_id)
    watcher.start()
    producer = RateProducer(kafka_bootstrap, topic, rate=1000, seed=12)
    producer.start()
    first = second = None
    try:
        first = WorkerProcess.start(args("first"), tmp_path / "worker-first.log")
        first.wait_for(
            lambda: first.samples_trained() >= 1000, START_S, "the first worker training"
        )
        second = WorkerProcess.start(args("second"), tmp_path / "worker-second.log")
        second.wait_for(
            lambda: "assigned partitions" in second.log(), START_S, "the second worker joining"
        )
        joined = time.monotonic()
        # The second member takes over the instance id: the first is fenced at its next
        # heartbeat or commit and stops.
        rc_first = first.wait(60)
        fenced_seconds = time.monotonic() - joined
        second.wait_for(lambda: second.samples_trained() >= 2000, START_S, "the second training")
    finally:
        sent = producer.stop()
        if first is not None and first.alive():
            first.kill()
    assert first is not None and second is not None
    rc_second = second.wait(START_S)
    history = watcher.stop()
    logs = tails(first, second)

    assert rc_first != 0, f"the fenced worker exited {rc_first}\n{logs}"
    assert _FENCED_ERROR.search(first.log()), f"no clear fenced error naming the id\n{logs}"
    assert not _FENCED_ERROR.search(second.log()), logs
    assert rc_second == 0, logs
    # kafka-python's heartbeat thread sees the fence within a heartbeat but does not raise it
    # into poll(); the shard learns it from its next (rejected) commit: commit_every_seconds
    # (5 s) after that at most, then the worker stops.
    assert fenced_seconds < 15, f"the fenced worker ran on for {fenced_seconds:.1f}s\n{logs}"

    # Nothing committed after the fence: the broker rejects the fenced member's commits, so
    # the group's offsets never go back to the first worker's (older) position.
    back = backwards(history)
    assert not back, f"committed offsets went backwards: {back[:5]}\n{logs}"
    ends = end_offsets(kafka_bootstrap, topic)
    assert sum(ends.values()) == sent
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends, logs
    counts = {name: read_audit(path, topic) for name, path in audit.items()}
    union = counts["first"] + counts["second"]
    missing, extra = missing_and_extra(union, all_records(ends))
    assert not missing, f"records never trained: {summarize(missing)}\n{logs}"
    assert not extra, f"audited records never produced: {summarize(extra)}\n{logs}"
    print(
        f"fencing: first worker exit {rc_first} {fenced_seconds:.1f}s after the second joined; "
        f"{sent} records, duplicates {extra_copies(union)} (trained by both "
        f"{len(counts['first'].keys() & counts['second'].keys())}); {len(history)} commit samples"
    )


# ---- 3. a train step slower than max_poll_interval_ms -------------------------------------------

_LAG = re.compile(r"progress step=\d+ \S+ lag=(\d+) ")
SLOW_RECORDS = 1536  # 24 full batches of 64: the last batch needs no end of pass to come out


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_slow_step_beyond_max_poll_interval_causes_no_rebalance(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.reliability.slowmodel import STEP_SLEEP_S

    max_poll_interval_ms = 1000
    assert max_poll_interval_ms < STEP_SLEEP_S * 1000
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, SLOW_RECORDS, partitions=2, seed=3)
    ends = end_offsets(kafka_bootstrap, topic)
    audit = tmp_path / "audit.csv"
    port = free_port()
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # for --model tests.reliability.slowmodel:build
    args = worker_args(
        kafka_bootstrap,
        topic,
        group_id,
        audit,
        shards=1,
        batch_size=64,
        stop_after_idle=5,
        worker_id="slow",
        extra=[
            "--model",
            "tests.reliability.slowmodel:build",
            "--max-poll-interval-ms",
            str(max_poll_interval_ms),
            "--metrics-port",
            str(port),
            # Small blocks and a short shard queue, so that the queue fills while the slow
            # steps hold the pipeline and the shard has to pause its partitions.
            "--max-poll-records",
            "50",
            "--queue-max-blocks",
            "2",
        ],
    )
    worker = WorkerProcess.start(args, tmp_path / "worker.log")
    samples = []
    while worker.alive():
        sample = scrape(port)
        if sample is not None:
            samples.append(sample)
        time.sleep(0.5)
    rc = worker.wait(10)
    assert rc == 0, worker.tail()
    log = worker.log()

    steps = -(-SLOW_RECORDS // 64)
    # Scrapes between the first and the last step (the pass ends, and the consumer closes,
    # right after the last step: the idle clock counts from the last record polled, which
    # was long before).
    training = [s for s in samples if 1 <= metric(s, "streamer_train_steps_total") < steps]
    assert len(training) >= 20, f"{len(training)} scrapes while training\n{worker.tail()}"
    # No rebalance while it trains: the revoked count stays where it was after step 1
    # (joining may revoke once, before training) and nothing is lost. Closing the consumer
    # at the end revokes on purpose.
    base = metric(training[0], "streamer_rebalances_total", event="revoked")
    for s in training:
        assert metric(s, "streamer_rebalances_total", event="revoked") == base, worker.tail()
        assert metric(s, "streamer_assigned_partitions") == 2, worker.tail()
    assert all(metric(s, "streamer_rebalances_total", event="lost") == 0 for s in samples)
    # The log agrees: no revoke or loss between the first and the last step (the pass ends
    # after the last step and closing the consumer revokes then, on purpose).
    first_progress = log.index("progress step=")
    last_step = log.find(f"progress step={steps} ")
    assert last_step > first_progress, worker.tail()
    late = [
        ev for ev in shard_events("slow", log[first_progress:last_step]) if ev.kind != "assigned"
    ]
    assert not late, f"rebalanced while training: {late}\n{worker.tail()}"
    # The shard kept polling and paused its partitions instead.
    paused = max(metric(s, "streamer_paused_partitions") for s in samples)
    assert paused > 0, f"partitions were never paused\n{worker.tail()}"
    slowest = max(p.step for p in worker.progress())
    assert slowest == steps, worker.tail()

    counts = read_audit(audit, topic)
    missing, extra = missing_and_extra(counts, all_records(ends))
    dups = sorted(k for k, n in counts.items() if n > 1)
    assert not missing, f"records never trained: {summarize(missing)}\n{worker.tail()}"
    assert not extra, f"audited records never produced: {summarize(extra)}\n{worker.tail()}"
    assert not dups, f"records trained twice: {summarize(dups)}\n{worker.tail()}"
    assert audit_lines(audit) == SLOW_RECORDS
    # Lag back to 0: the worker's own consumer_lag_records in the status line of the last
    # step (before the close removes the per-partition series), and the group's commits.
    lag = _LAG.match(log, last_step)
    assert lag is not None and int(lag.group(1)) == 0, worker.tail()
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends, worker.tail()
    last = training[-1]
    step_s = metric(last, "streamer_train_step_seconds_sum") / metric(
        last, "streamer_train_steps_total"
    )
    print(
        f"slow step: {steps} steps of ~{step_s:.2f}s (> max_poll_interval_ms "
        f"{max_poll_interval_ms}), {len(training)} scrapes while training, revoked {base:g} "
        f"(joining), max paused {paused:g}"
    )
