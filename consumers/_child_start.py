"""The first code a shard's spawned child runs (as its ``__mp_main__``, by path: no package
import before it, and never the parent's main script).

Terminal and group signals are the parent's to act on (DESIGN.md section 3, shutdown). The
child's interpreter is started with SIGINT and SIGTERM ignored where it can be
(``consumers.process._child_launcher``: an ignored signal stays ignored across ``exec``, and
Python installs no KeyboardInterrupt handler then); here they are ignored again, for a child
started without the launcher. A signal mask would not do: ``multiprocessing`` starts the
child's interpreter with an empty one.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
