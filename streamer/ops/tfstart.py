"""Loading TensorFlow without its start-up noise, and never without its real GPU problems.

TensorFlow 2.21 writes its first native log lines (oneDNN, "Could not find cuda drivers", the
``cuInit`` failure of a CPU-only machine) through absl before it reads ``TF_CPP_MIN_LOG_LEVEL``,
so that variable cannot quiet them. ``quiet_start()`` filters the process's stderr at the file
descriptor while TensorFlow loads and looks for devices, and drops only lines known to say
nothing: always the absl banner, oneDNN's and the CPU-instructions notice; the CUDA lines only
when the machine has no NVIDIA device at all (no driver, no ``/dev/nvidia*``). On a machine with
a GPU every CUDA line stays: a broken driver must be seen. Everything else passes unchanged, in
order. The worker's start line says which devices it trains on.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence

__all__ = [
    "NOISE",
    "NO_GPU_NOISE",
    "filter_stderr",
    "load_tensorflow",
    "nvidia_present",
    "quiet_start",
]

#: Lines that never say anything a user can act on.
NOISE: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
        r"STDERR",
        r"\] oneDNN custom operations are on\.",
        r"\] This TensorFlow binary is optimized to use available CPU instructions",
        r"^To enable the following instructions: .* rebuild TensorFlow",
    )
)

#: CUDA lines that only say "no GPU here": dropped only where there is no NVIDIA device.
NO_GPU_NOISE: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine",
        r"\] failed call to cuInit: ",
        r"\] Unable to register cu(DNN|FFT|BLAS) factory",
    )
)


def nvidia_present() -> bool:
    """True when the machine has an NVIDIA driver or device node (a GPU may be usable)."""
    return os.path.exists("/proc/driver/nvidia") or bool(glob.glob("/dev/nvidia*"))


@contextlib.contextmanager
def filter_stderr(drop: Sequence[re.Pattern[str]]) -> Iterator[list[str]]:
    """Within the block, lines written to file descriptor 2 that match ``drop`` are dropped.

    Native code writes there directly, so ``sys.stderr`` cannot filter it. The others are
    written on, in order. Yields the list of dropped lines (for tests).

    >>> with filter_stderr([re.compile("noise")]) as dropped:
    ...     _ = os.write(2, b"noise\\nsignal\\n")
    >>> dropped
    ['noise']
    """
    dropped: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no usable descriptor 2: nothing to filter
        yield dropped
        return

    def pump() -> None:
        with os.fdopen(read_end, "rb") as source:
            for line in source:
                text = line.decode("utf-8", errors="replace").rstrip("\n")
                if any(p.search(text) for p in drop):
                    dropped.append(text)
                    continue
                os.write(saved, line)

    thread = threading.Thread(target=pump, name="streamer-stderr-filter", daemon=True)
    os.dup2(write_end, 2)
    os.close(write_end)
    thread.start()
    try:
        yield dropped
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the pump reads to its end
        thread.join(10)
        os.close(saved)


def quiet_start() -> contextlib.AbstractContextManager[list[str]]:
    """Filter TensorFlow's start-up noise (see the module docstring) within the block."""
    drop = NOISE if nvidia_present() else NOISE + NO_GPU_NOISE
    return filter_stderr(drop)


def load_tensorflow(*, devices: bool = True) -> None:
    """Import TensorFlow and find its devices (where the noise is printed), quietly.

    ``devices=False`` only imports it: a multi-worker strategy must configure TensorFlow's
    runtime before anything initialises it (finding devices does), so there the strategy's
    creation finds them, inside ``quiet_start()`` of its own.
    """
    with quiet_start():
        import tensorflow as tf

        if devices:
            tf.config.list_logical_devices()
