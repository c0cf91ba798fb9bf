"""Cost per record: CPU of this process and of its shard processes, the GIL held in this one.

Records/s on a 2-core machine says little about a 16-core GPU host; what one record costs does.
The main interpreter's GIL is the serial part (it caps a worker at 1 / (GIL µs per record)
whatever the core count); CPU of every process of the input path is the parallel part.

>>> meter = CostMeter(children=lambda: {})  # doctest: +SKIP
>>> meter.start(); ...; cost = meter.stop(records=100_000)  # doctest: +SKIP
>>> cost.gil_us, cost.ceiling(16)  # doctest: +SKIP
(0.41, 2439024.4)

CPU clocks: this process's from ``time.process_time`` (every thread of it, TensorFlow's and
librdkafka's included), each child's from the kernel (``/proc/<pid>/stat``, every thread, in
clock ticks) while it runs and from its own clock when it ends. The GIL
from ``streamer.ops._gilprobe`` (a C thread sampling CPython's "GIL locked" flag about every
100 µs); where that is not built or not supported, ``gil_us`` is None.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from consumers.cpu import process_cpu_seconds

__all__ = [
    "Cost",
    "CostMeter",
    "ceiling",
    "gil_probe_available",
    "process_cpu_seconds",
    "warm_up",
]

try:
    from streamer.ops import _gilprobe  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install time)
    _gilprobe = None


def gil_probe_available() -> bool:
    return _gilprobe is not None and bool(_gilprobe.AVAILABLE)


def ceiling(total_cpu_us: float | None, gil_us: float | None, cores: int) -> float:
    """Records/s one worker could reach on ``cores`` cores with these costs per record: the
    lower of cores / CPU µs (all its processes) and 1 / GIL µs (the serial part); inf when
    neither is known.

    >>> ceiling(5.0, 0.5, 16), ceiling(5.0, None, 2)
    (2000000.0, 400000.0)
    """
    limits = [cores * 1e6 / total_cpu_us] if total_cpu_us else []
    if gil_us:
        limits.append(1e6 / gil_us)
    return min(limits) if limits else math.inf


@dataclass(frozen=True, slots=True)
class Cost:
    """What ``records`` cost over ``wall_seconds``: CPU seconds of this process and of its
    children, and seconds with this process's GIL held (None: not measured).

    ``child_records``: the records the children's CPU paid for in the window, where it differs
    (shard processes read ahead: what they had handed over before the window began was paid
    before it); by default ``records``."""

    records: int
    wall_seconds: float
    main_cpu_seconds: float
    child_cpu_seconds: float
    gil_seconds: float | None
    child_records: int | None = None

    def _us(self, seconds: float) -> float:
        return seconds * 1e6 / max(self.records, 1)

    @property
    def main_cpu_us(self) -> float:
        return self._us(self.main_cpu_seconds)

    @property
    def child_cpu_us(self) -> float:
        n = self.records if self.child_records is None else self.child_records
        return self.child_cpu_seconds * 1e6 / max(n, 1)

    @property
    def total_cpu_us(self) -> float:
        return self.main_cpu_us + self.child_cpu_us

    @property
    def gil_us(self) -> float | None:
        return None if self.gil_seconds is None else self._us(self.gil_seconds)

    def ceiling(self, cores: int) -> float:
        """Records/s one worker could reach on ``cores`` cores: the GIL's serial share caps it
        at 1 / gil_us whatever the cores (Amdahl), the CPU of all its processes at
        cores / total_cpu_us.

        >>> Cost(1_000_000, 1.0, 1.5, 2.5, 0.25).ceiling(16)
        4000000.0
        >>> Cost(1_000_000, 1.0, 1.5, 2.5, 0.25).ceiling(2)
        500000.0
        """
        return ceiling(self.total_cpu_us, self.gil_us, cores)

    def as_dict(self) -> dict[str, float | None]:
        return {
            "records": self.records,
            "wall_seconds": self.wall_seconds,
            "records_per_second": self.records / max(self.wall_seconds, 1e-9),
            "main_cpu_us_per_record": self.main_cpu_us,
            "child_cpu_us_per_record": self.child_cpu_us,
            "total_cpu_us_per_record": self.total_cpu_us,
            "gil_us_per_record": self.gil_us,
            "gil_held_fraction": (
                None
                if self.gil_seconds is None
                else self.gil_seconds / max(self.wall_seconds, 1e-9)
            ),
        }


_probe_lock = threading.Lock()
_probe_users = 0  # meters measuring now: the sampler runs while there is one


def _probe_start(interval_us: int) -> None:
    global _probe_users
    with _probe_lock:
        if _probe_users == 0:
            assert _gilprobe is not None
            _gilprobe.start(interval_us)
        _probe_users += 1


def _probe_stop() -> None:
    global _probe_users
    with _probe_lock:
        _probe_users -= 1
        if _probe_users == 0 and _gilprobe is not None:
            _gilprobe.stop()


def warm_up() -> None:
    """Measure a short window once: the first window of a process costs it about 50 ms of CPU
    more (seen here, whatever the window's length; the next ones do not), which a
    benchmark's first mode must not pay."""
    meter = CostMeter()
    meter.start()
    time.sleep(0.1)
    meter.stop(1)


class CostMeter:
    """Measures a window: ``start()``, the work, ``stop(records)``.

    ``children``: the CPU seconds so far of each child process that counts, by any key (asked
    at start and at stop; a child missing at stop keeps the value read at start, a child new
    at stop counts whole).
    """

    def __init__(
        self,
        children: Callable[[], Mapping[object, float | None]] = dict,
        *,
        clock: Callable[[], float] = time.perf_counter,
        interval_us: int = 100,
    ) -> None:
        self._children_cpu = children
        self._clock = clock
        self._interval_us = interval_us
        self._t0 = 0.0
        self._cpu0 = 0.0
        self._children0: dict[object, float] = {}
        self._gil0: tuple[int, int, int] | None = None

    def _children(self) -> dict[object, float]:
        return {k: v for k, v in self._children_cpu().items() if v is not None}

    def start(self) -> None:
        if gil_probe_available():
            assert _gilprobe is not None
            _probe_start(self._interval_us)  # one sampler per process, while a meter runs
            self._gil0 = _gilprobe.read()
        self._children0 = self._children()
        self._cpu0 = time.process_time()
        self._t0 = self._clock()

    def stop(self, records: int, child_records: int | None = None) -> Cost:
        wall = self._clock() - self._t0
        cpu = time.process_time() - self._cpu0
        gil: float | None = None
        if self._gil0 is not None and _gilprobe is not None:
            held, samples, probe_ns = _gilprobe.read()
            _probe_stop()
            h, s = held - self._gil0[0], samples - self._gil0[1]
            gil = wall * h / s if s else None
            # The sampler is a thread of this process: its own CPU is not the work's.
            cpu = max(cpu - (probe_ns - self._gil0[2]) / 1e9, 0.0)
            self._gil0 = None
        now = self._children()
        child = sum(now.get(k, c0) - c0 for k, c0 in self._children0.items())
        child += sum(c for k, c in now.items() if k not in self._children0)
        return Cost(records, wall, cpu, max(child, 0.0), gil, child_records)
