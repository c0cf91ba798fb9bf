"""The compiled parts, both optional: where they cannot be built (no C compiler), the install
goes on without them.

- streamer.decode._native: the fast path of decode_block (C, the GIL released while it
  parses); without it decode_block runs the pure-Python reference alone
  (``streamer.decode.native.AVAILABLE`` says which; the worker's start line too).
- streamer.ops._gilprobe: samples whether the GIL is held, for ``streamer bench``'s cost
  columns (GIL-held microseconds per record); without it those columns read n/a.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamer.decode._native",
            ["streamer/decode/_native.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        ),
        Extension(
            "streamer.ops._gilprobe",
            ["streamer/ops/_gilprobe.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        ),
    ]
)
