"""Garbage-collector settings for a process that streams records into TensorFlow.

Importing TensorFlow and building a model leaves millions of long-lived Python objects, and
kafka-python allocates several objects per record it parses. With CPython's defaults a
young-generation collection runs every 700 net allocations and every older collection walks
the whole start-up heap again: profiled with ``py-spy --native --gil`` on the input pipeline,
``gc_collect_main`` held the GIL for about a third of the samples. Freezing what start-up
allocated (``gc.freeze``) takes it out of every later collection, and a larger first
threshold makes collections rarer; per-record garbage is acyclic and freed by reference
counting anyway. Measured side by side (100,000 records of 1 KiB, 4 thread shards): the
input pipeline used about 20 % less CPU per record and ran about 20 % faster.
"""

from __future__ import annotations

import gc

__all__ = ["tune_gc"]

GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100


def tune_gc() -> None:
    """Freeze the objects alive now and collect less often. Call once, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
