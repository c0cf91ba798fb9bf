"""Tests for streamer.ops.cost and consumers.cpu: cost per record, CPU clocks, the GIL probe."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

from consumers.cpu import process_cpu_seconds
from streamer.ops.cost import Cost, CostMeter, gil_probe_available


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))  # pure Python: holds the GIL


def test_cost_per_record_and_ceiling() -> None:
    cost = Cost(
        records=2_000_000,
        wall_seconds=4.0,
        main_cpu_seconds=2.0,
        child_cpu_seconds=6.0,
        gil_seconds=1.0,
        child_records=1_500_000,
    )
    assert cost.main_cpu_us == pytest.approx(1.0)
    assert cost.child_cpu_us == pytest.approx(4.0)  # over the records the children paid for
    assert cost.total_cpu_us == pytest.approx(5.0)
    assert cost.gil_us == pytest.approx(0.5)
    # 16 cores: CPU allows 3.2 M/s, the GIL's serial part 2 M/s: the GIL decides.
    assert cost.ceiling(16) == pytest.approx(2_000_000)
    # 2 cores: CPU decides.
    assert cost.ceiling(2) == pytest.approx(400_000)
    d = cost.as_dict()
    assert d["gil_held_fraction"] == pytest.approx(0.25)
    assert d["total_cpu_us_per_record"] == pytest.approx(5.0)
    unmeasured = Cost(10, 1.0, 0.0, 0.0, None)
    assert unmeasured.gil_us is None and unmeasured.ceiling(16) == float("inf")
    assert unmeasured.as_dict()["gil_held_fraction"] is None


def test_meter_counts_children_by_their_clocks() -> None:
    clocks: dict[object, float | None] = {"a": 10.0, "b": 1.0, "gone": 3.0}
    meter = CostMeter(lambda: dict(clocks))
    meter.start()
    clocks.update(a=12.5, b=1.5, new=0.25, unreadable=None)
    del clocks["gone"]  # ended in between: keeps the value read at the start (adds 0)
    cost = meter.stop(1000)
    assert cost.child_cpu_seconds == pytest.approx(2.5 + 0.5 + 0.25)
    assert cost.records == 1000 and cost.main_cpu_seconds >= 0


def test_process_cpu_seconds_reads_another_process_and_none_when_gone() -> None:
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_spin, args=(0.6,))
    child.start()
    try:
        assert child.pid is not None
        first = process_cpu_seconds(child.pid)
        time.sleep(0.4)
        later = process_cpu_seconds(child.pid)
        assert first is not None and later is not None and later > first
    finally:
        child.join(10)
    assert process_cpu_seconds(child.pid) is None
    assert process_cpu_seconds(os.getpid()) is not None


@pytest.mark.skipif(
    not gil_probe_available() and not os.environ.get("REQUIRE_NATIVE_DECODER"),
    reason="the GIL probe is not built here (no C compiler, or not CPython 3.11)",
)
def test_gil_probe_tells_a_spinning_interpreter_from_a_waiting_one() -> None:
    assert gil_probe_available(), "REQUIRE_NATIVE_DECODER is set: the GIL probe must be built"
    spinning = CostMeter()
    spinning.start()
    _spin(0.3)
    held = spinning.stop(1)
    waiting = CostMeter()
    waiting.start()
    time.sleep(0.3)
    idle = waiting.stop(1)
    releasing = CostMeter()
    releasing.start()
    a = np.random.default_rng(0).random((800, 800))
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        a @ a  # BLAS with the GIL released
    blas = releasing.stop(1)
    assert held.gil_seconds is not None and idle.gil_seconds is not None
    assert blas.gil_seconds is not None
    assert held.gil_seconds / held.wall_seconds > 0.8
    assert idle.gil_seconds / idle.wall_seconds < 0.2
    assert blas.gil_seconds / blas.wall_seconds < 0.5


def test_gil_probe_counts_a_thread_that_holds_it() -> None:
    if not gil_probe_available():
        pytest.skip("the GIL probe is not built here")
    meter = CostMeter()
    meter.start()
    t = threading.Thread(target=_spin, args=(0.3,))
    t.start()
    t.join()  # the main thread waits with the GIL released; the other holds it
    cost = meter.stop(1)
    assert cost.gil_seconds is not None and cost.gil_seconds / cost.wall_seconds > 0.7
