"""SignalWatch: SIGTERM/SIGINT acted on at once, even while the main thread is inside TensorFlow."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["SignalWatch", "stop_on_signal"]


def stop_on_signal(
    signum: int,
    count: int,
    *,
    plan: str,
    stop: Callable[[str], None],
    finished: threading.Event,
    timeout: float,
    log: logging.Logger,
) -> None:
    """The worker's answer to its ``count``-th SIGTERM/SIGINT: the first asks for a clean stop
    (``plan`` says what happens next) and arms a watchdog that exits if ``finished`` is not
    set within ``timeout`` seconds; a second exits at once."""
    name = signal.Signals(signum).name
    if count > 1:
        log.error("second %s: exiting at once", name)
        os._exit(128 + signum)
    log.info("%s: %s", name, plan)
    stop(f"signal {name}")

    def watchdog() -> None:
        if finished.wait(timeout):
            return  # stopped cleanly in time: never kill a process that embeds run()
        log.error("clean shutdown did not finish within --shutdown-timeout %.0fs; exiting", timeout)
        os._exit(1)

    threading.Thread(target=watchdog, name="streamer-shutdown-watchdog", daemon=True).start()


class SignalWatch:
    """Acts on SIGTERM/SIGINT at once, even while the main thread is blocked inside TensorFlow.

    Python runs a signal handler only when the main thread is back in the interpreter; a
    trainer waiting in ``next(iterator)`` for input may not be for as long as --idle-timeout.
    The C-level handler writes each signal's number to a wakeup socket, and a thread here
    calls ``on_signal`` with it; the Python-level handler does nothing.
    """

    def __init__(self, on_signal: Callable[[int], None], signals: tuple[int, ...]) -> None:
        self._on_signal = on_signal
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._old_handlers = {s: signal.signal(s, _ignore_here) for s in signals}
        self._old_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._loop, name="streamer-signals", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                data = self._read.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                self._on_signal(signum)

    def rearm(self) -> None:
        """Take the signals back from a library that installed its own C-level handlers since
        (TensorFlow's coordination service, started by MultiWorkerMirroredStrategy, installs
        one for SIGTERM and tells nobody in Python)."""
        for s in self._old_handlers:
            signal.signal(s, _ignore_here)
        signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)

    def close(self) -> None:
        signal.set_wakeup_fd(self._old_fd)
        for s, h in self._old_handlers.items():
            signal.signal(s, h)
        self._write.close()  # the reader sees end of file
        self._thread.join(1.0)
        self._read.close()


def _ignore_here(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: _SignalWatch's thread has acted on the signal already."""
