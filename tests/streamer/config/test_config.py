"""Settings: defaults < TOML file < STREAMER_* environment < flags, validation, secrets, --help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.clients.kafka_python import consumer_config
from consumers.errors import ConfigError
from consumers.settings import ConsumerSettings, Secret, SecuritySettings
from streamer.config import OPTIONS, load_config


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "worker.toml"
    cfg.write_text('topic = "from-file"\nbatch_size = 64\nshards = 3\n')
    env = {"STREAMER_CONFIG": str(cfg), "STREAMER_BATCH_SIZE": "128"}
    c = load_config({"shards": "5"}, env=env)
    assert c.topic == "from-file"  # file
    assert c.batch_size == 128  # env beats file
    assert c.shards == 5  # flag beats env and file
    assert c.group == "streamer"  # default


@pytest.mark.parametrize(
    ("args", "env", "setting"),
    [
        ({"shards": "0"}, {}, "shards"),
        ({"batch_size": "many"}, {}, "batch_size"),
        ({}, {"STREAMER_METRICS_PORT": "70000"}, "metrics_port"),
        ({}, {"STREAMER_BOGUS": "1"}, "STREAMER_BOGUS"),
        ({"dead_letter_topic": "dlq"}, {}, "dead_letter_topic"),  # needs --bootstrap
        ({"bootstrap": "not an address"}, {}, "bootstrap_servers"),
        (
            {"bootstrap": "127.0.0.1:9092", "topic": "t", "dead_letter_topic": "t"},
            {},
            "dead_letter_topic",
        ),
        ({"schema": "/nonexistent/schema.toml"}, {}, "schema"),
        ({"model": "no_colon_here"}, {}, "model"),
        ({"auto_offset_reset": "sometimes"}, {}, "auto_offset_reset"),
        ({"eval_every_seconds": "0"}, {}, "eval_every_seconds"),
        ({}, {"STREAMER_EVAL_EVERY_SECONDS": "-5"}, "eval_every_seconds"),
        ({"eval_every_seconds": "nan"}, {}, "eval_every_seconds"),
        ({"eval_every_steps": "0"}, {}, "eval_every_steps"),
    ],
)
def test_invalid_settings_name_the_setting(
    args: dict[str, str], env: dict[str, str], setting: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(args, env=env)
    assert info.value.setting == setting
    assert setting in str(info.value)


def test_eval_every_seconds_is_optional_next_to_eval_every_steps() -> None:
    default = load_config({}, env={})
    assert (default.eval_every_steps, default.eval_every_seconds) == (500, None)
    both = load_config({"eval_every_seconds": "30"}, env={"STREAMER_EVAL_EVERY_STEPS": "200"})
    assert (both.eval_every_steps, both.eval_every_seconds) == (200, 30.0)


def test_unknown_key_in_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "worker.toml"
    cfg.write_text("batch_sise = 12\n")
    with pytest.raises(ConfigError, match="batch_sise"):
        load_config({"config": str(cfg)}, env={})


def test_secrets_come_from_env_or_file_and_never_show(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cr3t-pw\n")
    env = {"STREAMER_SASL_PASSWORD_FILE": str(pw)}
    c = load_config(
        {
            "bootstrap": "127.0.0.1:9092",
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "alice",
        },
        env=env,
    )
    assert c.sasl_password == Secret("s3cr3t-pw")
    cs = c.consumer_settings()
    assert consumer_config(cs, 0)["sasl_plain_password"] == "s3cr3t-pw"
    for text in (repr(c), str(c.describe()), repr(cs), str(cs.describe()), repr(cs.security)):
        assert "s3cr3t-pw" not in text


def test_sasl_without_password_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="password"):
        SecuritySettings(
            security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_plain_username="a"
        )


def test_consumer_settings_never_auto_commit_and_static_split() -> None:
    cs = ConsumerSettings(
        bootstrap_servers="127.0.0.1:9092",
        topic="t",
        mode="static",
        partitions=(0, 1, 2, 3, 4),
        num_shards=2,
    )
    assert consumer_config(cs, 0)["enable_auto_commit"] is False
    assert cs.static_partitions(0, 2) == [0, 2, 4]
    assert cs.static_partitions(1, 2) == [1, 3]


def test_help_documents_every_option_with_default() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "streamer.cli", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    flat = " ".join(out.split())
    for opt in OPTIONS:
        assert opt.flag in out, opt.flag
        assert opt.env in flat, opt.env
    assert flat.count("default:") >= len(OPTIONS)
    assert "PASSWORD" not in out.replace("STREAMER_SASL_PASSWORD", "").replace(
        "STREAMER_SSL_PASSWORD", ""
    )


def test_cli_reports_config_errors_with_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "streamer.cli", "run", "--shards", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "shards" in proc.stderr


CHECK_BEFORE_TENSORFLOW = """
import sys
from streamer.cli import main
code = main(sys.argv[1:])
print("exit", code, "tensorflow loaded:", "tensorflow" in sys.modules)
"""


def test_a_wrong_model_or_a_bad_schema_with_a_model_fails_before_tensorflow_loads(
    tmp_path: Path,
) -> None:
    """Both used to be found after TensorFlow loaded (5-9 s), the schema after the metrics
    server had bound its port."""
    bad_schema = tmp_path / "bad.toml"
    bad_schema.write_text('label = "y"\n[features.y]\ndtype = "float128"\n')
    for args, said in (
        (["--model", "no_such_package.models:build"], "no module 'no_such_package'"),
        (["--model", "examples.keras_model:build", "--schema", str(bad_schema)], "float128"),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", CHECK_BEFORE_TENSORFLOW, "run", *args],
            cwd=Path(__file__).resolve().parents[3],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "exit 2 tensorflow loaded: False" in proc.stdout, proc.stdout + proc.stderr
        assert said in proc.stderr, proc.stderr


def test_shard_runtime_auto_picks_processes_only_with_shards_and_cores_to_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from streamer.config import resolve_shard_runtime

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert resolve_shard_runtime("auto", 4) == "process"
    assert resolve_shard_runtime("auto", 1) == "thread"
    assert resolve_shard_runtime("thread", 4) == "thread"
    assert resolve_shard_runtime("process", 1) == "process"
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    assert resolve_shard_runtime("auto", 4) == "thread"


def test_shard_runtime_auto_says_why_and_gives_confluent_processes_from_4_cores() -> None:
    from streamer.config import shard_runtime_choice

    assert shard_runtime_choice("auto", 4, "confluent", cores=2) == (
        "thread",
        "auto: 2 usable cores, confluent shard processes pay from 4",
    )
    runtime, why = shard_runtime_choice("auto", 4, "confluent", cores=16)
    assert runtime == "process" and "4 shards on 16 usable cores" in why
    assert shard_runtime_choice("auto", 4, "kafka-python", cores=2)[0] == "process"
    assert shard_runtime_choice("auto", 1, "confluent", cores=16)[0] == "thread"
    assert shard_runtime_choice("process", 1, "confluent", cores=1) == ("process", "as set")


def test_a_schema_the_builtin_model_cannot_take_fails_at_start_up_with_exit_2(
    tmp_path: Path,
) -> None:
    schema = tmp_path / "kinds.toml"
    schema.write_text(
        'label = "y"\n[features.user]\ndtype = "string"\n'
        '[features.items]\ndtype = "int64"\nshape = [-1]\n[features.y]\ndtype = "float32"\n'
    )
    for args in (["--schema", str(schema)], ["--sim-task", "recommender"]):
        proc = subprocess.run(
            [sys.executable, "-m", "streamer.cli", "run", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert "built-in model takes numeric fixed-shape features only" in proc.stderr
        assert "items (int64[-1])" in proc.stderr and "--model" in proc.stderr


def test_sim_task_names_the_embedded_simulators_schema() -> None:
    cfg = load_config({"sim_task": "recommender", "model": "examples.recommender:build"}, env={})
    schema = cfg.load_schema()
    assert schema.feature("items").is_ragged and schema.feature("user").is_string
    assert load_config({}, env={}).load_schema().feature_names == ("x", "y")
    with pytest.raises(ConfigError, match="sim_task"):
        load_config({"sim_task": "chess"}, env={})


def test_confluent_client_without_its_package_fails_at_start_up_naming_the_extra() -> None:
    # A fresh interpreter where confluent_kafka cannot be imported (as without the extra).
    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "confluent_kafka" or name.startswith("confluent_kafka."):
            raise ImportError("No module named 'confluent_kafka'")
sys.meta_path.insert(0, Block())
from streamer.cli.commands import main
sys.exit(main(["run", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--kafka-client",
               "confluent", "--max-steps", "1"]))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    # This test runs from a checkout: the hint installs the extra into it.
    from consumers.install import source_checkout

    assert f"pip install -e '{source_checkout()}[confluent]'" in proc.stderr, proc.stderr
    assert "tensorflow" not in proc.stderr.lower(), "failed only after TensorFlow loaded"


@pytest.mark.parametrize(
    ("toml", "setting", "allowed"),
    [
        ("topic = 5", "topic", "a string"),
        ("shards = 2.7", "shards", "an integer"),
        ("batch_size = true", "batch_size", "an integer"),
        ("partitions = [1.9, 0.2]", "partitions", "a list of integers"),
        ('partitions = "0,1"', "partitions", "a list of integers"),
        ("learning_rate = nan", "learning_rate", "a finite number"),
        ("idle_timeout = inf", "idle_timeout", "a finite number"),
        ('jit_compile = "yes"', "jit_compile", "true or false"),
    ],
)
def test_every_toml_value_is_type_checked_never_truncated(
    tmp_path: Path, toml: str, setting: str, allowed: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config({"config": str(path)}, env={})
    assert info.value.setting == setting and allowed in info.value.allowed


@pytest.mark.parametrize(
    ("env", "setting", "allowed"),
    [
        ({"STREAMER_LEARNING_RATE": "nan"}, "learning_rate", "a finite number"),
        ({"STREAMER_IDLE_TIMEOUT": "inf"}, "idle_timeout", "a finite number"),
        ({"STREAMER_SHARDS": "2.7"}, "shards", "an integer"),
        ({"STREAMER_PARTITIONS": "1.9,0"}, "partitions", "comma-separated list"),
    ],
)
def test_every_environment_value_is_type_checked(
    env: dict[str, str], setting: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({}, env=env)
    assert info.value.setting == setting and allowed in info.value.allowed


def test_an_unknown_key_never_echoes_its_value_and_suggests(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('sasl_password = "hunter2-secret"\nbatchsize = 3\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config({"config": str(path)}, env={})
    assert "hunter2-secret" not in str(info.value)
    assert "STREAMER_SASL_PASSWORD" in str(info.value)
    path.write_text("batchsize = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="did you mean batch_size"):
        load_config({"config": str(path)}, env={})
    with pytest.raises(ConfigError, match="did you mean STREAMER_BATCH_SIZE"):
        load_config({}, env={"STREAMER_BATCHSIZE": "3"})


def test_enumerations_are_case_insensitive() -> None:
    config = load_config({"log_level": "info", "auto_offset_reset": "EARLIEST"}, env={})
    assert (config.log_level, config.auto_offset_reset) == ("INFO", "earliest")
