"""The ``streamer`` command as a new user meets it: usage errors, start-up, ``lag``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import pytest

from streamer.replay import RANGE_FORMS
from streamer.tfstart import NO_GPU_NOISE, NOISE, nvidia_present
from tests.streamer.test_replay import streamer


def test_an_unknown_flag_shows_that_commands_usage() -> None:
    for command, extra in (("run", []), ("replay", ["--from", "earliest", "--to", "latest"])):
        out = streamer(command, *extra, "--no-such-flag", "1", timeout=60)
        assert out.returncode == 2
        assert out.stderr.startswith(f"usage: streamer {command} "), out.stderr[:300]
        assert f"streamer {command}: error: unrecognized arguments: --no-such-flag 1" in out.stderr


def test_replay_range_errors_exit_2_and_say_what_the_help_says() -> None:
    help_text = " ".join(streamer("replay", "--help", timeout=60).stdout.split())
    assert f"start of the range: {RANGE_FORMS}" in help_text
    assert f"end of the range, not included: {RANGE_FORMS}" in help_text
    cases = {
        ("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"): "must be after --from",
        ("1767225600000", "1767225600000"): "must be after --from",
        ("earliest", "earliest"): "must be after --from",
        ("latest", "latest"): "must be after --from",
        ("yesterday", "latest"): RANGE_FORMS,
        ("earliest", "tomorrow"): RANGE_FORMS,
    }
    for (lo, hi), message in cases.items():
        out = streamer("replay", "--bootstrap", "127.0.0.1:1", "--from", lo, "--to", hi, timeout=60)
        assert out.returncode == 2, (lo, hi, out.stderr[-1000:])
        assert message in out.stderr, (lo, hi, out.stderr[-1000:])
        assert "Traceback" not in out.stderr


def test_replay_takes_bootstrap_from_the_environment() -> None:
    """Honoured (not 'give --bootstrap', exit 2): it fails reaching that broker, exit 1."""
    out = streamer(
        "replay", "--from", "earliest", "--to", "latest",
        env={"STREAMER_BOOTSTRAP": "127.0.0.1:1"}, timeout=240,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert "no Kafka broker answered at 127.0.0.1:1" in out.stderr


def test_impossible_run_settings_fail_before_tensorflow_loads() -> None:
    for args, message in (
        (["--eval-topic", "held-out"], "eval_topic='held-out': needs --bootstrap"),
        (["--dead-letter-topic", "dlq"], "dead_letter_topic='dlq': needs --bootstrap"),
        (["--profile-steps", "5:10"], "needs --logdir"),
        (["--checkpoint-every-steps", "0"], "a positive integer"),
    ):
        out = streamer("run", *args, env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=120)
        assert out.returncode == 2, (args, out.stderr[-1000:])
        assert message in out.stderr, (args, out.stderr[-1000:])
        # PYTHONPROFILEIMPORTTIME lists every module imported: TensorFlow never was.
        assert not re.search(r"\|\s+tensorflow$", out.stderr, re.M), args


@pytest.mark.timeout(300)
def test_start_up_is_quiet_and_names_runtime_and_devices() -> None:
    out = streamer("run", "--max-steps", "5", "--metrics-port", "0", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stderr.splitlines()
    start = next(line for line in lines if "starting at step" in line)
    assert "shard_runtime=thread " in start  # the simulator's shards, not "auto"
    assert re.search(r" devices=(CPU|GPU:\d(,GPU:\d)*) ", start), start
    drop = NOISE if nvidia_present() else NOISE + NO_GPU_NOISE
    noise = [line for line in lines if any(p.search(line) for p in drop)]
    assert noise == [], noise
    # Only the worker's own lines: every line is a log record of ours.
    assert all(re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \w+ ", line) for line in lines), lines


@pytest.mark.kafka
def test_lag_of_an_unknown_group(kafka_bootstrap: str, make_topic: Callable[..., str]) -> None:
    topic = make_topic(2)
    from streamer.simulator import produce

    produce(kafka_bootstrap, topic, 100, partitions=2)
    group = f"nobody-{uuid.uuid4().hex[:8]}"
    out = streamer("lag", "--bootstrap", kafka_bootstrap, "--group", group, timeout=60)
    assert out.returncode == 1, out.stderr
    assert f"group '{group}' has no committed offsets (unknown group)" in out.stderr
    assert "TOTAL" not in out.stdout
    out = streamer(
        "lag", "--bootstrap", kafka_bootstrap, "--group", group, "--topic", topic, timeout=60
    )
    assert out.returncode == 0, out.stderr
    total = next(line for line in out.stdout.splitlines() if line.startswith("TOTAL"))
    assert total.split()[-1] == "100"
    assert (
        f"note: group '{group}' has no committed offsets on {topic} (unknown group): its lag is the whole topic"
        in out.stdout
    )
