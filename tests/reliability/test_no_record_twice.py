"""No record trained twice across the routine life of a deployment (issue 32).

Independent replicas, each with its own ``--checkpoint-dir``, run as real processes on the
shared broker while a producer writes a steady stream; judged from the outside by their audit
logs (every trained record), their exit codes and the group's committed offsets:

- the deploy sequence, with a pause in it: worker a alone; b joins (scale out); b is paused
  (SIGSTOP to it and its shard processes, as a frozen pod) past its session, so a takes its
  partitions from the group's commit, then b goes on (it goes back to its checkpoint: what it
  trained since is a's now); a is restarted (rolling deploy: its checkpoint still holds the
  partitions b took, behind b's commits); b stops (scale in); a trains the rest and stops on
  idle. Every record trained exactly once, nothing lost.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.workerutil import (
    RateProducer,
    WorkerProcess,
    all_records,
    committed_offsets,
    end_offsets,
    missing_and_extra,
    read_audit,
    summarize,
    worker_args,
)

pytestmark = pytest.mark.kafka

START_S = 120  # TensorFlow import + group join on a loaded 2-core machine
PARTITIONS = 4
SESSION_MS = 6000
IDLE_S = 8


def _tails(*workers: WorkerProcess | None) -> str:
    return "\n".join(
        f"--- {w.argv[w.argv.index('--worker-id') + 1]} ---\n{w.tail(3000)}"
        for w in workers
        if w is not None
    )


@pytest.mark.timeout(480)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_deploy_sequence_with_a_pause_trains_every_record_exactly_once(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    group_id: str,
    tmp_path: Path,
    client: str,
) -> None:
    topic = make_topic(PARTITIONS)
    audit = {"a": tmp_path / "audit-a.csv", "b": tmp_path / "audit-b.csv"}

    def args(name: str) -> list[str]:
        return worker_args(
            kafka_bootstrap,
            topic,
            group_id,
            audit[name],
            shards=2,
            batch_size=128,
            stop_after_idle=IDLE_S,
            checkpoint_dir=tmp_path / f"ckpt-{name}",
            worker_id=name,
            extra=[
                "--kafka-client",
                client,
                "--session-timeout-ms",
                str(SESSION_MS),
                "--max-poll-records",
                "200",
                "--checkpoint-every-seconds",
                "2",
                "--shutdown-timeout",
                "25",
            ],
        )

    producer = RateProducer(kafka_bootstrap, topic, rate=2000, seed=32)
    producer.start()
    a = b = a2 = None
    try:
        a = WorkerProcess.start(args("a"), tmp_path / "worker-a.log")
        a.wait_for(lambda: a.samples_trained() >= 3000, START_S, "worker a training")
        b = WorkerProcess.start(args("b"), tmp_path / "worker-b.log", new_group=True)  # scale out
        b.wait_for(lambda: b.samples_trained() >= 3000, START_S, "worker b training")
        # A paused pod: b and its shard processes stop past the session; a takes every
        # partition from the group's commit, behind what b trained.
        b.signal_group(signal.SIGSTOP)
        time.sleep(SESSION_MS / 1000 + 4)
        b.signal_group(signal.SIGCONT)
        b.wait_for(lambda: "went back to checkpoint" in b.log(), 60, "b going back")
        trained_b = b.samples_trained()
        b.wait_for(lambda: b.samples_trained() >= trained_b + 2000, 60, "b training again")
        t0 = time.monotonic()
        a.terminate()  # a rolling deploy restarts a (b, another member, runs on)
        assert a.wait(40) == 0, _tails(a, b)
        stops = [time.monotonic() - t0]
        trained_b = b.samples_trained()
        b.wait_for(lambda: b.samples_trained() >= trained_b + 2000, 60, "b training alone")
        a2 = WorkerProcess.start(args("a"), tmp_path / "worker-a2.log")
        a2.wait_for(lambda: a2.samples_trained() >= 2000, START_S, "worker a training again")
        t0 = time.monotonic()
        b.terminate()  # scale in (a, another member, runs on)
        assert b.wait(40) == 0, _tails(a, b, a2)
        stops.append(time.monotonic() - t0)
        trained = a2.samples_trained()
        a2.wait_for(lambda: a2.samples_trained() >= trained + 3000, 60, "a training alone")
    finally:
        sent = producer.stop()
        for w in (a, b, a2):
            if w is not None and w.alive() and w is not a2:
                w.kill()
    assert a2 is not None and b is not None and a is not None
    rc = a2.wait(START_S)
    logs = _tails(a, b, a2)
    assert rc == 0, logs

    ends = end_offsets(kafka_bootstrap, topic)
    assert sum(ends.values()) == sent
    counts = {name: read_audit(path, topic) for name, path in audit.items()}
    union = counts["a"] + counts["b"]
    missing, extra = missing_and_extra(union, all_records(ends))
    assert not missing, f"records never trained: {summarize(missing)}\n{logs}"
    assert not extra, f"audited records never produced: {summarize(extra)}\n{logs}"
    twice = sorted(r for r, n in union.items() if n > 1)
    within = {name: sum(n - 1 for n in c.values() if n > 1) for name, c in counts.items()}
    across = len(counts["a"].keys() & counts["b"].keys())
    print(
        f"deploy sequence ({client}): {sent} records; trained twice {len(twice)} "
        f"(within a {within['a']}, within b {within['b']}, by both {across}); SIGTERM to "
        f"exit 0 in {stops[0]:.1f}s and {stops[1]:.1f}s"
    )
    assert not twice, f"{len(twice)} records trained twice: {summarize(twice)}\n{logs}"
    assert committed_offsets(kafka_bootstrap, group_id, topic) == ends, logs
