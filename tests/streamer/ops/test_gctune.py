"""streamer.ops.gctune: the collector frozen after start-up and run less often; malloc_trim
looked up once and skipped where the C library has none (test_memory measures the real trim)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import weakref
from collections.abc import Iterator

import pytest

from streamer.ops import gctune


@pytest.fixture
def restore_gc() -> Iterator[None]:
    """tune_gc changes the interpreter's collector: put it back for the tests after."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.mark.usefixtures("restore_gc")
def test_tune_gc_freezes_what_is_alive_and_raises_the_thresholds() -> None:
    survivor = [_Node()]  # alive at "start-up": frozen, out of every later collection
    gc.collect()
    assert any(o is survivor for o in gc.get_objects())
    gctune.tune_gc()
    assert gc.get_threshold() == (
        gctune.GEN0_THRESHOLD,
        gctune.GEN1_THRESHOLD,
        gctune.GEN2_THRESHOLD,
    )
    assert gctune.GEN0_THRESHOLD > 700  # rarer than CPython's default young collections
    assert gc.get_freeze_count() > 0
    assert not any(o is survivor for o in gc.get_objects())  # in the permanent generation


@pytest.mark.usefixtures("restore_gc")
def test_tune_gc_collects_garbage_before_freezing() -> None:
    """Cycles already unreachable are freed first, not frozen forever (a freeze first would
    keep them for the life of the process)."""
    node = _Node()
    ref = weakref.ref(node)
    del node
    assert ref() is not None  # a cycle: reference counting alone does not free it
    gctune.tune_gc()
    assert ref() is None


@pytest.fixture
def fresh_libc(monkeypatch: pytest.MonkeyPatch) -> None:
    """release_free_memory looks the C library up again (restored after the test)."""
    monkeypatch.setattr(gctune, "_libc", None)


class _Trim:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(pad)
        return 1


@pytest.mark.usefixtures("fresh_libc")
def test_release_free_memory_trims_with_no_padding_and_looks_libc_up_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lookups: list[str] = []
    lib = _Trim()
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: lookups.append(name) or "libc")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    assert gctune.release_free_memory() is True
    assert gctune.release_free_memory() is True
    assert lib.calls == [0, 0]  # malloc_trim(0): keep no extra padding at the heap top
    assert lookups == ["c"]  # the library is found once, then remembered


@pytest.mark.usefixtures("fresh_libc")
@pytest.mark.parametrize("where", ["no library", "load fails", "no malloc_trim"])
def test_release_free_memory_is_false_without_malloc_trim_and_remembers_it(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """musl or macOS: nothing to trim; False every time, and no new look-up each call."""
    lookups: list[str] = []

    def find(name: str) -> str | None:
        lookups.append(name)
        return None if where == "no library" else "libc.so.6"

    def load(name: str) -> object:
        if where == "load fails":
            raise OSError("cannot open shared object file")
        return object()  # a C library without malloc_trim

    monkeypatch.setattr(ctypes.util, "find_library", find)
    monkeypatch.setattr(ctypes, "CDLL", load)
    assert gctune.release_free_memory() is False
    assert gctune.release_free_memory() is False
    assert lookups == ["c"]
