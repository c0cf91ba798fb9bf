"""The parts every worker builds from its config, built in one place: the metrics and their
HTTP server, the dead-letter writer, where the stream starts.

The local loop (``streamer.worker``) and the cluster loop (``streamer.cluster.worker``) build
their parts with these, in their own order (a cluster forms before anything else runs).
Nothing here trains or steps; each function does the I/O its name says, and nothing else
does it for it (constructors of the parts do none).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from consumers.settings import ConsumerSettings
from streamer.config import WorkerConfig
from streamer.input.offsets import OffsetTracker
from streamer.input.source import StreamStart, resolve_start
from streamer.ops.health import Health, MetricsServer
from streamer.ops.metrics import Metrics

if TYPE_CHECKING:
    from streamer.decode.schema import Schema
    from streamer.input.deadletter import DeadLetterWriter

__all__ = ["choose_decoder", "dead_letter_writer", "new_metrics", "serve_metrics", "stream_start"]

log = logging.getLogger(__name__)


def new_metrics(config: WorkerConfig, *, workers: int = 1) -> Metrics:
    """The worker's metric set, its versions and the number of workers of its model."""
    import kafka
    import tensorflow as tf

    from streamer import __version__

    metrics = Metrics(
        config.topic,
        version=__version__,
        tensorflow_version=tf.__version__,
        kafka_python_version=kafka.__version__,
    )
    metrics.cluster_workers.set(workers)
    return metrics


def choose_decoder(config: WorkerConfig, schema: Schema) -> str:
    """The msgpack decoder of this run (``native`` or ``python``, for the start line); the
    source hands ``--decoder`` to its decode map and its shard children
    (``PipelineSettings.decoder``)."""
    from streamer.decode.native import decoder_name, why_python

    why = why_python(schema, config.decoder)
    if why is not None:
        log.info("decoder: the pure-Python reference (%s)", why)
    return decoder_name(schema, config.decoder)


def serve_metrics(config: WorkerConfig, metrics: Metrics, health: Health) -> MetricsServer | None:
    """/metrics, /healthz and /readyz on --metrics-port (none with port 0)."""
    if not config.metrics_port:
        return None
    server = MetricsServer(
        metrics.registry, health, host=config.metrics_host, port=config.metrics_port
    ).start()
    log.info("metrics on http://%s:%d/metrics", config.metrics_host, server.port)
    return server


def stream_start(
    config: WorkerConfig, consumer: ConsumerSettings | None, restored: dict[int, int]
) -> StreamStart:
    """Where this run's partitions start: the checkpoint's offsets (``restored``), or those
    of --start-from / a replay's --from, which win; a replay's stop offsets. Looked up once."""
    return resolve_start(config.pipeline_settings(), consumer, restored)


def dead_letter_writer(
    config: WorkerConfig,
    consumer: ConsumerSettings,
    partitions: int,
    tracker: OffsetTracker,
    metrics: Metrics,
) -> DeadLetterWriter | None:
    """The dead-letter topic (created, sized to the source's max.message.bytes) and its
    writer, whose acknowledged letters count as done records; None without
    --dead-letter-topic."""
    if not config.dead_letter_topic:
        return None
    from consumers.admin import ensure_topic
    from streamer.input.deadletter import DeadLetterWriter

    sized = ensure_topic(
        consumer,
        config.dead_letter_topic,
        partitions=partitions,
        replication_factor=config.dead_letter_replication_factor,
    )

    def done(p: int, o: int) -> None:
        tracker.ack(np.array([p], np.int32), np.array([o], np.int64))
        metrics.observe_dead_lettered(1)

    return DeadLetterWriter(
        consumer.bootstrap_servers,
        config.dead_letter_topic,
        on_done=done,
        on_failure=lambda _exc: metrics.kafka_error("dead_letter"),
        security=consumer.security.kafka_config(),
        max_message_bytes=sized.max_message_bytes,
        max_record_bytes=sized.source_max_message_bytes,
    )
