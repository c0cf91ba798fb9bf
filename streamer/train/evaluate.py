"""Evaluator: the mean loss and compiled metrics over a held-out topic, read without a group.

Each evaluation is one pass of its own StreamSource over every partition of the eval topic in
static mode, from the earliest offsets, ending after ``records`` records (or when the topic runs
dry for ``idle_timeout`` seconds). So every evaluation sees the same held-out set: the first
``records`` records of the topic (which records exactly can vary a little with the order the
partitions' blocks arrive in, unless the topic holds at most ``records`` records).

Each batch goes through the model's own ``test_step``, as ``model.evaluate`` does it: the loss
(``compute_loss`` with ``training=False``, regularization included) and every compiled metric
(``model.compile(metrics=[...])``, e.g. ``mae`` for the built-in model), under Keras' names.
The model's metric state is shared with training: the worker reports the training window
before an evaluation starts, and the evaluation resets the state before and after it.

Nothing is ever committed: the consumers have no group id at all (``group_id=None``), so they
cannot move any group's offsets on the eval topic, and the source's offset tracker is its own
(never acked into the training tracker). Eval shards report no metrics, readiness or lag: the
worker's per-partition series describe the training topic only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import NamedTuple

import tensorflow as tf

from consumers.errors import TopicNotFoundError
from consumers.settings import ConsumerSettings
from streamer.decode.schema import Schema
from streamer.input.pipeline import PipelineSettings
from streamer.input.source import METADATA_COLUMNS, StreamSource, end_iterator
from streamer.train.trainer import Trainer

__all__ = ["EvalResult", "Evaluator", "eval_consumer_settings"]

log = logging.getLogger(__name__)


def eval_consumer_settings(
    training: ConsumerSettings, topic: str, partitions: list[int], shards: int = 1
) -> ConsumerSettings:
    """The training consumer's connection settings, turned to ``topic``: static, group-less."""
    return dataclasses.replace(
        training,
        topic=topic,
        group_id="",  # static mode without a group id: kafka-python gets group_id=None
        mode="static",
        partitions=tuple(partitions),
        num_shards=max(1, min(shards, len(partitions))),
        shard_runtime="thread",
        auto_offset_reset="earliest",
        client_id=f"{training.client_id}-eval",
    )


class EvalResult(NamedTuple):
    """One evaluation: mean loss, records evaluated, and each compiled metric by name."""

    loss: float
    records: int
    metrics: Mapping[str, float]


class Evaluator:
    """Mean loss and compiled metrics of ``trainer``'s model over the first ``records`` records.

    >>> ev = Evaluator(consumer, "samples-eval", schema, trainer, records=2048)  # doctest: +SKIP
    >>> ev.evaluate()      # EvalResult(loss, records, {"mae": ...}) or None (no records,  # doctest: +SKIP
    ...                    # topic missing, stopped)
    """

    def __init__(
        self,
        consumer: ConsumerSettings,
        topic: str,
        schema: Schema,
        trainer: Trainer,
        *,
        records: int,
        batch_size: int,
        idle_timeout: float = 2.0,
        shards: int = 1,
        decoder: str = "auto",
    ) -> None:
        self.consumer = consumer
        self.decoder = decoder
        self.topic = topic
        self.schema = schema
        self.trainer = trainer
        self.records = records
        self.batch_size = batch_size
        self.idle_timeout = idle_timeout
        self.shards = shards
        self.source: StreamSource | None = None
        self._dataset: tf.data.Dataset | None = None
        self._stopped = False

    def _build(self) -> StreamSource | None:
        if self.source is not None:
            return self.source
        from consumers.admin import wait_for_topic

        probe = dataclasses.replace(self.consumer, topic=self.topic)
        try:
            partitions = wait_for_topic(probe, attempts=1, topic_wait_seconds=0)
        except TopicNotFoundError:
            log.warning("eval topic %r does not exist (yet): evaluation skipped", self.topic)
            return None
        settings = eval_consumer_settings(self.consumer, self.topic, partitions, self.shards)
        pipeline = PipelineSettings(
            num_shards=settings.num_shards,
            batch_size=self.batch_size,
            pass_records=self.records,
            idle_timeout_seconds=self.idle_timeout,
            decoder=self.decoder,
        )
        self.source = StreamSource(self.schema, pipeline, consumer=settings)
        self._dataset = self.source.dataset()
        log.info(
            "evaluating on %s partitions %s (%d records, no consumer group, never committed)",
            self.topic,
            partitions,
            self.records,
        )
        return self.source

    def evaluate(self) -> EvalResult | None:
        """One evaluation pass; raises StreamerError if the eval input fails."""
        if self._stopped:
            return None
        source = self._build()
        if source is None or self._stopped:
            return None
        assert self._dataset is not None
        source.resume()
        source.begin_pass()
        seen = 0
        self.trainer.reset_metrics()
        iterator = iter(self._dataset)
        try:
            while seen < self.records and not self._stopped:
                batch = source.next_batch(iterator, "the eval input pipeline")
                if batch is None:
                    break
                n = int(batch[METADATA_COLUMNS[1]].shape[0])
                take = min(n, self.records - seen)
                if take <= 0:
                    continue
                if take < n:
                    batch = {k: v[:take] for k, v in batch.items()}
                self.trainer.evaluate(batch)
                seen += take
        finally:
            box = [iterator]
            del iterator
            end_iterator(box, source.stop)
            source.end_pass()
        values = self.trainer.metric_values(reset=True)  # training starts a window of its own
        if seen == 0 or (self._stopped and seen < self.records):
            return None  # nothing read, or cut short by a stop: not comparable with the others
        loss = values.pop("loss", float("nan"))
        return EvalResult(loss, seen, values)

    def stop(self) -> None:
        """End a running evaluation soon and run no more."""
        self._stopped = True
        if self.source is not None:
            self.source.stop()

    def close(self) -> None:
        self.stop()
        if self.source is not None:
            self.source.close()
