"""streamer.parts: the parts both loops build from a config, each on its own (no broker:
the simulator's config; the metrics server on a free loopback port), and all of them at once."""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import socket
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from consumers.errors import ConfigError
from consumers.settings import ConsumerSettings
from streamer.config import WorkerConfig, load_config
from streamer.input.offsets import OffsetTracker
from streamer.input.source import StreamStart
from streamer.ops.health import Health
from streamer.parts import (
    LocalPlan,
    MissingPartError,
    Restored,
    build_parts,
    dead_letter_writer,
    new_metrics,
    required,
    serve_metrics,
)
from streamer.train.lease import Lease
from tests.workerutil import free_port

ROOT = Path(__file__).resolve().parents[2]


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
    def stream_start(config: WorkerConfig, consumer: None, offsets: dict[int, int]) -> StreamStart:
        return LocalPlan().start(config, consumer, Restored(None, 0, offsets))

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
    from streamer.parts import choose_decoder

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


# ---- all the parts at once (build_parts) ----------------------------------------------------


def _assigned(cls: ast.ClassDef, in_init: bool) -> set[str]:
    names = set()
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and (fn.name == "__init__") == in_init:
            for node in ast.walk(fn):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                    targets = [node.target]
                for target in targets:
                    for e in ast.walk(target):
                        if (
                            isinstance(e, ast.Attribute)
                            and isinstance(e.value, ast.Name)
                            and e.value.id == "self"
                        ):
                            names.add(e.attr)
    return names


def _class(path: str, name: str) -> ast.ClassDef:
    tree = ast.parse((ROOT / path).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_every_attribute_of_the_loops_is_first_set_in_init() -> None:
    """The parts come whole (``Parts``); what a loop keeps of its own is set in ``__init__``
    (its own or Lifecycle's), so no attribute exists only after some method ran."""
    base = _class("streamer/lifecycle.py", "Lifecycle")
    base_init = _assigned(base, True)
    assert _assigned(base, False) <= base_init, _assigned(base, False) - base_init
    for path, name in (
        ("streamer/worker.py", "Worker"),
        ("streamer/cluster/worker.py", "DistributedWorker"),
    ):
        cls = _class(path, name)
        later = _assigned(cls, False) - _assigned(cls, True) - base_init
        assert not later, f"{name} sets {sorted(later)} outside __init__"


def test_build_parts_on_the_simulator_builds_every_part_once_and_frozen(tmp_path: Path) -> None:
    config = load_config(
        {
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "audit_log": str(tmp_path / "audit.csv"),
            "metrics_port": "0",
        },
        env={},
    )
    parts = build_parts(config, LocalPlan(), health=Health(60.0), stop=threading.Event())
    try:
        assert parts.step == 0 and parts.start.offsets == {}
        assert parts.checkpointer is not None and parts.lease is not None
        assert parts.audit is not None and parts.probe is None and parts.server is None
        assert parts.topic_partitions == tuple(range(config.sim_partitions))
        assert parts.source.tracker is parts.tracker
        with pytest.raises(dataclasses.FrozenInstanceError):
            parts.step = 5  # type: ignore[misc]
        with pytest.raises(MissingPartError, match="this run has no exporter"):
            required(None, "exporter", "built with --export-dir")
    finally:
        parts.source.close()
        parts.close()
        parts.lease.close()


def test_a_build_that_fails_part_way_closes_what_it_opened(tmp_path: Path) -> None:
    """A model that cannot be imported fails after the lease and the metrics server: both
    are given back (the port is free again, another worker may take the directory)."""
    port = free_port()
    config = load_config(
        {
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "metrics_port": str(port),
            "metrics_host": "127.0.0.1",
            "model": "examples.keras_model:no_such_function",
        },
        env={},
    )
    with pytest.raises(ConfigError, match="has no function no_such_function"):
        build_parts(config, LocalPlan(), health=Health(60.0), stop=threading.Event())
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the server's port was freed
    Lease.acquire(str(tmp_path / "ckpt")).close()  # the lease was released
