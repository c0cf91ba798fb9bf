"""The ``streamer`` command as a new user meets it: usage errors, start-up, ``lag``."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from streamer.config.replay import RANGE_FORMS
from streamer.ops.tfstart import NO_GPU_NOISE, NOISE, nvidia_present
from tests.streamer.cli.test_replay import streamer


def test_an_unknown_flag_is_one_line_with_a_suggestion() -> None:
    for command, extra in (("run", []), ("replay", ["--from", "earliest", "--to", "latest"])):
        out = streamer(command, *extra, "--no-such-flag", "1", timeout=60)
        assert out.returncode == 2
        assert (
            f"streamer {command}: error: unrecognized arguments: --no-such-flag (and 1 value, "
            "not shown)" in out.stderr
        )
        assert len(out.stderr.splitlines()) <= 2, out.stderr  # not 59 lines of usage
    out = streamer("run", "--bootstrp", "127.0.0.1:1", timeout=60)
    assert out.returncode == 2
    assert "did you mean: --bootstrp -> --bootstrap?" in out.stderr, out.stderr


def test_a_password_given_as_a_flag_is_never_echoed_and_the_variables_are_named() -> None:
    for args in (("--sasl-password", "hunter2"), ("--sasl-password=hunter2",)):
        out = streamer("run", *args, timeout=60)
        assert out.returncode == 2
        assert "hunter2" not in out.stderr + out.stdout
        assert "STREAMER_SASL_PASSWORD_FILE" in out.stderr, out.stderr
        assert "--pass-records" not in out.stderr  # no look-alike flag for a secret


def test_a_tls_client_at_a_plaintext_listener_is_told_to_check_the_protocol(
    kafka_bootstrap: str,
) -> None:
    out = streamer(
        "lag", "--bootstrap", kafka_bootstrap, "--group", "g", "--topic", "t",
        "--security-protocol", "SSL", timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "speaks SSL (--security-protocol" in out.stderr, out.stderr


def test_no_abbreviations_booleans_as_plain_flags_and_enums_in_any_case() -> None:
    out = streamer("run", "--max-step", "10", timeout=60)
    assert out.returncode == 2 and "--max-steps" in out.stderr, out.stderr
    out = streamer(
        "run", "--jit-compile", "--no-mixed-precision", "--log-level", "info",
        "--auto-offset-reset", "LATEST", "--print-config", timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}
    assert rows["jit_compile"] == ["True", "--jit-compile"]
    assert rows["mixed_precision"] == ["False", "--mixed-precision"]  # the flag pair
    assert rows["log_level"] == ["INFO", "--log-level"]
    assert rows["auto_offset_reset"] == ["latest", "--auto-offset-reset"]
    help_text = " ".join(streamer("run", "--help", timeout=60).stdout.split())
    assert "--jit-compile, --no-jit-compile" in help_text
    assert "env STREAMER_JIT_COMPILE=true|false; TOML jit_compile = true|false" in help_text


def test_print_config_shows_each_setting_and_where_it_came_from(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('topic = "from-file"\nshards = 3\n', encoding="utf-8")
    out = streamer(
        "run", "--config", str(config), "--shards", "5", "--print-config",
        env={"STREAMER_BATCH_SIZE": "64", "STREAMER_SASL_PASSWORD": "hunter2-secret"},
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}
    assert rows["topic"] == ["from-file", str(config)]
    assert rows["shards"] == ["5", "--shards"]
    assert rows["batch_size"] == ["64", "STREAMER_BATCH_SIZE"]
    assert rows["sasl_password"] == ["***", "STREAMER_SASL_PASSWORD"]
    assert rows["learning_rate"] == ["0.001", "default"]
    assert "hunter2-secret" not in out.stdout + out.stderr


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
        "replay", "--from", "earliest", "--to", "latest", "--broker-wait-seconds", "3",
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
    from streamer.input.simulator import produce

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


@pytest.mark.kafka
def test_lag_and_reset_group_read_the_connection_from_the_environment(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    """STREAMER_BOOTSTRAP (and --config) reach every command that talks to Kafka."""
    topic = make_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    env = {"STREAMER_BOOTSTRAP": kafka_bootstrap}
    out = streamer("simulate", "--topic", topic, "--records", "50", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "produced 50 records" in out.stderr  # off a terminal, a summary line
    out = streamer("lag", "--group", group, "--topic", topic, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    out = streamer("reset-group", "--group", group, "--topic", topic, "--to", "latest", env=env)
    assert out.returncode == 0 and "dry run" in out.stdout, out.stderr
    out = streamer("lag", "--group", group, timeout=60)
    assert out.returncode == 2 and "STREAMER_BOOTSTRAP" in out.stderr, out.stderr


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_simulate_tells_the_truth_off_a_terminal_and_on_ctrl_c(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    """Off a terminal: a progress line every 10 s; Ctrl-C: the records it holds sent, a
    summary with the count the topic really got, exit 130; ``--partitions`` that an
    existing topic does not have: a warning that says so."""
    import os
    import signal
    import subprocess
    import sys

    from tests.workerutil import end_offsets

    topic = make_topic(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env.update(PYTHONUNBUFFERED="1", STREAMER_BOOTSTRAP=kafka_bootstrap)
    args = ["simulate", "--topic", topic, "--records", "0", "--rate", "2000", "--partitions", "4"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamer.cli", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's default action, also where the suite runs as a background job of a script
        # (``cmd &`` ignores SIGINT, and the child would inherit that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Past the first 10 s progress line, counted from the first record (start-up, the
        # imports and the connection, took over 3 s on a loaded CI machine).
        deadline = time.monotonic() + 60
        while not sum(end_offsets(kafka_bootstrap, topic).values()):
            assert time.monotonic() < deadline and proc.poll() is None, "nothing produced"
            time.sleep(0.2)
        time.sleep(11.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert f"topic {topic} exists with 2 partitions: --partitions 4 applies only" in err, err
    assert re.search(rf"produced [\d,]+ records to {topic} \(\d+/s\)", err), err
    summary = re.search(rf"interrupted \(Ctrl-C\): produced ([\d,]+) records to {topic}", err)
    assert summary, err
    sent = int(summary.group(1).replace(",", ""))
    assert sent >= 10_000, err  # 2,000/s for 11.5 s
    assert sum(end_offsets(kafka_bootstrap, topic).values()) == sent
    assert "Traceback" not in err and "of 4,611" not in err, err


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_a_topic_typo_ends_after_the_topic_wait_naming_the_topic_meant(
    kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(1, prefix="samples")
    typo = topic[0] + topic[2] + topic[1] + topic[3:]  # "smaples-..."
    t0 = time.monotonic()
    out = streamer(
        "run", "--bootstrap", kafka_bootstrap, "--topic", typo, "--topic-wait-seconds", "3",
        "--metrics-port", "0", timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert f"topic '{typo}' does not exist (waited" in out.stderr, out.stderr
    assert f"topics of a similar name exist: {topic}" in out.stderr, out.stderr
    assert time.monotonic() - t0 < 60


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_a_missing_topic_is_one_clear_error_for_the_operations_tools(kafka_bootstrap: str) -> None:
    """lag, reset-group and replay: exit 1 at once, one line naming the topic and the fix.
    (``run`` waits for its topic by design: not ready until it exists, docs/explanation/reliability.md.)"""
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    env = {"STREAMER_BOOTSTRAP": kafka_bootstrap}
    for command in (
        ["lag", "--group", "g", "--topic", missing],
        ["reset-group", "--group", "g", "--topic", missing, "--to", "latest"],
        ["replay", "--topic", missing, "--from", "earliest", "--to", "latest"],
    ):
        t0 = time.monotonic()
        out = streamer(*command, env=env, timeout=120)
        elapsed = time.monotonic() - t0
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 1, (command[0], out.stderr)
        assert f"topic '{missing}' does not exist; create it or fix --topic" in out.stderr
        assert "Traceback" not in out.stderr and len(lines) <= 2, (command[0], out.stderr)
        assert elapsed < 60, (command[0], elapsed)


def test_replay_help_lists_only_what_replay_uses() -> None:
    help_text = streamer("replay", "--help", timeout=60).stdout
    for used in ("--from", "--to", "--checkpoint-dir", "--bootstrap", "--batch-size"):
        assert used in help_text, used
    for unused in (
        "--eval-topic",
        "--sim-rate",
        "--stop-after-idle",
        "--cluster-workers",
        "--group ",
    ):
        assert unused not in help_text, unused


_OURS = re.compile(r"^\d{4}-\d\d-\d\d \S+ (WARNING|ERROR|CRITICAL) ")


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "command",
    [
        ["run", "--metrics-port", "0", "--broker-wait-seconds", "6"],
        ["replay", "--from", "earliest", "--to", "latest", "--broker-wait-seconds", "6"],
        ["simulate", "--topic", "t", "--records", "10"],
        ["lag", "--group", "g"],
        ["reset-group", "--group", "g", "--topic", "t", "--to", "earliest"],
    ],
    ids=lambda c: c[0],
)
def test_no_broker_is_one_clear_error_in_bounded_time(command: list[str]) -> None:
    """Every command that talks to Kafka, with nothing listening: exit 1 within its bound,
    one error line that names the address, and no library noise before it."""
    t0 = time.monotonic()
    out = streamer(*command, "--bootstrap", "127.0.0.1:1", timeout=300)
    took = time.monotonic() - t0
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [x for x in out.stderr.splitlines() if _OURS.match(x) or x.startswith("streamer: ")]
    final = [x for x in errors if "no Kafka broker answered at 127.0.0.1:1" in x]
    assert final, out.stderr[-3000:]
    assert len(errors) <= 2, errors  # the worker's ERROR line and the CLI's, at most
    assert "Traceback" not in out.stderr and "kafka." not in out.stderr, out.stderr[-3000:]
    assert took < 60, took


def test_a_kafka_clients_own_error_in_a_tool_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An error no layer typed (here the coordinator of a fresh broker, still after the
    retries) ends ``streamer lag`` with one line naming it and exit 1, not a traceback."""
    import kafka.errors as kerrors

    import consumers.admin
    from streamer.cli.commands import main

    def unready(*_: object, **__: object) -> None:
        raise kerrors.CoordinatorNotAvailableError("GROUP/trainer")

    monkeypatch.setattr(consumers.admin, "group_lag", unready)
    code = main(["lag", "--bootstrap", "127.0.0.1:9", "--group", "trainer"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "CoordinatorNotAvailableError" in err and "try again" in err, err


def test_an_error_of_ours_still_comes_out_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import consumers.admin
    from streamer.cli.commands import main

    def bug(*_: object, **__: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(consumers.admin, "group_lag", bug)
    with pytest.raises(ZeroDivisionError):
        main(["lag", "--bootstrap", "127.0.0.1:9", "--group", "trainer"])


def test_the_other_commands_take_their_enumerations_in_any_case() -> None:
    from streamer.cli.commands import parsers

    parser, _ = parsers()
    args = parser.parse_args(["lag", "--group", "g", "--isolation-level", "READ_UNCOMMITTED"])
    assert args.isolation_level == "read_uncommitted"
    args = parser.parse_args(
        ["simulate", "--topic", "t", "--task", "Recommender", "--compression", "ZSTD"]
    )
    assert (args.task, args.compression) == ("recommender", "zstd")
    args = parser.parse_args(["bench", "--bootstrap", "b", "--soak-client", "Confluent"])
    assert args.soak_client == "confluent"
