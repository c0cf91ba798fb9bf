"""config: the worker's settings, below every loop and command that reads them.

- ``options``: every worker option, declared once (flag, STREAMER_* variable, TOML key, help);
- ``settings``: ``WorkerConfig``, the options validated, and the parts' settings it derives;
- ``loading``: ``load_config``, defaults < TOML file < STREAMER_* variables < flags;
- ``printing``: ``print_config``, the effective settings and where each came from;
- ``replay``: a replay's range, its outputs' checks and its group.

Nothing here imports TensorFlow, a loop or the command line.
"""

from streamer.config.loading import SECRET_ENV, load_config
from streamer.config.options import OPTIONS, Option
from streamer.config.printing import print_config
from streamer.config.replay import ReplaySpec
from streamer.config.settings import (
    WorkerConfig,
    resolve_shard_runtime,
    shard_runtime_choice,
    usable_cores,
)

__all__ = [
    "OPTIONS",
    "SECRET_ENV",
    "Option",
    "ReplaySpec",
    "WorkerConfig",
    "load_config",
    "print_config",
    "resolve_shard_runtime",
    "shard_runtime_choice",
    "usable_cores",
]
