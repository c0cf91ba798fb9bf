"""The one compiled part: streamer.decode._native, the fast path of decode_block (C, the
GIL released while it parses). Optional: where it cannot be built (no C compiler), the
install goes on and decode_block runs the pure-Python reference alone
(``streamer.decode.native.AVAILABLE`` says which; the worker's start line too)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamer.decode._native",
            ["streamer/decode/_native.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        )
    ]
)
