"""A shard child's blocks into its parent through shared memory: a bounded ring of slots.

A process shard's child (consumers/process.py) decodes its blocks where it polled them; what
reaches the parent are columns (numpy arrays) and a few values (rejects). Sending them down a
pipe copies every byte twice under the parent's GIL (the pipe's read into a bytes object, then
pickle's rebuild of each array). Here the child writes a block's arrays into a slot of a
shared mapping and sends only a small descriptor; the parent rebuilds the block around numpy
views of the slot (pickle protocol 5's out-of-band buffers), so its arrays reach tf.data
without a copy. A design learnt from getsentry/arroyo's multiprocessing step, which moves
batches through shared-memory blocks.

- **The mapping** is a ``memfd`` (``os.memfd_create``), handed to the spawned child as an
  inherited descriptor: it has no name, so nothing is ever left in ``/dev/shm`` (not even after
  ``kill -9`` of either side: the kernel frees it with its last mapping), and it is not bound by
  a container's small ``/dev/shm`` (64 MiB by default in Docker and Kubernetes). Pages are
  committed only when written; a slot is a reservation of address space.
- **A slot is reused only when nothing needs it**: the parent frees it when the last array
  viewing it is gone (a ``weakref.finalize`` on the slot's base array), wherever that happens
  (the decode map, tf.data's conversion, ``rebatch``, a dropped block), and tells the child on
  a pipe of 4-byte slot numbers.
- **Bounded, and never stuck**: the child waits for a free slot (its own queue then fills, its
  poller holds, then pauses: the backpressure of DESIGN.md), and the parent copies a block out
  of its slot (freeing it at once) rather than hold the last two slots, so tf.data holding
  blocks while it waits for more can never starve the child of slots.
- A block larger than a slot travels on the pipe whole, in the same layout.

Wire format of a descriptor (one message on the data pipe)::

    kind (1 byte: R = in a slot, B = in this message) | slot (u32) | count (u32) |
    count x buffer length (u64) | pickled header (protocol 5, the arrays out of band)
    [B only: the buffers, each at a 64-byte aligned offset]
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import select
import struct
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from consumers.block import RecordBlock

__all__ = ["RingReader", "RingSpec", "RingWriter", "pack_block", "unpack_block"]

#: Arrays start at this alignment in a slot (TensorFlow aliases an aligned numpy buffer).
ALIGN: Final = 64
_HEAD: Final = struct.Struct("<cII")
_SLOT: Final = struct.Struct("<I")
#: Default slot size: a 1,000-record block of 1 KiB records decodes to about 1 MiB.
DEFAULT_SLOT_BYTES: Final = 8 << 20


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# ---- a block as a header and buffers ------------------------------------------------------------


def pack_block(block: RecordBlock) -> tuple[bytes, list[memoryview]]:
    """A block as a pickled header plus its arrays' raw buffers (out of band).

    A prepared block (decoded in the child) keeps only the values its owner needs (rejects);
    they travel as one byte buffer and their lengths, not one object per record.
    """
    prepared = block.prepared
    rows = None if prepared is None else prepared.needs_values
    values = block.values if rows is None else [block.values[i] for i in rows]
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    blob = np.frombuffer(b"".join(values), dtype=np.uint8)
    head = (
        block.partitions(),  # for the parent's revocation check, without a pass over rows
        block.topic,
        len(block.values),
        block.partition,
        block.offset,
        block.timestamp_ms,
        lengths,
        blob,
        rows,
        block.nbytes,
        block.serial,
        block.ends,
        prepared,
    )
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(head, protocol=5, buffer_callback=buffers.append)
    return header, [b.raw() for b in buffers]


def _offsets(lengths: Sequence[int]) -> list[int]:
    out, at = [], 0
    for n in lengths:
        out.append(at)
        at += _aligned(n)
    return out


def unpack_block(
    header: bytes | memoryview, region: npt.NDArray[np.uint8], lengths: Sequence[int]
) -> tuple[RecordBlock, list[int]]:
    """Rebuild a block whose buffers lie in ``region`` (a uint8 array) at aligned offsets: its
    arrays are views of ``region`` (so ``region`` lives as long as any of them does). Returns
    the block and its partitions (``RecordBlock.partitions``, as the child found them)."""
    buffers = [region[a : a + n] for a, n in zip(_offsets(lengths), lengths, strict=True)]
    head = pickle.loads(header, buffers=buffers)  # noqa: S301 - our own child's bytes
    (parts, topic, n, partition, offset, ts, value_lengths, blob, rows) = head[:9]
    nbytes, serial, ends, prepared = head[9:]
    if rows is not None and not rows:  # a prepared block without rejects: no value came
        block = RecordBlock(topic, [b""] * n, partition, offset, ts, nbytes, serial, ends, prepared)
        return block, parts
    stops = np.cumsum(value_lengths).tolist()
    starts = [0, *stops[:-1]] if stops else []
    # Copied out of the slot: a reject's value may outlive the block (dead letters, the log).
    sent = [blob[a:b].tobytes() for a, b in zip(starts, stops, strict=True)]
    if rows is None:
        values = sent
    else:  # a prepared block: only the rows the owner needs came
        values = [b""] * n
        for i, value in zip(rows, sent, strict=True):
            values[i] = value
    return RecordBlock(topic, values, partition, offset, ts, nbytes, serial, ends, prepared), parts


def _descriptor(kind: bytes, slot: int, header: bytes, buffers: list[memoryview]) -> bytes:
    lengths = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    return _HEAD.pack(kind, slot, len(buffers)) + lengths + header


def _concat(buffers: list[memoryview]) -> bytes:
    parts: list[bytes | memoryview] = []
    for b in buffers:
        parts.append(b)
        pad = _aligned(b.nbytes) - b.nbytes
        if pad:
            parts.append(b"\0" * pad)
    return b"".join(parts)


def _parse(message: bytes) -> tuple[bytes, int, list[int], memoryview, int]:
    """(kind, slot, buffer lengths, header, where the inline buffers start)."""
    kind, slot, count = _HEAD.unpack_from(message)
    at = _HEAD.size
    lengths = list(struct.unpack_from(f"<{count}Q", message, at))
    at += 8 * count
    view = memoryview(message)
    if kind == b"R":
        return kind, slot, lengths, view[at:], len(message)
    # An inline message: the header runs up to the aligned buffers at its end.
    size = sum(_aligned(n) for n in lengths)
    return kind, slot, lengths, view[at : len(message) - size], len(message) - size


# ---- the ring ---------------------------------------------------------------------------------


class _Slot(np.ndarray):
    """A slot's bytes while a block uses them. numpy collapses a view's chain of plain ndarray
    bases to the first one that owns its memory, but stops at a subclass: every array rebuilt
    over this one keeps it alive, so its finalizer runs when the last of them is gone."""


class RingSpec:
    """What the child needs to attach to a ring; pickled into the spawned child, its two
    descriptors (the mapping, the free-slot pipe's read end) are inherited as themselves."""

    def __init__(self, memfd: int, free_fd: int, slots: int, slot_bytes: int) -> None:
        self.memfd, self.free_fd, self.slots, self.slot_bytes = memfd, free_fd, slots, slot_bytes

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd

        return (
            _rebuild_spec,
            (DupFd(self.memfd), DupFd(self.free_fd), self.slots, self.slot_bytes),
        )


def _rebuild_spec(memfd: Any, free_fd: Any, slots: int, slot_bytes: int) -> RingSpec:
    return RingSpec(memfd.detach(), free_fd.detach(), slots, slot_bytes)


class RingWriter:
    """The child's side: writes blocks into free slots and says which in a descriptor."""

    def __init__(self, spec: RingSpec) -> None:
        self.slot_bytes = spec.slot_bytes
        self._mm = mmap.mmap(spec.memfd, spec.slots * spec.slot_bytes)
        os.close(spec.memfd)
        self._free_fd = spec.free_fd
        self._free = list(range(spec.slots - 1, -1, -1))  # LIFO: a hot slot is reused first
        self._partial = b""
        self.inline = 0  # blocks too large for a slot (sent whole on the pipe)

    def message(self, block: RecordBlock, wait: Callable[[], bool]) -> bytes | None:
        """The pipe message for ``block``: its descriptor once its buffers are in a slot, or
        the whole block for one larger than a slot. Waits for a free slot while ``wait()``
        (called every 0.1 s) says so; None when it stopped waiting."""
        header, buffers = pack_block(block)
        size = sum(_aligned(b.nbytes) for b in buffers)
        if size > self.slot_bytes:
            self.inline += 1
            return _descriptor(b"B", 0, header, buffers) + _concat(buffers)
        while not self._free:
            if not self._collect(0.1) and not wait():
                return None
        slot = self._free.pop()
        at = slot * self.slot_bytes
        for b in buffers:
            self._mm[at : at + b.nbytes] = b
            at += _aligned(b.nbytes)
        return _descriptor(b"R", slot, header, buffers)

    def _collect(self, timeout: float) -> bool:
        """Take the slots the parent freed (waiting up to ``timeout`` for one); True if any."""
        ready, _, _ = select.select([self._free_fd], [], [], timeout)
        if not ready:
            return False
        data = self._partial + os.read(self._free_fd, 4096)
        if not data[len(self._partial) :]:
            raise EOFError("the parent closed the ring")
        whole = len(data) // _SLOT.size * _SLOT.size
        self._free.extend(s for (s,) in _SLOT.iter_unpack(data[:whole]))
        self._partial = data[whole:]
        return bool(self._free)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._free_fd)
        with contextlib.suppress(BufferError):
            self._mm.close()


class RingReader:
    """The parent's side: creates the ring, rebuilds blocks from descriptors, frees slots."""

    def __init__(
        self, slots: int, slot_bytes: int = DEFAULT_SLOT_BYTES, name: str = "shard"
    ) -> None:
        if slots < 3:
            raise ValueError(f"a ring needs at least 3 slots, got {slots}")
        self.slots, self.slot_bytes = slots, slot_bytes
        memfd = os.memfd_create(f"streamer-{name}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(memfd, slots * slot_bytes)
            self._mm: mmap.mmap | None = mmap.mmap(memfd, slots * slot_bytes)
            free_r, self._free_w = os.pipe()
        except BaseException:
            os.close(memfd)
            raise
        self.spec = RingSpec(memfd, free_r, slots, slot_bytes)
        self._spec_open = True
        self._lock = threading.RLock()  # a finalizer may run inside any locked section
        self._held = 0  # slots the parent's views still use
        self._closed = False
        #: Blocks copied out of their slot to keep two slots free, and blocks sent inline.
        self.copies = 0
        self.inline = 0

    def after_start(self) -> None:
        """The child has its copies of the descriptors: drop the parent's (once: a number
        closed twice may by then be someone else's)."""
        with self._lock:
            if not self._spec_open:
                return
            self._spec_open = False
        for fd in (self.spec.memfd, self.spec.free_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def block(self, message: bytes) -> tuple[RecordBlock, list[int]]:
        """The block a message from the child describes, and its partitions."""
        kind, slot, lengths, header, at = _parse(message)
        if kind == b"B":
            self.inline += 1
            # Writable arrays, as a slot's are (the message itself is immutable bytes).
            region = np.frombuffer(bytearray(memoryview(message)[at:]), dtype=np.uint8)
            return unpack_block(header, region, lengths)
        mm = self._mm
        if mm is None:
            raise EOFError("the ring is closed")
        used = sum(_aligned(n) for n in lengths)
        region = np.frombuffer(mm, np.uint8, count=used, offset=slot * self.slot_bytes).view(_Slot)
        with self._lock:
            self._held += 1
            keep = self._held <= self.slots - 2
        if not keep:
            # Copied out and freed at once: two slots stay the child's, whatever tf.data holds.
            unpacked = unpack_block(header, region.copy(), lengths)
            del region
            self.copies += 1
            self._free(slot)
            return unpacked
        weakref.finalize(region, self._free, slot)
        return unpack_block(header, region, lengths)

    def _free(self, slot: int) -> None:
        with self._lock:
            self._held -= 1
            if self._closed:
                return
            with contextlib.suppress(OSError):  # a child that is gone reads no more
                os.write(self._free_w, _SLOT.pack(slot))

    def close(self) -> None:
        """Stop telling the child; the mapping stays until the last view of it is gone."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):
                os.close(self._free_w)
        self.after_start()
        self._mm = None  # views keep the mapping alive; the kernel frees it after the last
