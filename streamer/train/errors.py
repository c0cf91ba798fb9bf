"""The errors of training: raised by the loops and the trainer, never by the Kafka side."""

from __future__ import annotations

from consumers.errors import StreamerError

__all__ = ["ModelDivergedError"]


class ModelDivergedError(StreamerError):
    """Training cannot go on: steps in a row had a non-finite loss or gradients, or a weight
    became non-finite. The last good checkpoint is kept; nothing is committed past it."""

    exit_code = 3

    def __init__(self, detail: str, checkpoint: str | None) -> None:
        self.checkpoint = checkpoint
        kept = (
            f"the last good checkpoint ({checkpoint}) is kept and nothing was committed past it"
            if checkpoint
            else "nothing was committed past the last good step"
        )
        super().__init__(
            f"the model diverged: {detail}; {kept}. Lower the learning rate (or check the "
            "model and its inputs) and restart: the worker resumes from there"
        )
