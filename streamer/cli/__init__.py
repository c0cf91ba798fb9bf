"""cli: the ``streamer`` command (the settings it loads: ``streamer.config``).

- ``commands``: ``main`` and every subcommand (run, replay, simulate, lag, reset-group,
  launch, bench);
- ``arguments``: the run options as argparse flags;
- ``replay``: the help texts of ``streamer replay``.
"""

from streamer.cli.commands import main

__all__ = ["main"]
