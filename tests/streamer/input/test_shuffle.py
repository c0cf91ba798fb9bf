"""The shuffle window: pure unit tests, and one pass over the real broker with a window."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.settings import ConsumerSettings
from streamer.decode.ragged import RaggedColumn, concat_rows, mask_rows, num_rows, take_rows
from streamer.input.pipeline import PipelineSettings
from streamer.input.shuffle import ShuffleWindow
from streamer.input.simulator import SimulatorTask, produce
from streamer.input.source import StreamSource


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


def _ragged_ids(ids: np.ndarray) -> RaggedColumn:
    """Row ``i`` holds ``i % 4`` copies of ``[i, -i]`` (rows of inner shape (2,)), some empty."""
    lengths = (ids % 4).astype(np.int64)
    values = np.repeat(np.stack([ids, -ids], axis=1), lengths, axis=0)
    return RaggedColumn(values, lengths)


def _rows(col: RaggedColumn) -> list[list[list[int]]]:
    splits = np.cumsum(col.row_lengths)[:-1]
    return [part.tolist() for part in np.split(col.values, splits)] if len(col.row_lengths) else []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=20), st.integers(0, 2**32 - 1))
def test_ragged_rows_are_taken_and_joined_whole(sizes: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = np.arange(sum(sizes))
    col = _ragged_ids(ids)
    pick = rng.permutation(len(ids))[: len(ids) // 2]
    taken = take_rows(col, pick)
    assert isinstance(taken, RaggedColumn)
    assert _rows(taken) == [_rows(col)[i] for i in pick.tolist()]
    mask = rng.random(len(ids)) < 0.5
    kept = mask_rows(col, mask)
    assert isinstance(kept, RaggedColumn)
    assert _rows(kept) == [row for row, m in zip(_rows(col), mask.tolist(), strict=True) if m]
    joined = concat_rows(taken, col)
    assert num_rows(joined) == len(pick) + len(ids)
    assert _rows(joined) == _rows(taken) + _rows(col)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.lists(st.integers(0, 40), max_size=30), st.integers(0, 2**32 - 1))
def test_window_moves_ragged_and_string_rows_with_their_offsets(
    capacity: int, sizes: list[int], seed: int
) -> None:
    w = ShuffleWindow(capacity, seed=seed)
    seen: dict[int, tuple[Any, Any]] = {}
    start = 0

    def collect(out: list[Any]) -> None:
        ragged, names, offsets = out
        assert num_rows(ragged) == len(names) == len(offsets)
        for row, name, off in zip(_rows(ragged), names.tolist(), offsets.tolist(), strict=True):
            assert off not in seen
            seen[off] = (row, name)

    for n in sizes:
        ids = np.arange(start, start + n)
        start += n
        names = np.array([f"r{i}" for i in ids], dtype=object)
        collect(w.push([_ragged_ids(ids), names, ids]))
        assert len(w) <= capacity
    like = [_ragged_ids(np.arange(0)), np.array([], dtype=object), np.arange(0)]
    collect(w.flush(like=like))
    assert sorted(seen) == list(range(start))
    for off, (row, name) in seen.items():  # every row still beside its own offset
        assert row == [[off, -off]] * (off % 4) and name == f"r{off}"


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
