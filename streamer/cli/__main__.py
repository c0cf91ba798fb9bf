"""``python -m streamer.cli``: the ``streamer`` command."""

import sys

from streamer.cli.commands import main

sys.exit(main())
