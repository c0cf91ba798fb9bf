"""The generated documentation pages (options, metrics, the Python API) are current."""

from __future__ import annotations

from streamer.config.options import OPTIONS
from streamer.docgen import PAGES, ROOT, main, options_page


def test_every_generated_page_is_current() -> None:
    stale = [rel for rel, make in PAGES.items() if (ROOT / rel).read_text("utf-8") != make()]
    assert not stale, f"stale: {stale}: regenerate with python -m streamer.docgen"
    assert main(["--check"]) == 0


def test_the_options_page_names_every_option_three_ways() -> None:
    page = options_page()
    for opt in OPTIONS:
        for name in (opt.flag, opt.env, opt.name):
            assert f"`{name}`" in page, name
