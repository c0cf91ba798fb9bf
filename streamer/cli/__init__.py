"""cli: the ``streamer`` command (the settings it loads: ``streamer.config``).

- ``commands``: ``COMMANDS`` (every subcommand, registered once), the parser and ``main``;
- ``base``: the ``Command`` shape, the parser's habits, what the Kafka tools share;
- one module per command: ``run``, ``replay``, ``simulate``, ``lag``, ``launch``,
  ``reset_group``, ``benchmark`` (``streamer bench``);
- ``arguments``: the run options as argparse flags; ``logs``: logging set up once.
"""

from streamer.cli.commands import main

__all__ = ["main"]
