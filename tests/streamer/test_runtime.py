"""streamer.runtime: the parts both loops build from a config, each on its own (no broker:
the simulator's config; the metrics server on a free loopback port)."""

from __future__ import annotations

import logging
import os
import urllib.request

import pytest
from prometheus_client import generate_latest

from consumers.settings import ConsumerSettings
from streamer.config import load_config
from streamer.input.offsets import OffsetTracker
from streamer.ops.health import Health
from streamer.runtime import dead_letter_writer, new_metrics, serve_metrics, stream_start
from tests.workerutil import free_port


def test_new_metrics_names_the_versions_and_the_workers_of_the_model() -> None:
    metrics = new_metrics(load_config({"topic": "t"}, env={}), workers=3)
    import tensorflow as tf

    text = generate_latest(metrics.registry).decode()
    assert "streamer_cluster_workers 3.0" in text
    assert f'tensorflow="{tf.__version__}"' in text


def test_serve_metrics_is_off_with_port_0_and_serves_the_registry_otherwise() -> None:
    health = Health(60.0)
    metrics = new_metrics(load_config({"topic": "t"}, env={}))
    assert serve_metrics(load_config({"metrics_port": "0"}, env={}), metrics, health) is None
    port = free_port()
    config = load_config({"metrics_port": str(port), "metrics_host": "127.0.0.1"}, env={})
    server = serve_metrics(config, metrics, health)
    assert server is not None
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200 and b"streamer_cluster_workers" in resp.read()
    finally:
        server.close()


def test_stream_start_without_a_broker_keeps_the_checkpoint_and_says_start_from_is_moot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    start = stream_start(load_config({}, env={}), None, {0: 7, 1: 3})
    assert (start.offsets, start.reason, start.stop) == ({0: 7, 1: 3}, "checkpoint", None)
    with caplog.at_level(logging.WARNING):
        start = stream_start(load_config({"start_from": "earliest"}, env={}), None, {0: 7})
    assert start.offsets == {0: 7} and "--start-from earliest ignored" in caplog.text


def test_no_dead_letter_topic_no_writer_and_no_broker_asked() -> None:
    config = load_config({"topic": "t"}, env={})
    consumer = ConsumerSettings(bootstrap_servers="127.0.0.1:1", topic="t")  # never dialled
    metrics = new_metrics(config)
    assert dead_letter_writer(config, consumer, 2, OffsetTracker(), metrics) is None


def test_choose_decoder_names_it_and_the_setting_goes_down_to_the_pipeline() -> None:
    """``--decoder`` travels as a setting (to the decode map and, with its decode, to every
    shard child), never through the environment."""
    from streamer.decode import native
    from streamer.input.simulator import SimulatorTask
    from streamer.runtime import choose_decoder

    schema = SimulatorTask().schema()
    before = dict(os.environ)
    python = load_config({"decoder": "python"}, env={})
    assert choose_decoder(python, schema) == "python"
    assert python.pipeline_settings().decoder == "python"
    want = "native" if native.AVAILABLE else "python"
    auto = load_config({}, env={})
    assert choose_decoder(auto, schema) == want
    assert auto.pipeline_settings().decoder == "auto"
    assert dict(os.environ) == before
