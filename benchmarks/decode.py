"""Micro-benchmark of decode_block: records/s for blocks of ~1 KiB msgpack records on one core.

Run from the repository root: ``python benchmarks/decode.py [--block 1000] [--seconds 3]``.
``--schema benchmarks/mixed.toml`` instead decodes random records of that schema against
fixed-shape simulator records of the same mean size, alternating, ``--rounds`` times.
``--candidates`` compares decoders on the simulator's 1 KiB records (issue 25): ours
(validated: every reject reason), msgpack's ``unpackb`` per record plus building the columns
(no validation: a ceiling), and msgspec's typed decoder (``msgspec.msgpack.Decoder`` of a
``Struct``: types validated in C, shapes and finiteness not; needs ``pip install msgspec``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamer.decode.native import decoder_name
from streamer.decode.records import decode_block, decode_block_python, encode_record
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


def compare_candidates(block: int, seconds: float, rounds: int) -> dict[str, list[float]]:
    """Decode-only records/s of each candidate on one block of simulator records, alternating
    the order every round; every candidate's columns are checked against ours first."""
    import msgspec

    task = SimulatorTask()
    schema = task.schema()
    values = task.records(block, np.random.default_rng(0), 1024)
    width = task.num_features

    def ours() -> tuple[np.ndarray, np.ndarray]:
        out = decode_block(schema, values)  # the compiled fast path where it is built
        return out.features["x"], out.features["y"]

    def python_reference() -> tuple[np.ndarray, np.ndarray]:
        out = decode_block_python(schema, values)
        return out.features["x"], out.features["y"]

    def msgpack_unpackb() -> tuple[np.ndarray, np.ndarray]:
        unpack = msgpack.unpackb
        xs, ys = [], []
        for v in values:
            r = unpack(v)
            xs.append(r["x"])
            ys.append(r["y"])
        return np.frombuffer(b"".join(xs), "<f4").reshape(-1, width), np.array(ys, np.float32)

    class Sample(msgspec.Struct):
        x: bytes
        y: float

    decoder = msgspec.msgpack.Decoder(Sample)

    def msgspec_struct() -> tuple[np.ndarray, np.ndarray]:
        decode = decoder.decode
        xs, ys = [], []
        for v in values:
            r = decode(v)
            xs.append(r.x)
            ys.append(r.y)
        return np.frombuffer(b"".join(xs), "<f4").reshape(-1, width), np.array(ys, np.float32)

    candidates = {
        "ours": ours,
        "python-reference": python_reference,
        "msgpack-unpackb": msgpack_unpackb,
        "msgspec-struct": msgspec_struct,
    }
    ref_x, ref_y = ours()
    for name, fn in candidates.items():
        x, y = fn()
        assert np.array_equal(x, ref_x) and np.array_equal(y, ref_y), name
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = candidates[name]
            count = 0
            start = time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                fn()
                count += 1
            rates[name].append(count * block / elapsed)
    size = sum(map(len, values)) / len(values)
    print(
        f"{block} records of {size:,.0f} B per block, {rounds} rounds of {seconds:g}s each; "
        f"ours: decoder {decoder_name(schema)}"
    )
    print(f"{'decoder':<18} {'median rec/s':>14} {'min':>12} {'max':>12} {'x ours':>8}")
    base = statistics.median(rates["ours"])
    for name, got in rates.items():
        med = statistics.median(got)
        print(f"{name:<18} {med:>14,.0f} {min(got):>12,.0f} {max(got):>12,.0f} {med / base:>8.2f}")
    return rates


def compare_threads(block: int, seconds: float, rounds: int, threads: int) -> None:
    """decode_block's records/s on 1..``threads`` threads at once (as the decode map's parallel
    calls run), for the compiled fast path and the Python reference, alternating: the fast
    path releases the GIL, so its rate should grow with the threads (up to the cores)."""
    import concurrent.futures

    task = SimulatorTask()
    schema = task.schema()
    values = task.records(block, np.random.default_rng(0), 1024)
    decoders = {"ours": decode_block, "python-reference": decode_block_python}
    rates: dict[tuple[str, int], list[float]] = {}
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for r in range(rounds):
            for name in list(decoders)[r % 2 :] + list(decoders)[: r % 2]:
                decode = decoders[name]
                for k in range(1, threads + 1):

                    def work(decode: object = decode) -> int:
                        n = 0
                        end = time.perf_counter() + seconds
                        while time.perf_counter() < end:
                            decode(schema, values)  # type: ignore[operator]
                            n += 1
                        return n

                    start = time.perf_counter()
                    done = sum(f.result() for f in [pool.submit(work) for _ in range(k)])
                    rates.setdefault((name, k), []).append(
                        done * block / (time.perf_counter() - start)
                    )
    print(
        f"{block} records per block, {rounds} rounds of {seconds:g}s; ours: {decoder_name(schema)}"
    )
    print(f"{'decoder':<18} {'threads':>7} {'median rec/s':>14} {'x 1 thread':>10}")
    for name in decoders:
        one = statistics.median(rates[name, 1])
        for k in range(1, threads + 1):
            med = statistics.median(rates[name, k])
            print(f"{name:<18} {k:>7} {med:>14,.0f} {med / one:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--block", type=int, default=1000, help="records per block")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per encoding")
    parser.add_argument("--encodings", default="bin,numpy,list", help="comma-separated")
    parser.add_argument("--schema", default=None, help="compare this schema with fixed shapes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the comparison")
    parser.add_argument(
        "--candidates", action="store_true", help="compare candidate decoders (needs msgspec)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="decode on 1..N threads at once, ours and the Python reference (GIL release)",
    )
    args = parser.parse_args()
    if args.threads:
        compare_threads(args.block, args.seconds, args.rounds, args.threads)
        return
    if args.candidates:
        compare_candidates(args.block, args.seconds, args.rounds)
        return
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
