"""Evaluator: the mean loss and compiled metrics over a held-out topic, read without a group.

Each evaluation is one pass of its own StreamSource over every partition of the eval topic in
static mode, from the earliest offsets, ending after ``records`` records (or when the topic runs
dry for ``idle_timeout`` seconds). So every evaluation sees the same held-out set: the first
``records`` records of the topic (which records exactly can vary a little with the order the
partitions' blocks arrive in, unless the topic holds at most ``records`` records).

Besides the loss, every metric the model was compiled with (``model.compile(metrics=[...])``,
e.g. ``mae`` for the built-in model) is computed over the same records by fresh metric objects
built from the model's compile config: the model's own metric state is never touched.

Nothing is ever committed: the consumers have no group id at all (``group_id=None``), so they
cannot move any group's offsets on the eval topic, and the source's offset tracker is its own
(never acked into the training tracker). Eval shards report no metrics, readiness or lag: the
worker's per-partition series describe the training topic only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from consumers.errors import TopicNotFoundError
from consumers.settings import ConsumerSettings
from streamer.schema import Schema
from streamer.settings import PipelineSettings
from streamer.source import METADATA_COLUMNS, StreamSource
from streamer.train import Trainer

__all__ = ["EvalResult", "Evaluator", "compiled_metrics", "eval_consumer_settings"]

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


def _metric_specs(spec: Any) -> list[Any]:
    """The compile config's ``metrics`` (a list, per-output dict or nested lists), flattened."""
    if spec is None:
        return []
    if isinstance(spec, dict) and "class_name" not in spec:  # {output name: metrics}
        return [m for v in spec.values() for m in _metric_specs(v)]
    if isinstance(spec, list | tuple):
        return [m for v in spec for m in _metric_specs(v)]
    return [spec]


def _accuracy(name: str, model: keras.Model, label_shape: tuple[int, ...]) -> Any:
    """``"accuracy"``/``"acc"`` resolved from the shapes the way ``model.compile`` does it."""
    y_true = (None, *label_shape)
    y_pred = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else y_true
    binary = y_pred[-1] == 1 if y_pred else False
    sparse = len(y_true) < len(y_pred) or (y_true[-1] == 1 and (y_pred[-1] or 0) > 1)
    if binary:
        return keras.metrics.BinaryAccuracy(name=name)
    if sparse:
        return keras.metrics.SparseCategoricalAccuracy(name=name)
    return keras.metrics.CategoricalAccuracy(name=name)


def compiled_metrics(
    model: keras.Model, label_shape: tuple[int, ...] = ()
) -> list[keras.metrics.Metric]:
    """Fresh instances of the metrics ``model`` was compiled with (besides the loss).

    Strings (``"mae"``) name the metric after the string, as ``model.fit`` does (``"accuracy"``
    picks binary, sparse or categorical accuracy from the output and label shapes, as Keras
    does); objects and their serialized configs keep their own ``name``. Metrics that cannot
    be rebuilt, that are named ``loss`` or whose result is not one number are skipped with a
    warning. An uncompiled model has none.
    """
    try:
        config = model.get_compile_config() if getattr(model, "compiled", False) else None
    except Exception:  # a model whose compile arguments do not serialize
        config = None
    specs = [] if not config else _metric_specs(config.get("metrics"))
    specs += [] if not config else _metric_specs(config.get("weighted_metrics"))
    out: list[keras.metrics.Metric] = []
    for spec in specs:
        try:
            if isinstance(spec, str) and spec.lower() in ("accuracy", "acc"):
                obj = _accuracy(spec, model, label_shape)
            else:
                obj = keras.metrics.get(spec)
            if not isinstance(obj, keras.metrics.Metric):
                name = getattr(obj, "__name__", "metric")
                obj = keras.metrics.MeanMetricWrapper(obj, name=name)
            if isinstance(spec, str):
                obj.name = spec
        except Exception as exc:
            log.warning("compiled metric %r cannot be evaluated: %s", spec, exc)
            continue
        if obj.name == "loss" or obj.name in {m.name for m in out}:
            log.warning("compiled metric %r skipped: its name is taken", obj.name)
            continue
        try:
            scalar = tf.convert_to_tensor(obj.result()).shape.num_elements() == 1
        except Exception:  # e.g. a result that is a dict of values
            scalar = False
        if not scalar:
            log.warning("compiled metric %r skipped: its result is not one number", obj.name)
            continue
        out.append(obj)
    return out


class Evaluator:
    """Mean loss and compiled metrics of ``trainer``'s model over the first ``records`` records.

    >>> ev = Evaluator(consumer, "samples-eval", schema, trainer, records=2048)  # doctest: +SKIP
    >>> ev.metric_names                     # ("mae",) for the built-in model  # doctest: +SKIP
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
    ) -> None:
        self.consumer = consumer
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
        label = schema.feature(trainer.bundle.label) if trainer.bundle.label else None
        label_shape = tuple(label.shape) if label is not None else ()
        self.metrics = compiled_metrics(trainer.bundle.model, label_shape)
        self.metric_names: tuple[str, ...] = tuple(m.name for m in self.metrics)
        self._batch_fn = self._make_batch_fn()

    def _make_batch_fn(self) -> Any:
        """A compiled function: one batch's mean loss; updates the metrics' running state."""
        bundle = self.trainer.bundle
        model, loss_fn, names, label = bundle.model, bundle.loss, bundle.input_names, bundle.label
        metrics = self.metrics

        @tf.function(reduce_retracing=True)
        def batch_fn(features: dict[str, tf.Tensor]) -> tf.Tensor:
            inputs = {n: features[n] for n in names}
            pred = model(inputs, training=False)
            y = tf.cast(features[label], pred.dtype)
            loss = tf.cast(loss_fn(y, pred), tf.float32)
            if pred.shape.rank == 1:
                # One number per record: give the metrics a trailing axis, or a mean-over-last-
                # axis metric (mae, mse) would reduce a batch to one value and weigh a short
                # last batch like a full one.
                y, pred = y[:, tf.newaxis], pred[:, tf.newaxis]
            for metric in metrics:
                metric.update_state(y, pred)
            return loss

        return batch_fn

    def _build(self) -> StreamSource | None:
        if self.source is not None:
            return self.source
        from consumers.admin import wait_for_topic

        probe = dataclasses.replace(self.consumer, topic=self.topic)
        try:
            partitions = wait_for_topic(probe, attempts=1, topic_wait_s=0)
        except TopicNotFoundError:
            log.warning("eval topic %r does not exist (yet): evaluation skipped", self.topic)
            return None
        settings = eval_consumer_settings(self.consumer, self.topic, partitions, self.shards)
        pipeline = PipelineSettings(
            num_shards=settings.num_shards,
            batch_size=self.batch_size,
            pass_records=self.records,
            idle_timeout_seconds=self.idle_timeout,
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
        total, seen = 0.0, 0
        for metric in self.metrics:
            metric.reset_state()
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
                total += float(self._batch_fn(self.trainer.model_inputs(batch))) * take
                seen += take
        finally:
            del iterator
            source.end_pass()
        if seen == 0 or (self._stopped and seen < self.records):
            return None  # nothing read, or cut short by a stop: not comparable with the others
        values = {
            m.name: float(tf.reshape(tf.convert_to_tensor(m.result()), [])) for m in self.metrics
        }
        return EvalResult(total / seen, seen, values)

    def stop(self) -> None:
        """End a running evaluation soon and run no more."""
        self._stopped = True
        if self.source is not None:
            self.source.stop()

    def close(self) -> None:
        self.stop()
        if self.source is not None:
            self.source.close()
