"""A long broker outage under a running worker (issue 32): early (before any checkpoint but the
run's start) and in a steady stream of checkpoints, on each Kafka client.

Not a pytest test (CI has the shorter outages of ``test_faults.py``): a documented command for
a quiet machine, from the repository root::

    python -m tests.reliability.outage --seconds 60

For each case it starts a private broker (``deploy/local/kafka.sh``, its own state folder), a
producer thread at ``--rate`` records/s all along, and one worker (``--stop-after-idle 25``,
``--checkpoint-dir``, an audit log); once the worker trained a while, the broker is SIGKILLed,
stays down ``--seconds``, and is started again on the same ports and data. The producer goes
on for 20 s more, then stops; the worker must stop by itself on idle with exit 0. Prints per
case: the outage, whether the worker lived through it, its exit code, the records in the
topic, lost, trained twice, ERROR lines and rollbacks. Exits 1 on any loss, any record trained
twice or a non-zero exit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.reliability.brokers import PrivateBroker
from tests.reliability.relutil import error_lines, start_worker
from tests.workerutil import (
    RateProducer,
    all_records,
    end_offsets,
    read_audit,
    summarize,
    worker_args,
)


def case(client: str, when: str, outage: float, rate: float) -> bool:
    """One outage; True when nothing was lost, nothing trained twice, and the exit was 0."""
    from streamer.input.simulator import produce

    work = Path(tempfile.mkdtemp(prefix=f"streamer-outage-{client}-{when}-"))
    (work / "broker").mkdir()
    broker = PrivateBroker(work / "broker")
    bootstrap = broker.start()
    try:
        topic = f"outage-{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, 0, partitions=4)  # creates it
        audit = work / "audit.csv"
        extra = [
            *("--kafka-client", client, "--session-timeout-ms", "10000"),
            *("--commit-every-seconds", "1", "--checkpoint-every-steps", "1000000"),
            *("--checkpoint-every-seconds", "1" if when == "steady" else "3600"),
        ]
        args = worker_args(
            bootstrap,
            topic,
            f"g-{topic}",
            audit,
            shards=2,
            batch_size=64,
            stop_after_idle=25,
            checkpoint_dir=work / "ckpt",
            extra=extra,
        )
        producer = RateProducer(bootstrap, topic, rate=rate, seed=7)
        producer.start()
        worker = start_worker(args, work / "worker.log")
        # "early": the run's start is its only checkpoint; "steady": 20 s of checkpoints.
        trained = 1500 if when == "early" else int(20 * rate)
        worker.wait_for(lambda: worker.samples_trained() >= trained, 300, "training")
        broker.kill()
        down = time.monotonic()
        time.sleep(outage)
        alive = worker.alive()
        broker.start()
        back = time.monotonic()
        time.sleep(20)
        sent = producer.stop()
        code = worker.wait(300)
        ends = end_offsets(bootstrap, topic)
        counts = read_audit(audit, topic)
        missing = sorted(all_records(ends) - counts.keys())
        twice = sum(n - 1 for n in counts.values() if n > 1)
        log = worker.log()
        print(
            f"{client}, {when}: broker down {back - down:.0f}s, worker alive through it "
            f"{alive}, exit {code}; {sum(ends.values())} records in the topic ({sent} sent), "
            f"lost {len(missing)} {summarize(missing) if missing else ''}, trained twice "
            f"{twice}, ERROR lines {len(error_lines(log))}, rollbacks "
            f"{log.count('went back to checkpoint')}; logs in {work}",
            flush=True,
        )
        return alive and code == 0 and not missing and twice == 0
    finally:
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    if "PYTEST_CURRENT_TEST" in os.environ:
        raise RuntimeError("tests/reliability/outage.py is a command, not a pytest test")
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.outage",
        description="A broker outage under a running worker: lost, trained twice, exit code.",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the broker is down")
    parser.add_argument("--rate", type=float, default=1000.0, help="records produced per second")
    parser.add_argument(
        "--clients", default="kafka-python,confluent", help="comma-separated Kafka clients"
    )
    args = parser.parse_args(argv)
    ok = True
    for client in args.clients.split(","):
        for when in ("early", "steady"):
            ok = case(client, when, args.seconds, args.rate) and ok
    print(f"\noutage {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
