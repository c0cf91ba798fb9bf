"""docs/api.md is the Python API's reference as its docstrings and options say today."""

from pathlib import Path

import streamer
from streamer.apidoc import reference


def test_the_api_reference_is_current() -> None:
    page = Path(__file__).resolve().parents[1] / "docs" / "api.md"
    assert page.read_text(encoding="utf-8") == reference(), (
        "docs/api.md is stale: regenerate it with python -m streamer.apidoc > docs/api.md"
    )


def test_the_reference_covers_every_public_name_and_setting() -> None:
    from streamer.config.options import OPTIONS

    text = reference()
    for name in streamer.__all__:
        if not name.startswith("__"):
            assert f"## `streamer.{name}`" in text
    for opt in OPTIONS:
        assert f"`{opt.name}`" in text
    for method in ("dataset", "callback", "batches", "trained", "from_config", "close"):
        assert f"`Stream.{method}`" in text
