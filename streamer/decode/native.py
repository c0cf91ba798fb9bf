"""The compiled fast path of ``decode_block`` (``_native.c``): C, the GIL released.

For a schema whose features are all fixed-shape numbers (bool, int8..int64, uint8..uint64,
float32, float64), a block's records are parsed in C into one buffer per feature while other
threads run (the decode map's parallel calls really run in parallel). A record is taken there
only when it is certainly good and its values are certainly the reference's; every other one
(any reject, a default, NaN or inf, a nested list, an ext type, a container among its extra
keys) goes to the pure-Python reference (``records.decode_block_python``), which decides it:
the two cannot disagree on a reject, and the differential tests
(``tests/streamer/decode/test_native.py``) hold the columns of the rest to the reference's.

``AVAILABLE`` is False where the extension was not built (no C compiler at install time: the
install goes on without it); then the reference runs alone. ``--decoder python`` (the
``decoder`` of ``PipelineSettings``, handed to shard child processes with their decode) turns
the fast path off: an escape hatch for a suspected decoder problem.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from streamer.decode.schema import Schema

__all__ = ["AVAILABLE", "NOT_AVAILABLE_WHY", "decoder_name", "native_plan", "why_python"]

try:
    from streamer.decode import _native  # type: ignore[attr-defined]
except ImportError as exc:  # not built: the reference alone
    _native = None
    NOT_AVAILABLE_WHY = f"the compiled decoder is not built ({exc})"
else:
    NOT_AVAILABLE_WHY = ""

AVAILABLE: bool = _native is not None and sys.byteorder == "little"
if _native is not None and not AVAILABLE:
    NOT_AVAILABLE_WHY = "the compiled decoder writes little-endian columns; this host is not"

#: The dtype kinds the C decoder takes (numpy's letters: bool, signed, unsigned, float).
_KINDS = "biuf"
#: The most keys a record the C decoder takes may hold (MAX_KEYS in _native.c): a schema with
#: more features than that is the reference's.
_MAX_KEYS = 64


def _enabled(decoder: str) -> bool:
    return AVAILABLE and decoder.lower() != "python"


def decoder_name(schema: Schema, decoder: str = "auto") -> str:
    """Which decoder runs ``schema``'s blocks with ``--decoder decoder``: ``native`` or
    ``python`` (the start line)."""
    return "native" if native_plan(schema, decoder) is not None else "python"


def why_python(schema: Schema, decoder: str = "auto") -> str | None:
    """Why the reference alone runs ``schema``'s blocks (None: the fast path runs them)."""
    if native_plan(schema, decoder) is not None:
        return None
    if not AVAILABLE:
        return NOT_AVAILABLE_WHY
    if not _enabled(decoder):
        return "--decoder python"
    return "the compiled decoder takes fixed-shape numeric features only"


class NativePlan:
    """What the C decoder needs of a schema, built once per schema."""

    __slots__ = ("dtypes", "limits", "names", "shapes", "spec")

    def __init__(self, schema: Schema) -> None:
        self.names = tuple(f.name for f in schema.features)
        self.dtypes = tuple(f.dtype for f in schema.features)
        self.shapes = tuple(f.shape for f in schema.features)
        self.spec = tuple(
            (f.name.encode(), f.dtype.kind, f.dtype.itemsize, f.size, len(f.shape))
            for f in schema.features
        )
        self.limits = (
            schema.max_record_bytes,
            schema.max_depth,
            schema.max_array_len,
            schema.max_map_len,
        )

    def decode(self, values: Sequence[Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``(taken, columns)``: which records the C decoder took (a bool per record) and
        each feature's column over every record (only the rows taken are meaningful)."""
        assert _native is not None
        status, buffers = _native.decode(self.spec, self.limits, values)
        n = len(status)
        taken = np.frombuffer(status, dtype=np.bool_)
        columns = {
            name: np.frombuffer(buf, dtype=dtype).reshape((n, *shape))
            for name, dtype, shape, buf in zip(
                self.names, self.dtypes, self.shapes, buffers, strict=True
            )
        }
        return taken, columns


def _supported(schema: Schema) -> bool:
    for f in schema.features:
        if f.is_string or f.is_variable or f.dtype.kind not in _KINDS:
            return False
        if f.dtype.kind == "f" and f.dtype.itemsize < 4:  # float16: the reference's
            return False
        if f.size < 1 or f.dtype.byteorder == ">":
            return False
    return 1 <= len(schema.features) <= _MAX_KEYS


@functools.lru_cache(maxsize=32)
def _plan(schema: Schema) -> NativePlan | None:
    return NativePlan(schema) if _supported(schema) else None


def native_plan(schema: Schema, decoder: str = "auto") -> NativePlan | None:
    """The C decoder's plan for ``schema``; None when it does not run it (not built,
    turned off by ``decoder`` ``python``, or a feature of a kind it does not take)."""
    return _plan(schema) if _enabled(decoder) else None
