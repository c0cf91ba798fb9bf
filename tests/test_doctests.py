"""The docstring examples of every module run (those marked ``+SKIP`` need Kafka or a model)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import consumers
import streamer

MODULES = sorted(
    info.name
    for package in (consumers, streamer)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not info.name.endswith(".__main__")  # importing it runs the command
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
