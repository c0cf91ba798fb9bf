"""The documentation's generated pages, from the code that declares what they describe:

- ``docs/reference/options.md``: every option of ``streamer run`` (``streamer.config.options``:
  flag, ``STREAMER_*`` variable, TOML key, default, allowed values, help), by group;
- ``docs/reference/metrics.md``: every metric family (``streamer.ops.metrics.reference``) with
  the alert rules of ``deploy/prometheus/alerts.yml`` that read it;
- ``docs/api.md``: the Python API (``streamer.apidoc``).

``python -m streamer.docgen`` writes them (from the repository root); ``--check`` writes
nothing and exits 1 naming the stale ones. A test keeps them current.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamer.config.options import Option

__all__ = ["PAGES", "metrics_page", "options_page"]

ROOT = Path(__file__).resolve().parents[1]

_OPTIONS_HEAD = """\
# Options

Every option of `streamer run`, generated from the code that declares it
(`streamer/config/options.py`; `python -m streamer.docgen` writes this page and a test keeps
it current). Each one is a flag, a `STREAMER_*` environment variable and a key of the TOML
file given with `--config` (or `STREAMER_CONFIG`), with this precedence: defaults < the TOML
file < `STREAMER_*` variables < flags. `streamer run --help` shows the same text.
`streamer.Stream(**settings)` takes the same names as keywords (the training loop's own options
excepted: see the [Python API](../api.md)).

Secrets are never flags: `STREAMER_SASL_PASSWORD` / `STREAMER_SSL_PASSWORD`, or the name of a
file holding one in `STREAMER_SASL_PASSWORD_FILE` / `STREAMER_SSL_PASSWORD_FILE` (a mounted
Kubernetes Secret).
"""

_METRICS_HEAD = """\
# Metrics

Every family the worker exports on `/metrics` (prefix `streamer_`, Prometheus base units,
`promtool check metrics` clean), its labels, what it means and the alert rules of
`deploy/prometheus/alerts.yml` that read it. Every series without a `metric` label exists from
start-up; per-partition series exist while the partition is assigned. The table is generated
from the code (`python -m streamer.docgen`) and a test keeps it equal to this page.

"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(opt: Option) -> str:
    if opt.shown:
        return _cell(opt.shown)
    value = opt.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "unset"
    return f"`{value}`"


def options_page() -> str:
    """``docs/reference/options.md``."""
    from streamer.config.options import OPTIONS

    groups: dict[str, list[Option]] = {}
    for opt in OPTIONS:
        groups.setdefault(opt.group, []).append(opt)
    lines = [_OPTIONS_HEAD]
    for group, options in groups.items():
        lines += [f"## {group.capitalize()}", ""]
        lines += ["| flag / variable / TOML key | default | meaning |", "| --- | --- | --- |"]
        for opt in options:
            name = f"`{opt.flag}`<br>`{opt.env}`<br>`{opt.name}`"
            meaning = _cell(opt.help)
            choices = opt.choices
            if choices:
                meaning += " (one of " + ", ".join(f"`{c}`" for c in choices) + ")"
            lines.append(f"| {name} | {_default(opt)} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def metrics_page() -> str:
    """``docs/reference/metrics.md``."""
    from streamer.ops.metrics import alerts_by_metric, reference_markdown

    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text(encoding="utf-8")
    table = reference_markdown(alerts_by_metric(rules))
    return f"{_METRICS_HEAD}<!-- metrics:begin -->\n{table}<!-- metrics:end -->\n"


def _api_page() -> str:
    from streamer.apidoc import reference

    return reference()


#: Each generated page: its path in the repository, and what makes it.
PAGES: dict[str, Callable[[], str]] = {
    "docs/reference/options.md": options_page,
    "docs/reference/metrics.md": metrics_page,
    "docs/api.md": _api_page,
}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for rel, make in PAGES.items():
        path = ROOT / rel
        text = make()
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(rel)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if check and stale:
        print(f"stale: {', '.join(stale)}: run python -m streamer.docgen", file=sys.stderr)
        return 1
    for rel in stale:
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
