"""The shared-memory ring between a process shard's child and its parent (consumers/ring.py):
zero-copy views, a slot reused only when nothing views it, bounded and never stuck, blocks
larger than a slot inline; and against the real broker, a child killed by kill -9."""

from __future__ import annotations

import dataclasses
import gc
import mmap
import os
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from kafka import KafkaProducer

from consumers.block import RecordBlock
from consumers.errors import ShardFailedError
from consumers.process import ProcessShard
from consumers.ring import RingReader, RingSpec, RingWriter
from consumers.settings import ConsumerSettings


@dataclasses.dataclass
class _Columns:
    """A stand-in for the owner's decode (a DecodedBlock): columns, and the rows it rejects."""

    columns: dict[str, np.ndarray]
    needs_values: list[int]

    def select(self, keep: np.ndarray) -> _Columns:
        return _Columns({k: v[keep] for k, v in self.columns.items()}, [])


def _block(rows: int, width: int = 16, start: int = 0) -> RecordBlock:
    block = RecordBlock.from_columns(
        "t",
        [b"v%d" % i for i in range(rows)],
        np.zeros(rows, np.int32),
        np.arange(start, start + rows),
        np.full(rows, 1000),
    )
    x = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + start
    names = np.array([f"n{i}" for i in range(rows)], dtype=object)  # in band (objects)
    return dataclasses.replace(block, prepared=_Columns({"x": x, "name": names}, needs_values=[0]))


@pytest.fixture
def ring() -> Iterator[tuple[RingReader, RingWriter]]:
    """Both sides of a 3-slot ring of 64 KiB slots, in this process (the writer gets its own
    copies of the descriptors, as a spawned child does)."""
    reader = RingReader(3, 64 << 10)
    spec = reader.spec
    writer = RingWriter(RingSpec(os.dup(spec.memfd), os.dup(spec.free_fd), 3, 64 << 10))
    reader.after_start()
    yield reader, writer
    writer.close()
    reader.close()


def _mapped(array: np.ndarray) -> bool:
    """The array's memory is the ring's mapping (its chain of bases ends at an mmap)."""
    base: object = array
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return isinstance(base, mmap.mmap)


def _never() -> bool:
    return False


def test_a_block_comes_back_whole_as_views_of_its_slot(ring: tuple[RingReader, RingWriter]) -> None:
    reader, writer = ring
    sent = _block(100)
    message = writer.message(sent, _never)
    assert message is not None and len(message) < 1500  # a descriptor, not 6 KiB of columns
    back, partitions = reader.block(message)
    assert partitions == sent.partitions() == [0]
    np.testing.assert_array_equal(back.prepared.columns["x"], sent.prepared.columns["x"])
    assert back.prepared.columns["name"].tolist() == sent.prepared.columns["name"].tolist()
    assert back.offset.tolist() == sent.offset.tolist() and back.partition.dtype == np.int32
    assert back.values[0] == b"v0" and back.values[1:] == [b""] * 99  # only what is needed
    for array in (back.prepared.columns["x"], back.offset, back.timestamp_ms):
        assert _mapped(array)
        assert array.flags.writeable and array.ctypes.data % 64 == 0
    assert reader.held == 1 and reader.copies == 0


def test_a_slot_is_free_again_only_when_its_last_view_is_gone(
    ring: tuple[RingReader, RingWriter],
) -> None:
    reader, writer = ring
    first = reader.block(writer.message(_block(10), _never) or b"")[0]
    column = first.prepared.columns["x"]  # what tf.data may still hold after the block is gone
    del first
    gc.collect()
    assert reader.held == 1  # the column still views the slot
    del column
    gc.collect()
    assert reader.held == 0
    # The child takes the freed slot back: three blocks fit again (the ring has three slots).
    blocks = []
    for i in range(3):
        message = writer.message(_block(10, start=100 * i), _never)
        assert message is not None, f"no slot for block {i}"
        blocks.append(reader.block(message)[0])
    assert [b.offset[0] for b in blocks] == [0, 100, 200]


def test_the_writer_waits_for_a_slot_and_the_reader_keeps_two_free(
    ring: tuple[RingReader, RingWriter],
) -> None:
    reader, writer = ring
    messages = [writer.message(_block(10, start=10 * i), _never) for i in range(3)]
    assert all(m is not None for m in messages)
    asked: list[float] = []

    def wait() -> bool:
        asked.append(time.monotonic())
        return len(asked) < 3

    assert writer.message(_block(10), wait) is None  # all three slots used: waited, gave up
    assert len(asked) == 3
    # The reader keeps the first block zero-copy and copies the others out of their slots
    # (freeing them at once): whatever the owner holds, the child always has slots.
    held = [reader.block(m)[0] for m in messages if m is not None]
    assert reader.held == 1 and reader.copies == 2
    assert _mapped(held[0].offset) and not _mapped(held[1].offset)
    assert [b.offset.tolist() for b in held] == [list(range(10 * i, 10 * i + 10)) for i in range(3)]
    assert writer.message(_block(10), _never) is not None  # a freed slot came back


def test_a_block_larger_than_a_slot_travels_inline(ring: tuple[RingReader, RingWriter]) -> None:
    reader, writer = ring
    big = _block(2000)  # 128 KB of columns, two slots' worth
    message = writer.message(big, _never)
    assert message is not None and len(message) > 64 << 10
    back = reader.block(message)[0]
    np.testing.assert_array_equal(back.prepared.columns["x"], big.prepared.columns["x"])
    assert back.prepared.columns["x"].flags.writeable and not _mapped(back.offset)
    assert reader.inline == writer.inline == 1 and reader.held == 0


# ---- a real child --------------------------------------------------------------------------------


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.kafka
@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_child_killed_by_kill_9_fails_the_shard_and_leaves_no_shared_memory(
    client: str, kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    for i in range(5000):
        producer.send(topic, b"%d" % i, partition=0)
    producer.close()
    before = set(os.listdir("/dev/shm"))
    settings = ConsumerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        mode="static",
        partitions=(0,),
        shard_runtime="process",
        client=client,  # type: ignore[arg-type]
        max_poll_records=500,
    )
    shard = ProcessShard(settings, 0, 1, restore={0: 0}).start()
    try:
        first = None
        deadline = time.monotonic() + 60
        while first is None or not len(first):
            assert time.monotonic() < deadline, "no block came"
            first = shard.get(1.0)
        assert _mapped(first.offset)  # the block is a view of the ring
        pid = shard.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ShardFailedError) as failed:
            while True:
                shard.get(1.0)
        assert "killed by SIGKILL" in str(failed.value.__cause__)
        # The parent's views stay readable after the child is gone: the mapping is its own.
        assert first.offset[0] == 0 and first.offset.tolist() == list(range(len(first)))
    finally:
        shard.close()
    _wait(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the child to be reaped")
    assert set(os.listdir("/dev/shm")) - before == set()  # memfd: nothing named, nothing left
