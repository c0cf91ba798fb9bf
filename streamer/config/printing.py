"""print_config: the effective settings and where each came from (``--print-config``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamer.config.options import OPTIONS
from streamer.config.settings import WorkerConfig

__all__ = ["print_config"]


def print_config(config: WorkerConfig, sources: Mapping[str, str], out: Any) -> None:
    """The effective settings, one per line: name, value and where it came from; secrets are
    shown as *** (only whether they are set)."""
    names = [o.name for o in OPTIONS] + ["sasl_password", "ssl_password"]
    width = max(map(len, names))
    for name in names:
        value = getattr(config, name)
        if name in ("sasl_password", "ssl_password"):
            shown = "(unset)" if value is None else "***"
        elif value is None:
            shown = "(unset)"
        elif isinstance(value, tuple):
            shown = ",".join(map(str, value))
        else:
            shown = str(value)
        print(f"{name:<{width}}  {shown:<24}  {sources.get(name, 'default')}", file=out)
