"""Tests for streamer.ops.metrics: a fresh registry per test, asserted with get_sample_value."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from streamer.ops.metrics import (
    AGE_BUCKETS_SECONDS,
    DECODE_ERROR_REASONS,
    KAFKA_ERROR_TYPES,
    QUEUE_STAGES,
    Metrics,
)

TOPIC = "rollouts"
NOW = 1_700_000_000.0
ALLOWED_LABELS = {
    "topic",
    "partition",
    "reason",
    "stage",
    "result",
    "event",
    "type",
    "metric",
}
PER_PARTITION = (
    "streamer_partition_high_watermark_offset",
    "streamer_partition_last_stable_offset",
    "streamer_partition_position_offset",
    "streamer_partition_trained_offset",
    "streamer_partition_committed_offset",
    "streamer_consumer_lag_records",
    "streamer_partition_last_trained_timestamp_seconds",
)


def make_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    return Metrics(
        TOPIC,
        registry if registry is not None else CollectorRegistry(),
        version="0.1.0",
        tensorflow_version="2.21.0",
        kafka_python_version="3.0.12",
    )


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def pl(partition: int) -> dict[str, str]:
    return {"topic": TOPIC, "partition": str(partition)}


def test_every_series_exists_at_zero_from_start_up() -> None:
    m = make_metrics()
    t = {"topic": TOPIC}
    expected: list[tuple[str, dict[str, str]]] = [
        ("streamer_records_polled_total", t),
        ("streamer_bytes_polled_total", t),
        ("streamer_records_decoded_total", t),
        ("streamer_samples_trained_total", t),
        ("streamer_train_steps_total", {}),
        ("streamer_records_dead_lettered_total", t),
        ("streamer_records_clock_skewed_total", t),
        ("streamer_paused_partitions", {}),
        ("streamer_assigned_partitions", {}),
        ("streamer_last_poll_timestamp_seconds", {}),
        ("streamer_last_checkpoint_timestamp_seconds", {}),
        ("streamer_nonfinite_steps_total", {}),
        ("streamer_record_age_at_train_seconds_count", {}),
        ("streamer_record_age_at_train_seconds_sum", {}),
        ("streamer_record_age_at_train_seconds_bucket", {"le": "+Inf"}),
        ("streamer_record_age_at_train_seconds_bucket", {"le": "0.001"}),
        ("streamer_record_age_at_train_seconds_bucket", {"le": "86400.0"}),
        ("streamer_input_wait_seconds_count", {}),
        ("streamer_input_wait_seconds_bucket", {"le": "0.0001"}),
        ("streamer_input_wait_seconds_bucket", {"le": "60.0"}),
        ("streamer_train_step_seconds_count", {}),
        ("streamer_commit_duration_seconds_count", {}),
        ("streamer_padded_rows_total", {}),
        ("streamer_idle_steps_total", {}),
        ("streamer_rollbacks_total", {}),
    ]
    expected += [("streamer_decode_errors_total", {**t, "reason": r}) for r in DECODE_ERROR_REASONS]
    expected += [("streamer_kafka_errors_total", {"type": k}) for k in KAFKA_ERROR_TYPES]
    for result in ("success", "failure"):
        expected += [
            ("streamer_offset_commits_total", {"result": result}),
            ("streamer_checkpoints_total", {"result": result}),
        ]
    expected += [
        ("streamer_rebalances_total", {"event": e}) for e in ("assigned", "revoked", "lost")
    ]
    expected += [("streamer_queue_depth_records", {"stage": s}) for s in QUEUE_STAGES]
    expected += [("streamer_queue_capacity_records", {"stage": "shard"})]
    missing = [(n, lb) for n, lb in expected if m.registry.get_sample_value(n, lb) != 0.0]
    assert missing == []
    # A loss before the first step or evaluation is unknown, never a perfect-looking 0.
    for name in ("streamer_eval_loss", "streamer_model_loss"):
        assert math.isnan(m.registry.get_sample_value(name, {}) or 0.0), name
    assert set(QUEUE_STAGES) == {"shard", "prefetch", "dead_letter"}
    assert len(DECODE_ERROR_REASONS) == 8
    build = {"version": "0.1.0", "tensorflow": "2.21.0", "kafka_python": "3.0.12"}
    assert value(m, "streamer_build_info", **build) == 1.0
    assert value(m, "streamer_cluster_workers") == 1.0  # a worker on its own


def test_per_partition_series_exist_at_zero_once_assigned() -> None:
    m = make_metrics()
    assert value(m, "streamer_consumer_lag_records", **pl(0)) is None
    m.partitions_assigned([0, 3])
    for name in PER_PARTITION:
        for p in (0, 3):
            assert value(m, name, **pl(p)) == 0.0, name
    assert value(m, "streamer_assigned_partitions") == 2.0


def test_names_follow_prometheus_conventions() -> None:
    m = make_metrics()
    m.partitions_assigned([0])
    for family in m.registry.collect():
        assert family.name.startswith("streamer_"), family.name
        if family.type == "counter":
            values = [s.name for s in family.samples if not s.name.endswith("_created")]
            assert values and all(n.endswith("_total") for n in values), family.name
        else:
            assert not family.name.endswith("_total"), family.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        if "timestamp" in family.name:
            assert family.type == "gauge" and family.name.endswith("_timestamp_seconds")
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            if family.name == "streamer_build_info":
                assert labels == {"version", "tensorflow", "kafka_python"}
            else:
                assert labels <= ALLOWED_LABELS, (family.name, labels)


def test_two_instances_do_not_share_a_registry() -> None:
    a = Metrics(TOPIC, version="x", tensorflow_version="y", kafka_python_version="z")
    b = Metrics(TOPIC, version="x", tensorflow_version="y", kafka_python_version="z")
    assert a.registry is not b.registry
    a.observe_poll(3, 30, NOW)
    assert b.registry.get_sample_value("streamer_records_polled_total", {"topic": TOPIC}) == 0.0


def test_revoking_removes_every_per_partition_series() -> None:
    m = make_metrics()
    m.partitions_assigned([0, 1])
    m.set_high_watermark(1, 10)
    m.set_position(1, 5)
    m.observe_trained([1], [4], [int(NOW * 1000)], NOW)
    m.observe_commit({1: 5}, ok=True, seconds=0.01)

    m.partitions_revoked([1])

    for name in PER_PARTITION:
        assert value(m, name, **pl(1)) is None, name
        assert value(m, name, **pl(0)) == 0.0, name
    assert value(m, "streamer_assigned_partitions") == 1.0
    assert m.lag(1) == 0.0
    # A late batch or watermark of the revoked partition does not bring its series back.
    m.set_high_watermark(1, 20)
    m.set_position(1, 20)
    m.observe_trained([1], [9], [int(NOW * 1000)], NOW)
    m.observe_commit({1: 10}, ok=True, seconds=0.01)
    for name in PER_PARTITION:
        assert value(m, name, **pl(1)) is None, name
    # ...but the trained records still count.
    assert value(m, "streamer_record_age_at_train_seconds_count") == 2.0
    # Revoking twice or revoking an unknown partition is harmless.
    m.partitions_revoked([1, 7])
    assert value(m, "streamer_assigned_partitions") == 1.0


def test_reassignment_starts_at_what_was_known_and_a_late_update_changes_nothing() -> None:
    m = make_metrics()
    m.partitions_assigned([2])
    m.set_high_watermark(2, 50)
    m.observe_trained([2], [39], [0], NOW)
    m.observe_commit({2: 40}, True, 0.01)
    m.partitions_revoked([2])
    m.observe_trained([2], [45], [0], NOW)  # a late batch of the revoked partition
    assert value(m, "streamer_partition_trained_offset", **pl(2)) is None  # no stale series
    m.partitions_assigned([2])
    assert value(m, "streamer_partition_trained_offset", **pl(2)) == 40.0
    assert value(m, "streamer_partition_high_watermark_offset", **pl(2)) == 50.0
    assert value(m, "streamer_consumer_lag_records", **pl(2)) == 10.0


def test_lag_is_high_watermark_minus_trained_and_never_negative() -> None:
    m = make_metrics()
    m.partitions_assigned([0, 1])
    m.set_high_watermark(0, 100)
    assert m.lag(0) == 100.0
    assert value(m, "streamer_consumer_lag_records", **pl(0)) == 100.0

    m.observe_trained([0, 0], [10, 41], [0, 0], NOW)
    assert value(m, "streamer_partition_trained_offset", **pl(0)) == 42.0
    assert m.lag(0) == 58.0
    assert value(m, "streamer_consumer_lag_records", **pl(0)) == 58.0

    m.set_high_watermark(0, 110)
    assert value(m, "streamer_consumer_lag_records", **pl(0)) == 68.0

    # The trained offset can run ahead of a stale high watermark: lag floors at 0.
    m.observe_trained([1], [9], [0], NOW)
    m.set_high_watermark(1, 5)
    assert m.lag(1) == 0.0
    assert value(m, "streamer_consumer_lag_records", **pl(1)) == 0.0
    assert m.snapshot()["consumer_lag_records"] == 68.0
    assert m.lag(99) == 0.0


def test_read_committed_lag_counts_up_to_the_last_stable_offset() -> None:
    m = make_metrics()
    m.partitions_assigned([0])
    m.set_high_watermark(0, 100)
    m.observe_trained([0], [59], [0], NOW)
    assert m.lag(0) == 40.0  # read_uncommitted, or no transaction: up to the high watermark
    assert value(m, "streamer_partition_last_stable_offset", **pl(0)) == 100.0
    # A transaction opened at offset 70 and still open: its 30 records cannot be read yet.
    m.set_last_stable(0, 70)
    assert m.lag(0) == 10.0
    assert value(m, "streamer_partition_last_stable_offset", **pl(0)) == 70.0
    # The consumer's position follows the stable offset: never below it.
    m.set_position(0, 80)
    assert m.lag(0) == 20.0
    # The transaction commits: the next reading says so.
    m.set_last_stable(0, 100)
    assert m.lag(0) == 40.0
    m.set_high_watermark(0, 150)  # a topic without open transactions follows its watermark
    assert m.lag(0) == 90.0
    m.observe_commit({0: 150}, ok=True, seconds=0.001)
    assert m.lag(0) == 0.0


def test_lag_uses_the_committed_offset_before_the_first_step() -> None:
    m = make_metrics()
    m.partitions_assigned([0])
    m.set_high_watermark(0, 1000)
    m.observe_commit({0: 990}, ok=True, seconds=0.002)
    assert value(m, "streamer_consumer_lag_records", **pl(0)) == 10.0
    m.observe_trained([0], [994], [0], NOW)
    assert value(m, "streamer_consumer_lag_records", **pl(0)) == 5.0


def test_lag_counts_from_where_an_assignment_starts_not_from_the_commit() -> None:
    """A checkpoint's or --start-from's offset replaces the group's commit as the floor: the
    records a seek skips are not left to train, and those it goes back to are."""
    m = make_metrics()
    m.partitions_assigned([0, 1, 2])
    for p in (0, 1, 2):
        m.set_high_watermark(p, 15_000)
    m.seed_committed({0: 10_041, 1: 10_041})  # a reset-group, say
    m.seed_start({0: 15_003, 2: 9_959})  # the checkpoint is past it; --start-from on 2
    assert value(m, "streamer_consumer_lag_records", **pl(0)) == 0.0  # not 4,959
    assert value(m, "streamer_consumer_lag_records", **pl(1)) == 15_000 - 10_041
    assert value(m, "streamer_consumer_lag_records", **pl(2)) == 15_000 - 9_959  # not 15,000
    m.seed_start({1: 9_000})  # a start below the commit: those records train again
    assert value(m, "streamer_consumer_lag_records", **pl(1)) == 6_000.0
    m.observe_trained([2], [12_000], [0], NOW)
    assert value(m, "streamer_consumer_lag_records", **pl(2)) == 15_000 - 12_001


def test_observe_trained_is_per_partition_max_and_counts_every_age() -> None:
    m = make_metrics()
    m.partitions_assigned([0, 1, 2])
    now_ms = int(NOW * 1000)
    partitions = np.array([1, 0, 1, 0, 1], dtype=np.int32)
    offsets = np.array([7, 3, 9, 2, 8], dtype=np.int64)
    stamps = np.array([now_ms - 500, now_ms - 2000, now_ms - 100, -1, now_ms + 5000])
    m.observe_trained(partitions, offsets, stamps, NOW)

    assert value(m, "streamer_partition_trained_offset", **pl(0)) == 4.0
    assert value(m, "streamer_partition_trained_offset", **pl(1)) == 10.0
    assert value(m, "streamer_partition_trained_offset", **pl(2)) == 0.0
    ts = "streamer_partition_last_trained_timestamp_seconds"
    assert value(m, ts, **pl(0)) == pytest.approx(NOW - 2.0)
    # A producer's clock ahead of ours: freshness never goes past now, the record is counted.
    assert value(m, ts, **pl(1)) == pytest.approx(NOW)
    assert value(m, "streamer_records_clock_skewed_total", topic=TOPIC) == 1.0
    # -1 (no timestamp) is left out; a timestamp in the future counts as age 0.
    age = "streamer_record_age_at_train_seconds"
    assert value(m, f"{age}_count") == 4.0
    assert value(m, f"{age}_sum") == pytest.approx(0.5 + 2.0 + 0.1 + 0.0)
    assert value(m, f"{age}_bucket", le="0.001") == 1.0
    assert value(m, f"{age}_bucket", le="0.1") == 2.0
    assert value(m, f"{age}_bucket", le="0.5") == 3.0
    assert value(m, f"{age}_bucket", le="2.5") == 4.0

    # An older, shuffled batch moves neither the trained offset nor the freshness back.
    m.observe_trained([1], [1], [now_ms - 60_000], NOW)
    assert value(m, "streamer_partition_trained_offset", **pl(1)) == 10.0
    assert value(m, ts, **pl(1)) == pytest.approx(NOW)

    m.observe_trained(np.array([], dtype=np.int64), [], [], NOW)
    assert value(m, f"{age}_count") == 5.0


def test_age_histogram_matches_prometheus_histogram_observe() -> None:
    rng = np.random.default_rng(7)
    ages_ms = np.concatenate(
        [
            rng.integers(0, 200_000_000, size=3000),
            np.array([1, 2, 10, 100, 1000, 86_400_000, 86_400_001]),  # exact bucket bounds
        ]
    )
    now_ms = 1_700_000_000_000
    m = make_metrics()
    partitions = np.zeros(ages_ms.size, dtype=np.int64)
    m.observe_trained(partitions, np.arange(ages_ms.size), now_ms - ages_ms, now_ms / 1000.0)

    reference_registry = CollectorRegistry()
    reference = Histogram(
        "reference_seconds", "", registry=reference_registry, buckets=AGE_BUCKETS_SECONDS
    )
    for age in now_ms / 1000.0 - (now_ms - ages_ms) / 1000.0:
        reference.observe(max(float(age), 0.0))

    for bound in [*AGE_BUCKETS_SECONDS, math.inf]:
        le = "+Inf" if bound == math.inf else repr(float(bound))
        ours = m.registry.get_sample_value(
            "streamer_record_age_at_train_seconds_bucket", {"le": le}
        )
        theirs = reference_registry.get_sample_value("reference_seconds_bucket", {"le": le})
        assert ours == theirs, le
    assert m.registry.get_sample_value("streamer_record_age_at_train_seconds_sum") == (
        pytest.approx(reference_registry.get_sample_value("reference_seconds_sum"))
    )


def test_observe_trained_rejects_columns_of_different_length() -> None:
    m = make_metrics()
    with pytest.raises(ValueError, match=r"same length, got 2, 1 and 2"):
        m.observe_trained([0, 0], [1], [0, 0], NOW)


def test_commit_sets_committed_offsets_and_counts_results() -> None:
    m = make_metrics()
    m.partitions_assigned([0, 1])
    m.observe_commit({0: 12, 1: 30}, ok=True, seconds=0.004)
    assert value(m, "streamer_partition_committed_offset", **pl(0)) == 12.0
    assert value(m, "streamer_partition_committed_offset", **pl(1)) == 30.0
    m.observe_commit({0: 50}, ok=False, seconds=1.5)
    assert value(m, "streamer_partition_committed_offset", **pl(0)) == 12.0
    assert value(m, "streamer_offset_commits_total", result="success") == 1.0
    assert value(m, "streamer_offset_commits_total", result="failure") == 1.0
    assert value(m, "streamer_commit_duration_seconds_count") == 2.0
    assert value(m, "streamer_commit_duration_seconds_bucket", le="0.005") == 1.0
    snap = m.snapshot()
    assert snap["offset_commits_success"] == 1.0
    assert snap["offset_commits_failure"] == 1.0


def test_poll_decode_step_and_pipeline_counters() -> None:
    m = make_metrics()
    m.observe_poll(500, 512_000, NOW)
    m.observe_poll(0, 0, NOW + 1)
    m.observe_decode(497, {"truncated": 2, "shape": 1, "dtype": 0})
    m.observe_dead_lettered(3)
    m.observe_step(256, step_seconds=0.02, input_wait_seconds=0.0005, loss=0.75)
    m.observe_step(241, step_seconds=0.03, input_wait_seconds=0.2, loss=None)
    m.observe_eval(0.5)
    m.set_queue("shard", 1200, 4000)
    m.set_queue("prefetch", 4104, None)  # autotuned: no capacity, never a false 0
    m.set_paused(3)

    t = {"topic": TOPIC}
    assert value(m, "streamer_records_polled_total", **t) == 500.0
    assert value(m, "streamer_bytes_polled_total", **t) == 512_000.0
    assert value(m, "streamer_last_poll_timestamp_seconds") == NOW + 1
    assert value(m, "streamer_records_decoded_total", **t) == 497.0
    assert value(m, "streamer_decode_errors_total", **t, reason="truncated") == 2.0
    assert value(m, "streamer_decode_errors_total", **t, reason="shape") == 1.0
    assert value(m, "streamer_decode_errors_total", **t, reason="dtype") == 0.0
    assert value(m, "streamer_records_dead_lettered_total", **t) == 3.0
    assert value(m, "streamer_train_steps_total") == 2.0
    assert value(m, "streamer_samples_trained_total", **t) == 497.0
    assert value(m, "streamer_model_loss") == 0.75
    assert value(m, "streamer_eval_loss") == 0.5
    assert value(m, "streamer_train_step_seconds_bucket", le="0.025") == 1.0
    assert value(m, "streamer_input_wait_seconds_bucket", le="0.0005") == 1.0
    assert value(m, "streamer_input_wait_seconds_count") == 2.0
    assert value(m, "streamer_queue_depth_records", stage="shard") == 1200.0
    assert value(m, "streamer_queue_depth_records", stage="prefetch") == 4104.0
    assert (
        m.registry.get_sample_value("streamer_queue_capacity_records", {"stage": "prefetch"})
        is None
    )
    assert value(m, "streamer_paused_partitions") == 3.0

    snap = m.snapshot()
    assert snap["samples_trained"] == 497.0
    assert snap["train_steps"] == 2.0
    assert snap["decode_errors"] == 3.0
    assert snap["records_polled"] == 500.0
    assert snap["paused_partitions"] == 3.0


def test_closed_label_sets_are_enforced() -> None:
    m = make_metrics()
    with pytest.raises(ValueError, match="decode error reason 'bogus'"):
        m.observe_decode(1, {"bogus": 1})
    assert value(m, "streamer_records_decoded_total", topic=TOPIC) == 0.0
    with pytest.raises(ValueError, match="queue stage"):
        m.set_queue("decode", 1, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rebalance event"):
        m.rebalance("moved")  # type: ignore[arg-type]
    # Error handlers must not raise: an unknown Kafka error type counts as "other".
    m.kafka_error("SomethingNew")
    m.kafka_error("connection")
    assert value(m, "streamer_kafka_errors_total", type="other") == 1.0
    assert value(m, "streamer_kafka_errors_total", type="connection") == 1.0
    assert value(m, "streamer_kafka_errors_total", type="SomethingNew") is None


def test_rebalances_and_checkpoints() -> None:
    m = make_metrics()
    m.rebalance("assigned")
    m.rebalance("lost")
    m.checkpoint(ok=True, now=NOW)
    m.checkpoint(ok=False, now=NOW + 60)
    assert value(m, "streamer_rebalances_total", event="assigned") == 1.0
    assert value(m, "streamer_rebalances_total", event="lost") == 1.0
    assert value(m, "streamer_rebalances_total", event="revoked") == 0.0
    assert value(m, "streamer_checkpoints_total", result="success") == 1.0
    assert value(m, "streamer_checkpoints_total", result="failure") == 1.0
    assert value(m, "streamer_last_checkpoint_timestamp_seconds") == NOW


def test_concurrent_updates_and_revocation_leave_no_stale_series() -> None:
    m = make_metrics()
    stop = threading.Event()

    def trainer() -> None:
        offset = 0
        while not stop.is_set():
            m.observe_trained([0, 1, 2, 3], [offset] * 4, [0] * 4, NOW)
            m.set_high_watermark(offset % 4, offset + 10)
            offset += 1

    threads = [threading.Thread(target=trainer) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(200):
            m.partitions_assigned([0, 1, 2, 3])
            m.partitions_revoked([2, 3])
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    for name in PER_PARTITION:
        assert value(m, name, **pl(2)) is None
        assert value(m, name, **pl(3)) is None
    assert value(m, "streamer_assigned_partitions") == 2.0


def test_the_metric_reference_page_is_the_code_s() -> None:
    """Every family, its type, labels, help and alerts, as the code declares them."""
    from pathlib import Path

    from streamer.ops.metrics import alerts_by_metric, reference, reference_markdown

    root = Path(__file__).resolve().parents[3]
    page = (root / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    block = page.split("<!-- metrics:begin -->\n", 1)[1].split("<!-- metrics:end -->", 1)[0]
    rules = (root / "deploy" / "prometheus" / "alerts.yml").read_text(encoding="utf-8")
    assert block == reference_markdown(alerts_by_metric(rules)), (
        "docs/reference/metrics.md is stale: regenerate it with python -m streamer.docgen"
    )
    names = [name for name, *_ in reference()]
    assert len(names) == len(set(names)) and "streamer_nonfinite_steps_total" in names


def test_a_partition_assigned_again_after_a_revocation_gets_its_series_back() -> None:
    """The per-partition series are looked up once per assignment (cached in its state): a
    revocation removes them, and the next assignment's updates reach the new ones."""
    m = make_metrics()
    m.partitions_assigned([0, 1])
    m.observe_trained([0, 1, 0], [5, 7, 6], [0, 0, 0], NOW)
    assert value(m, "streamer_partition_trained_offset", **pl(0)) == 7.0
    m.partitions_revoked([0])
    assert value(m, "streamer_partition_trained_offset", **pl(0)) is None
    m.observe_trained([0], [8], [0], NOW)  # a late step of a revoked partition: no series back
    assert value(m, "streamer_partition_trained_offset", **pl(0)) is None
    m.partitions_assigned([0])
    m.observe_trained([1, 0], [9, 20], [int(NOW * 1000) - 1000, int(NOW * 1000) - 3000], NOW)
    assert value(m, "streamer_partition_trained_offset", **pl(0)) == 21.0
    assert value(m, "streamer_partition_trained_offset", **pl(1)) == 10.0
    ts = "streamer_partition_last_trained_timestamp_seconds"
    assert value(m, ts, **pl(0)) == pytest.approx(NOW - 3.0)
    assert value(m, "streamer_consumer_lag_records", **pl(0)) is not None


def test_a_record_stamped_in_1970_is_clock_skew_not_56_years_of_staleness() -> None:
    m = make_metrics()
    m.partitions_assigned([0])
    now_ms = int(NOW * 1000)
    m.observe_trained([0, 0], [0, 1], [0, now_ms - 3000], NOW)  # a producer that sends 0
    ts = "streamer_partition_last_trained_timestamp_seconds"
    assert value(m, ts, **pl(0)) == pytest.approx(NOW - 3.0)
    assert value(m, "streamer_records_clock_skewed_total", topic=TOPIC) == 1.0
    age = "streamer_record_age_at_train_seconds"
    assert value(m, f"{age}_count") == 1.0 and value(m, f"{age}_sum") == pytest.approx(3.0)
    # Only 1970s: the freshness stays unknown (0: the alert's "> 0" leaves it out).
    m.partitions_assigned([1])
    m.observe_trained([1], [0], [1_000], NOW)
    assert value(m, ts, **pl(1)) == 0.0
    assert value(m, "streamer_records_clock_skewed_total", topic=TOPIC) == 2.0


def test_a_partition_assigned_again_starts_at_what_was_known_not_at_zero() -> None:
    """The next pass (or a rebalance back) must not read as an empty partition trained in
    1970 until its first poll and step."""
    m = make_metrics()
    m.partitions_assigned([0])
    m.set_high_watermark(0, 5_000)
    now_ms = int(NOW * 1000)
    m.observe_trained([0], [999], [now_ms - 1000], NOW)
    m.partitions_revoked([0])
    assert value(m, "streamer_partition_high_watermark_offset", **pl(0)) is None  # no series
    m.partitions_assigned([0])
    ts = "streamer_partition_last_trained_timestamp_seconds"
    assert value(m, ts, **pl(0)) == pytest.approx(NOW - 1.0)
    assert value(m, "streamer_partition_high_watermark_offset", **pl(0)) == 5_000.0


def test_an_end_above_the_polled_watermark_counts_as_waiting_and_leaves_the_partition_behind() -> (
    None
):
    """A partition whose fetch stalled reports no new high watermark from its polls; the end
    the broker gives (ListOffsets, every 2 s) lifts it, so the lag counts the records waiting
    and, with nothing of it trained for 30 s, the partition is left behind."""
    import time

    registry = CollectorRegistry()
    m = Metrics("t", registry, version="0", tensorflow_version="0", kafka_python_version="0")
    m.partitions_assigned([0, 1])
    m.set_high_watermark(0, 100)
    m.observe_trained([0, 1], [99, 9], [-1, -1], 0.0)
    assert m.lag(0) == 0
    m.set_last_stable(0, 160)  # the broker's end: 60 records the polls never reported
    assert m.lag(0) == 60
    labels = {"topic": "t", "partition": "0"}
    assert registry.get_sample_value("streamer_partition_high_watermark_offset", labels) == 160
    m.set_high_watermark(0, 100)  # the next poll reports the stale watermark again
    assert m.lag(0) == 60
    later = time.monotonic() + 31
    assert m.left_behind(30, now=later) == {0: pytest.approx((31, 60), abs=1)}
    m.observe_trained([0], [120], [-1], 0.0)  # it trains again: its 30 s start over
    assert m.left_behind(30, now=time.monotonic() + 29) == {}
