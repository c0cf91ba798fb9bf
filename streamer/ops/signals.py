"""SignalWatch: SIGTERM/SIGINT acted on at once, even while the main thread is inside TensorFlow."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from streamer.stopping import StopReason

__all__ = ["GRACE_S", "SignalWatch", "StopOnSignal"]


#: A second SIGTERM/SIGINT within this many seconds of the first is the same stop: a
#: terminal's Ctrl-C reaches every process of the group, and ``streamer launch`` forwards it
#: too, so one key press arrives two or three times within milliseconds.
GRACE_S = 2.0


class StopOnSignal:
    """The worker's answer to SIGTERM/SIGINT: the first asks for a clean stop (``plan`` says
    what happens next) and arms a watchdog that exits if ``finished`` is not set within
    ``timeout`` seconds; a duplicate within ``grace`` seconds is the same stop; a signal after
    that exits at once (exit 128 + the signal's number).

    >>> stops, done = [], threading.Event()
    >>> done.set()                      # the stop finished: the watchdog has nothing to do
    >>> answer = StopOnSignal(plan="p", stop=stops.append, finished=done,
    ...                       timeout=30, log=logging.getLogger("x"))
    >>> answer(signal.SIGINT); answer(signal.SIGINT)        # one Ctrl-C, seen twice
    >>> [str(s) for s in stops], stops[0].kind
    (['signal SIGINT'], <StopKind.SIGNAL: 'signal'>)
    """

    def __init__(
        self,
        *,
        plan: str,
        stop: Callable[[StopReason], None],
        finished: threading.Event,
        timeout: float,
        log: logging.Logger,
        grace: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.stop = stop
        self.finished = finished
        self.timeout = timeout
        self.log = log
        self.grace = grace
        self.clock = clock
        self.first_at: float | None = None

    def quiet_until(self) -> float | None:
        """The end of the first signal's grace window (``clock()`` time), None if none came."""
        return None if self.first_at is None else self.first_at + self.grace

    def __call__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        now = self.clock()
        if self.first_at is not None:
            if now - self.first_at <= self.grace:
                self.log.info("%s again: already stopping (the same stop)", name)
                return
            self.log.error("%s again after %.0fs: exiting at once", name, now - self.first_at)
            os._exit(128 + signum)
        self.first_at = now
        # The bound said is the real one: the watchdog below ends the process at it.
        self.log.info(
            "%s: %s, within %.0fs (--shutdown-timeout; the same signal again after %.0fs "
            "exits at once)",
            name,
            self.plan,
            self.timeout,
            self.grace,
        )
        self.stop(StopReason.signal(name))
        timeout, finished, log = self.timeout, self.finished, self.log

        def watchdog() -> None:
            if finished.wait(timeout):
                return  # stopped cleanly in time: never kill a process that embeds run()
            log.error(
                "clean shutdown did not finish within --shutdown-timeout %.0fs; exiting (the "
                "threads' stacks follow on stderr)",
                timeout,
            )
            # Where it was stuck, for the bug report: a stop that hangs is never expected.
            faulthandler.dump_traceback(all_threads=True)
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

    def close(self, quiet_until: float | None = None) -> None:
        """Give the signals back. Until ``quiet_until`` (``time.monotonic()``), the tail of a
        stop's grace window, a SIGTERM/SIGINT is still the same stop and is ignored: a
        terminal's Ctrl-C reaches the process two or three times, and the last copy may land
        after the run has finished (it killed the process with SIGINT, exit -2, seen in CI)."""
        signal.set_wakeup_fd(self._old_fd)
        for s, h in self._old_handlers.items():
            if quiet_until is not None and time.monotonic() < quiet_until:
                signal.signal(s, _QuietThen(s, h, quiet_until))
            else:
                signal.signal(s, h)
        self._write.close()  # the reader sees end of file
        self._thread.join(1.0)
        self._read.close()


_Handler = Callable[[int, FrameType | None], Any] | int | None


class _QuietThen:
    """A Python-level handler that ignores its signal until ``until``, then gives the signal
    back to the handler it replaced and delivers it again."""

    def __init__(self, signum: int, old: _Handler, until: float) -> None:
        self.signum, self.old, self.until = signum, old, until

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if time.monotonic() < self.until:
            return
        still_mine = signal.getsignal(self.signum) is self
        if still_mine:
            old = signal.SIG_DFL if self.old is None else self.old  # None: set outside Python
            signal.signal(self.signum, old)
        signal.raise_signal(self.signum)


def _ignore_here(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: _SignalWatch's thread has acted on the signal already."""
