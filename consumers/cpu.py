"""CPU time of a process, read from the kernel's clock (a shard child's, for cost accounting)."""

from __future__ import annotations

import os

__all__ = ["process_cpu_seconds"]


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time of process ``pid`` (user + system, all its threads), or None where it cannot
    be read (gone, or no ``/proc``).

    >>> process_cpu_seconds(os.getpid()) > 0
    True
    """
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9  # nanoseconds on the CPU
    except (OSError, ValueError, IndexError):
        pass
    try:  # no schedstat (a kernel without CONFIG_SCHEDSTATS): clock ticks
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
