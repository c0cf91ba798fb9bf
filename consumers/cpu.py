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
    # /proc/<pid>/stat: utime + stime of every thread, exited ones included, in clock ticks
    # (/proc/<pid>/schedstat is finer but counts the main thread alone).
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
