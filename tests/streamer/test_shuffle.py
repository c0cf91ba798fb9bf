"""The shuffle window: pure unit tests, and one pass over the real broker with a window."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.settings import ConsumerSettings
from streamer.settings import PipelineSettings
from streamer.shuffle import ShuffleWindow
from streamer.simulator import SimulatorTask, produce
from streamer.source import StreamSource


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.lists(st.integers(0, 40), max_size=30), st.integers(0, 2**32 - 1))
def test_every_row_comes_out_once_and_the_window_stays_bounded(
    capacity: int, sizes: list[int], seed: int
) -> None:
    w = ShuffleWindow(capacity, seed=seed)
    seen: list[int] = []
    start = 0
    for n in sizes:
        ids = np.arange(start, start + n)
        start += n
        out = w.push([ids, ids * 10])
        assert (out[1] == out[0] * 10).all()  # columns stay aligned
        seen.extend(out[0].tolist())
        assert len(w) <= capacity
    seen.extend(w.flush(like=[np.arange(0), np.arange(0)])[0].tolist())
    assert sorted(seen) == list(range(start))
    assert len(w) == 0


def test_window_mixes_across_blocks() -> None:
    w = ShuffleWindow(1000, seed=1)
    out = []
    for b in range(10):
        out.extend(w.push([np.full(200, b)])[0].tolist())
    out.extend(w.flush()[0].tolist())
    first_batch = out[:200]
    assert len(set(first_batch)) > 3  # a batch holds rows from several blocks


@pytest.mark.kafka
def test_one_pass_with_a_window_trains_every_record_once(
    kafka_bootstrap: str, make_topic: Callable[..., str], group_id: str
) -> None:
    topic = make_topic(4)
    produce(kafka_bootstrap, topic, 4000, partitions=4)
    cs = ConsumerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group_id,
        num_shards=2,
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
        max_poll_records=250,
    )
    settings_ = PipelineSettings(
        num_shards=2, batch_size=128, idle_timeout_seconds=3, shuffle_buffer=1000, linger=True
    )
    source = StreamSource(SimulatorTask().schema(), settings_, consumer=cs)
    parts: list[np.ndarray] = []
    offs: list[np.ndarray] = []
    for batch in source.dataset():
        p, o = batch["partition"].numpy(), batch["offset"].numpy()
        source.tracker.ack(p, o)
        parts.append(p)
        offs.append(o)
    partition, offset = np.concatenate(parts), np.concatenate(offs)
    pairs = list(zip(partition.tolist(), offset.tolist(), strict=True))
    assert len(pairs) == 4000 and len(set(pairs)) == 4000
    # Mixed: within a partition, arrival order is not the offset order.
    p0 = offset[partition == 0]
    assert (np.diff(p0) < 0).any()
    points = source.tracker.commit_points()
    source.commit(points)
    source.end_pass()
    ends = {p: int(offset[partition == p].max()) + 1 for p in range(4)}
    assert points == ends
