"""Micro-benchmark of decode_block: records/s for blocks of ~1 KiB msgpack records on one core.

Run from the repository root: ``python benchmarks/bench_decode.py [--block 1000] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamer.decode import decode_block, encode_record
from streamer.schema import Feature, Schema


def _records(schema: Schema, n: int, encoding: str, rng: np.random.Generator) -> list[bytes]:
    out = []
    for i in range(n):
        x = rng.standard_normal(250).astype(np.float32)
        if encoding == "bin":
            out.append(encode_record(schema, {"x": x, "y": float(i)}))
        elif encoding == "list":
            out.append(msgpack.packb({"x": x.tolist(), "y": float(i)}))
        else:  # msgpack-numpy layout, written by hand so msgpack-numpy is not needed
            envelope = {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [250]}
            envelope[b"data"] = x.tobytes()
            out.append(msgpack.packb({"x": envelope, "y": float(i)}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--block", type=int, default=1000, help="records per block")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per encoding")
    parser.add_argument("--encodings", default="bin,numpy,list", help="comma-separated")
    args = parser.parse_args()

    schema = Schema((Feature("x", "float32", (250,)), Feature("y", "float32")), label="y")
    rng = np.random.default_rng(0)
    for encoding in args.encodings.split(","):
        values = _records(schema, args.block, encoding, rng)
        size = sum(map(len, values)) / len(values)
        decode_block(schema, values)  # warm up (plan cache, allocator)
        blocks = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < args.seconds:
            block = decode_block(schema, values)
            blocks += 1
        assert len(block) == args.block
        rate = blocks * args.block / elapsed
        print(
            f"{encoding:>5}: {rate:12,.0f} records/s  ({args.block} records of {size:,.0f} B "
            f"per block, {blocks} blocks, {elapsed * 1e3 / blocks:.2f} ms/block)"
        )


if __name__ == "__main__":
    main()
