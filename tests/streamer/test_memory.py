"""release_free_memory gives freed heap back to the OS (glibc), which a pass's end relies on."""

from __future__ import annotations

import platform
import sys

import pytest

from streamer.bench import rss_mib
from streamer.ops.gctune import release_free_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's",
)
def test_freed_heap_fragmented_by_survivors_goes_back_to_the_os() -> None:
    blobs = [bytes(1000) + bytes([i % 256]) for i in range(150_000)]  # ~150 MiB of small chunks
    survivors = blobs[::100]  # one in a hundred stays alive: the heap cannot shrink from the top
    del blobs
    before = rss_mib()
    assert release_free_memory() is True
    after = rss_mib()
    assert len(survivors) == 1_500
    assert before - after > 50, (before, after)
