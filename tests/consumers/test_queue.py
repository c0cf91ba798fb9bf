"""BlockQueue: bounded, claimed under the revocation lock, dropped by partition on revoke."""

from __future__ import annotations

import threading
import time

from consumers.block import RecordBlock
from consumers.queue import BlockQueue


def block(partition: int, first: int, n: int = 3) -> RecordBlock:
    return RecordBlock.from_columns(
        "t", [b"v"] * n, [partition] * n, list(range(first, first + n)), [0] * n
    )


def test_fifo_bounded_and_counted() -> None:
    q = BlockQueue(2)
    assert not q.full and q.get(0.0) is None
    q.put(block(0, 0))
    q.put(block(1, 10))
    assert q.full and len(q) == 2 and q.queued_records == 6
    first = q.get(0.0)
    assert first is not None and first.offset.tolist() == [0, 1, 2]
    assert not q.full and q.queued_records == 3


def test_drop_removes_revoked_partitions_and_reports_where_to_rewind() -> None:
    q = BlockQueue(8)
    mixed = RecordBlock.from_columns("t", [b"a", b"b", b"c"], [0, 1, 0], [7, 3, 8], [0, 0, 0])
    q.put(block(1, 20))
    q.put(mixed)
    assert q.drop({1}) == {1: 3}
    left = q.get(0.0)
    assert left is not None and left.offset.tolist() == [7, 8] and q.get(0.0) is None


def test_get_waits_and_stops_when_ended() -> None:
    q = BlockQueue(2)
    ended = threading.Event()
    threading.Timer(0.05, lambda: q.put(block(0, 0))).start()
    assert q.get(5.0) is not None
    threading.Timer(0.05, lambda: (ended.set(), q.wake())).start()
    t0 = time.monotonic()
    assert q.get(5.0, ended=ended.is_set) is None
    assert time.monotonic() - t0 < 2.0


def _race(delay: float) -> None:
    q = BlockQueue(1000)
    blocks = [block(i % 2, i * 3) for i in range(200)]
    for b in blocks:
        q.put(b)
    claimed: list[RecordBlock] = []

    def take() -> None:
        while q.get(0.01, lambda b: claimed.append(b) or b) is not None:
            pass

    taker = threading.Thread(target=take)
    taker.start()
    time.sleep(delay)
    with q.lock:  # what a revocation does: drop and ask the owner for its point, atomically
        lows = q.drop({0, 1})
        at_revoke = len(claimed)
    taker.join()
    assert len(claimed) == at_revoke  # nothing claimed after the revocation
    assert claimed == blocks[: len(claimed)]  # a FIFO prefix was claimed ...
    rest = blocks[len(claimed) :]  # ... and exactly the rest dropped, with where to rewind
    want: dict[int, int] = {}
    for b in rest:
        want.setdefault(int(b.partition[0]), int(b.offset[0]))
    assert lows == want
    assert q.get(0.0) is None


def test_every_block_is_either_claimed_or_dropped_never_both() -> None:
    for delay in (0.0, 0.0005, 0.001, 0.002, 0.005):
        _race(delay)
