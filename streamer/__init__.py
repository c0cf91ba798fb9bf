"""streamer: Kafka msgpack records -> tf.data -> continuous TensorFlow training, with metrics.

The public API (everything else is internal):

- ``Stream``: a topic (or the built-in simulator) as a ``tf.data`` stream for your own
  ``model.fit`` (``Stream.dataset()`` + ``Stream.callback()``) or training loop
  (``Stream.batches()`` + ``Stream.trained()``), committed only after training;
- ``Batch``: one batch of a custom loop;
- ``Schema``: the record format (``Schema.from_file("schema.toml")``);
- ``StreamerError``, ``ConfigError``: what a bad setting, record or broker raises.

Importing ``streamer`` is cheap: TensorFlow loads with the first ``Stream``.
"""

from typing import TYPE_CHECKING, Any

from consumers.errors import ConfigError, StreamerError
from streamer.decode.schema import Schema

if TYPE_CHECKING:
    from streamer.stream import Batch, Stream

__version__ = "0.1.0"

__all__ = ["Batch", "ConfigError", "Schema", "Stream", "StreamerError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Stream", "Batch"):
        from streamer import stream

        return getattr(stream, name)
    raise AttributeError(f"module 'streamer' has no attribute {name!r}")
