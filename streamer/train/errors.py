"""The errors of training: raised by the loops and the trainer, never by the Kafka side."""

from __future__ import annotations

from consumers.errors import StreamerError

__all__ = ["CheckpointsFailingError", "ModelDivergedError"]


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


class CheckpointsFailingError(StreamerError):
    """Checkpoints kept failing (a full or read-only disk) for longer than
    ``--checkpoint-failure-seconds``: the worker stops rather than train for hours what it
    cannot save. Nothing was committed past the last good checkpoint. Not retriable: a
    restart helps only once the disk has room."""

    def __init__(self, seconds: float, attempts: int, last_error: str, directory: str) -> None:
        self.seconds = seconds
        super().__init__(
            f"checkpoints to {directory} have failed for {seconds:.0f}s ({attempts} attempts; "
            f"the last: {last_error}): stopping rather than train records that cannot be "
            "saved. Free the disk (or make the directory writable) and restart: the worker "
            "resumes from its last good checkpoint, and the records trained since are read "
            "again (none was committed). --checkpoint-failure-seconds sets the bound"
        )
