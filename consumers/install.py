"""Install hints: the command that adds an extra (``confluent``, ``gpu``, ``tensorboard``) to
the installation that is running, right in a source checkout and outside one.

The distribution is ``streamer-train`` on PyPI (``streamer`` there is someone else's
project); the import packages and the ``streamer`` command keep their names.

>>> DISTRIBUTION
'streamer-train'
>>> pip_install("confluent", checkout=None)
"pip install 'streamer-train[confluent]'"
>>> pip_install("confluent", checkout=Path("/src/streamer"))
"pip install -e '/src/streamer[confluent]'"
"""

from __future__ import annotations

import tomllib
from pathlib import Path

__all__ = ["DISTRIBUTION", "pip_install", "source_checkout"]

#: The name to ``pip install``.
DISTRIBUTION = "streamer-train"

_UNSET = object()


def source_checkout() -> Path | None:
    """The source checkout this package runs from (an editable install or ``PYTHONPATH``):
    the folder above it whose ``pyproject.toml`` names this distribution; None for an
    installed wheel."""
    root = Path(__file__).resolve().parents[1]
    try:
        with open(root / "pyproject.toml", "rb") as fh:
            name = tomllib.load(fh).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return root if name == DISTRIBUTION else None


def pip_install(extra: str, checkout: Path | object | None = _UNSET) -> str:
    """The command that installs ``extra`` where this package runs from."""
    root = source_checkout() if checkout is _UNSET else checkout
    if isinstance(root, Path):
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"
