"""The shard contract, run over every Kafka client (kafka-python, confluent-kafka) and shard
runtime (thread, process) against the real broker.

What an owner (``streamer.input.source``) relies on, whatever runs the consumer: every record once,
blocks claimed under the revocation lock, commits of what is asked and nothing else (also at
close), partitions started where the owner says, a full queue pausing its partitions, and
commit points that reach the log end past transaction markers.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from consumers import ConsumerSettings, JoinBarrier, ShardHooks, ShardLike, open_shard
from consumers.block import RecordBlock
from consumers.clients.base import GroupCommit
from tests.workerutil import committed_offsets, end_offsets

pytestmark = pytest.mark.kafka

#: (client, runtime): every Kafka client in every shard runtime.
KINDS = [
    pytest.param(client, runtime, id=f"{client}-{runtime}")
    for client in ("kafka-python", "confluent")
    for runtime in ("thread", "process")
]


class Recorder(ShardHooks):
    """Hooks that remember what the shard said; seeks from ``restore`` on assignment."""

    def __init__(self, restore: dict[int, int] | None = None) -> None:
        self.restore = dict(restore or {})
        self.assigned: list[list[int]] = []
        self.paused: list[int] = []
        self.commits: list[dict[int, int]] = []
        #: The group's commits the shard read in its assignment callbacks.
        self.group_commits: dict[int, GroupCommit] = {}
        self._lock = threading.Lock()

    def on_assigned(
        self,
        shard_index: int,
        partitions: list[int],
        group: dict[int, GroupCommit] | None = None,
    ) -> dict[int, int]:
        with self._lock:
            self.assigned.append(sorted(partitions))
            if group is not None:
                self.group_commits.update(group)
        return {p: o for p, o in self.restore.items() if p in partitions}

    def on_paused(self, shard_index: int, paused: int) -> None:
        self.paused.append(paused)

    def on_commit(
        self, offsets: dict[int, int], ok: bool, seconds: float, error: str | None
    ) -> None:
        if ok:
            self.commits.append(dict(offsets))


def produce(bootstrap: str, topic: str, per_partition: int, partitions: int, pad: int = 0) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for i in range(per_partition):
            for p in range(partitions):
                producer.send(topic, value=f"{p}:{i}".encode() + b"." * pad, partition=p)
        producer.flush(60)
    finally:
        producer.close(timeout=30)


def settings(
    bootstrap: str,
    topic: str,
    client: str,
    runtime: str,
    *,
    group: str,
    mode: str = "static",
    partitions: tuple[int, ...] = (0, 1, 2, 3),
    **extra: object,
) -> ConsumerSettings:
    return ConsumerSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
        mode=mode,  # type: ignore[arg-type]
        partitions=partitions if mode == "static" else None,
        shard_runtime=runtime,  # type: ignore[arg-type]
        client=client,  # type: ignore[arg-type]
        session_timeout_ms=10_000,
        **extra,  # type: ignore[arg-type]
    )


def drain(
    shards: list[ShardLike], until: Callable[[Counter[tuple[int, int]]], bool], timeout: float = 60
) -> tuple[Counter[tuple[int, int]], dict[int, int]]:
    """Take blocks from every shard until ``until(seen)``; returns the records seen and, per
    partition, the highest next offset of a block (its records and ends)."""
    seen: Counter[tuple[int, int]] = Counter()
    reach: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while not until(seen):
        assert time.monotonic() < deadline, f"only {len(seen)} records after {timeout}s"
        for shard in shards:
            block: RecordBlock | None = shard.get(0.05)
            if block is None:
                continue
            for p, o in zip(block.partition.tolist(), block.offset.tolist(), strict=True):
                seen[p, o] += 1
            for p, nxt in block.next_offsets().items():
                reach[p] = max(nxt, reach.get(p, 0))
    return seen, reach


@pytest.fixture
def started() -> Iterator[Callable[..., ShardLike]]:
    """Factory: ``open_shard`` + start, every shard closed at the end."""
    opened: list[ShardLike] = []

    def start(*args: object, **kwargs: object) -> ShardLike:
        shard = open_shard(*args, **kwargs).start()  # type: ignore[arg-type]
        opened.append(shard)
        return shard

    yield start
    for shard in opened:
        shard.close()


@pytest.mark.parametrize(("client", "runtime"), KINDS)
def test_static_shards_deliver_every_record_once_and_commit_what_is_asked(
    client: str,
    runtime: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    started: Callable[..., ShardLike],
) -> None:
    topic = make_topic(4)
    produce(kafka_bootstrap, topic, 50, 4)
    cs = settings(kafka_bootstrap, topic, client, runtime, group=group_id)
    shards = [started(cs, k, 2, hooks=Recorder()) for k in range(2)]
    every = {(p, o) for p in range(4) for o in range(50)}
    seen, _ = drain(shards, lambda s: s.keys() >= every)
    assert set(seen) == every and max(seen.values()) == 1
    assert shards[0].assigned == {0, 2} and shards[1].assigned == {1, 3}
    # Commit what was "trained" of two partitions; close flushes it; nothing else moves.
    shards[0].commit({0: 20, 2: 50, 1: 7})  # partition 1 is not shard 0's: not sent
    shards[1].commit({3: 33})
    for shard in shards:
        shard.close()
    assert committed_offsets(kafka_bootstrap, group_id, topic) == {0: 20, 1: None, 2: 50, 3: 33}


@pytest.mark.parametrize(("client", "runtime"), KINDS)
def test_assigned_partitions_start_where_the_owner_says(
    client: str,
    runtime: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    started: Callable[..., ShardLike],
) -> None:
    topic = make_topic(4)
    produce(kafka_bootstrap, topic, 30, 4)
    restore = {0: 25, 3: 10}
    cs = settings(kafka_bootstrap, topic, client, runtime, group=group_id)
    shard = started(cs, 0, 1, hooks=Recorder(restore), restore=restore)
    want = {(p, o) for p in range(4) for o in range(restore.get(p, 0), 30)}
    seen, _ = drain([shard], lambda s: s.keys() >= want)
    assert set(seen) == want


@pytest.mark.parametrize(("client", "runtime"), KINDS)
def test_group_shards_split_the_partitions_and_a_full_queue_pauses_them(
    client: str,
    runtime: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    started: Callable[..., ShardLike],
) -> None:
    topic = make_topic(4)
    # 10 KiB records, 10 a block: a process shard holds its parent's queue (8 blocks), its ring
    # (16 more slots) and its child's queue (8) before it pauses: 320 of a shard's 400 records.
    produce(kafka_bootstrap, topic, 200, 4, pad=10_000)
    cs = settings(
        kafka_bootstrap, topic, client, runtime, group=group_id, mode="group", max_poll_records=10
    )
    barrier = JoinBarrier(2, settle_seconds=1.5)
    hooks = [Recorder(), Recorder()]
    shards = [started(cs, k, 2, hooks=hooks[k], barrier=barrier) for k in range(2)]
    deadline = time.monotonic() + 60

    def settled_and_full() -> bool:
        # ``joining`` also asks a process shard's barrier. Shards hold their partitions paused
        # while the pass joins; after that only a full queue pauses them (nobody takes blocks).
        joined = not any([shard.joining for shard in shards])
        covered = shards[0].assigned | shards[1].assigned == {0, 1, 2, 3}
        return joined and covered and all(h.paused and h.paused[-1] > 0 for h in hooks)

    while not settled_and_full():
        assert time.monotonic() < deadline, (
            "the full queues never paused their partitions: joining "
            f"{[s.joining for s in shards]}, assigned {[sorted(s.assigned) for s in shards]}, "
            f"paused {[h.paused[-5:] for h in hooks]}"
        )
        time.sleep(0.1)
    assert all(shard.queued_records for shard in shards)
    assert not shards[0].assigned & shards[1].assigned
    every = {(p, o) for p in range(4) for o in range(200)}
    seen, _ = drain(shards, lambda s: s.keys() >= every)
    assert set(seen) == every and max(seen.values()) == 1


@pytest.mark.parametrize(("client", "runtime"), KINDS)
def test_commit_points_reach_the_log_end_past_transaction_markers(
    client: str,
    runtime: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    started: Callable[..., ShardLike],
    tmp_path: Path,
) -> None:
    from tests.interop.javaclients import JavaProducer, by_kind, read_manifest

    topic = make_topic(2)
    manifest = tmp_path / "m.csv"
    JavaProducer().run(
        kafka_bootstrap, topic, manifest, "records=400,codec=lz4,txn=50,abort_every=2"
    )
    committed = by_kind(read_manifest(manifest))["committed"]
    ends = end_offsets(kafka_bootstrap, topic)
    cs = settings(kafka_bootstrap, topic, client, runtime, group=group_id, partitions=(0, 1))
    shard = started(cs, 0, 1, hooks=Recorder())
    seen, reach = drain([shard], lambda s: s.keys() >= committed)
    deadline = time.monotonic() + 30
    while reach != ends:  # the last markers may come in a poll of their own
        assert time.monotonic() < deadline, f"blocks reached {reach}, the log ends at {ends}"
        block = shard.get(0.2)
        if block is not None:
            for p, nxt in block.next_offsets().items():
                reach[p] = max(nxt, reach.get(p, 0))
    assert set(seen) == committed  # read_committed: no aborted record
    shard.commit(reach)
    shard.close()
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_poll_hands_over_what_came_without_waiting_for_a_full_block(
    client: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    started: Callable[..., ShardLike],
) -> None:
    """Records that came are handed over at once, not held until ``max_poll_records`` of
    them came or ``poll_timeout_ms`` passed (confluent-kafka's ``consume(n, timeout)`` does
    that: every block of a stream slower than n records per timeout waited the timeout)."""
    topic = make_topic(1)
    cs = settings(
        kafka_bootstrap,
        topic,
        client,
        "thread",
        group=group_id,
        partitions=(0,),
        poll_timeout_ms=5_000,
        max_poll_records=1_000,
    )
    shard = started(cs, 0, 1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        for i in range(3):
            producer.send(topic, value=b"%d" % i, partition=0)
        producer.flush(30)  # the producer is connected before the clock starts
        drain([shard], lambda s: len(s) >= 3)  # the shard is up and polls an idle partition
        time.sleep(0.5)
        sent = time.monotonic()
        for i in range(3, 5):
            producer.send(topic, value=b"%d" % i, partition=0)
        producer.flush(30)
        seen, _ = drain([shard], lambda s: len(s) >= 2)
    finally:
        producer.close(timeout=30)
    waited = time.monotonic() - sent
    assert sorted(seen) == [(0, 3), (0, 4)]
    assert waited < 2.5, f"2 records took {waited:.1f}s: held until the 5 s poll timeout"


@pytest.mark.parametrize(("client", "runtime"), KINDS)
def test_an_assignment_reads_the_groups_commits_and_who_made_them(
    client: str,
    runtime: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    started: Callable[..., ShardLike],
) -> None:
    """The start rule's input (streamer.input.starts): inside the assignment, before any
    record of the partition is fetched, the owner gets the group's commits and their
    metadata; a shard's own commits say they are a worker's."""
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, 20, 2)
    cs = settings(kafka_bootstrap, topic, client, runtime, group=group_id, mode="group")
    first = started(cs, 0, 1, hooks=Recorder())
    drain([first], lambda s: len(s) >= 40)
    first.commit({0: 7, 1: 9})
    first.close()
    hooks = Recorder()
    second = started(cs, 0, 1, hooks=hooks)
    want = {(p, o) for p in range(2) for o in range({0: 7, 1: 9}[p], 20)}
    seen, _ = drain([second], lambda s: s.keys() >= want)
    assert set(seen) == want  # it started at the commits
    meta = cs.commit_metadata_text
    assert meta.startswith("streamer-worker ")
    assert hooks.group_commits == {0: GroupCommit(7, meta), 1: GroupCommit(9, meta)}
