"""cli: the ``streamer`` command: its options (declared once), their loading and commands.

- ``commands``: ``main`` and every subcommand (run, replay, simulate, lag, reset-group,
  launch, bench);
- ``options``: every worker option, declared once (flag, STREAMER_* variable, TOML key);
- ``config``: ``WorkerConfig``, the options loaded and validated;
- ``replay``: a replay's range, group and help texts.
"""

from streamer.cli.commands import main

__all__ = ["main"]
