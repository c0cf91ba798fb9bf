"""Micro-benchmark of decode_block: records/s for blocks of ~1 KiB msgpack records on one core.

Run from the repository root: ``python benchmarks/decode.py [--block 1000] [--seconds 3]``.
``--schema benchmarks/mixed.toml`` instead decodes random records of that schema against
fixed-shape simulator records of the same mean size, alternating, ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamer.decode.records import decode_block, encode_record
from streamer.decode.schema import Feature, Schema
from streamer.input.simulator import RandomRecords, SimulatorTask


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


def _rate(schema: Schema, values: list[bytes], seconds: float) -> float:
    decode_block(schema, values)  # warm up (plan cache, allocator)
    blocks = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        block = decode_block(schema, values)
        blocks += 1
    assert len(block) == len(values), block.reason_counts()
    return blocks * len(values) / elapsed


def compare_schema(path: str, block: int, seconds: float, rounds: int) -> None:
    """Random records of the schema at ``path`` against fixed-shape records of their size."""
    schema = Schema.from_file(path)
    rng = np.random.default_rng(0)
    values = RandomRecords(schema).records(block, rng)
    size = round(sum(map(len, values)) / len(values))
    fixed_task = SimulatorTask()
    fixed = fixed_task.records(block, rng, size)
    fixed_size = sum(map(len, fixed)) / len(fixed)
    ratios = []
    for r in range(rounds):
        pair = [("fixed", fixed_task.schema(), fixed), (path, schema, values)]
        rates = {name: _rate(s, v, seconds) for name, s, v in (pair if r % 2 == 0 else pair[::-1])}
        ratios.append(rates[path] / rates["fixed"])
        print(
            f"round {r + 1}: fixed {rates['fixed']:12,.0f} records/s ({fixed_size:,.0f} B), "
            f"{path} {rates[path]:12,.0f} records/s ({size:,} B): ratio {ratios[-1]:.2f}"
        )
    print(f"median ratio {sorted(ratios)[len(ratios) // 2]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--block", type=int, default=1000, help="records per block")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per encoding")
    parser.add_argument("--encodings", default="bin,numpy,list", help="comma-separated")
    parser.add_argument("--schema", default=None, help="compare this schema with fixed shapes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the comparison")
    args = parser.parse_args()
    if args.schema is not None:
        compare_schema(args.schema, args.block, args.seconds, args.rounds)
        return

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
