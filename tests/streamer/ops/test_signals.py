"""SignalWatch and StopOnSignal: one stop however many copies of a signal arrive."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

from streamer.ops.signals import SignalWatch, StopOnSignal


def _wait_for(cond: object, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_copy_of_the_signal_after_the_run_within_the_grace_window_is_ignored() -> None:
    """Ctrl-C reaches the process two or three times; the last copy may land after the run
    finished and gave the handlers back: it is the same stop, not a KeyboardInterrupt."""
    seen: list[int] = []
    # Python's own Ctrl-C handler, also where the suite was started with SIGINT ignored (a
    # background job of a script: ``cmd &`` ignores SIGINT, and Python keeps that).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = signal.getsignal(signal.SIGINT)
    watch = SignalWatch(seen.append, (signal.SIGINT,))
    signal.raise_signal(signal.SIGINT)
    _wait_for(lambda: seen == [signal.SIGINT])
    watch.close(quiet_until=time.monotonic() + 0.5)
    signal.raise_signal(signal.SIGINT)  # a late copy: ignored
    time.sleep(0.6)
    # After the window the old handler is back and the signal reaches it.
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_without_a_signal_close_gives_the_handlers_back_at_once() -> None:
    before = signal.getsignal(signal.SIGINT)
    watch = SignalWatch(lambda _s: None, (signal.SIGINT,))
    assert signal.getsignal(signal.SIGINT) is not before
    watch.close(quiet_until=None)
    assert signal.getsignal(signal.SIGINT) is before


def test_quiet_until_is_the_first_signal_plus_the_grace() -> None:
    now = [100.0]
    answer = StopOnSignal(
        plan="p",
        stop=lambda _r: None,
        finished=threading.Event(),
        timeout=30,
        log=logging.getLogger("test"),
        grace=2.0,
        clock=lambda: now[0],
    )
    assert answer.quiet_until() is None
    answer.finished.set()
    answer(signal.SIGTERM)
    assert answer.quiet_until() == 102.0


def test_after_the_run_a_late_copy_of_the_signal_never_kills_the_exiting_process() -> None:
    """The CLI's exit path: once the worker is done, SIGINT/SIGTERM are ignored, through the
    interpreter's finalization too (which resets Python-level handlers to the default)."""
    import subprocess
    import sys

    code = (
        "import os, signal\n"
        "from streamer.cli.base import exit_guard\n"
        "exit_guard(0, 30)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('still here')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0 and "still here" in out.stdout, (out.returncode, out.stderr)
