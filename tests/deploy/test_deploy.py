"""Consistency of deploy/: files parse, references resolve, ports/probes/metrics/env agree."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = DEPLOY / "docker" / "Dockerfile.dockerignore"
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_CLUSTER = DEPLOY / "compose-cluster.yaml"
K8S = DEPLOY / "kubernetes"
K8S_MW = K8S / "multiworker"
PROMETHEUS_DIR = DEPLOY / "prometheus"
GRAFANA_DIR = DEPLOY / "grafana"

METRICS_PORT = 9464
HTTP_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

# Every metric the worker exports (DESIGN section 5), full exposition names, by type.
METRICS: dict[str, str] = {
    "streamer_records_polled_total": "counter",
    "streamer_bytes_polled_total": "counter",
    "streamer_records_decoded_total": "counter",
    "streamer_samples_trained_total": "counter",
    "streamer_train_steps_total": "counter",
    "streamer_decode_errors_total": "counter",
    "streamer_records_dead_lettered_total": "counter",
    "streamer_partition_high_watermark_offset": "gauge",
    "streamer_partition_position_offset": "gauge",
    "streamer_partition_trained_offset": "gauge",
    "streamer_partition_committed_offset": "gauge",
    "streamer_consumer_lag_records": "gauge",
    "streamer_partition_last_trained_timestamp_seconds": "gauge",
    "streamer_record_age_at_train_seconds": "histogram",
    "streamer_queue_depth_records": "gauge",
    "streamer_queue_capacity_records": "gauge",
    "streamer_paused_partitions": "gauge",
    "streamer_input_wait_seconds": "histogram",
    "streamer_train_step_seconds": "histogram",
    "streamer_last_poll_timestamp_seconds": "gauge",
    "streamer_offset_commits_total": "counter",
    "streamer_commit_duration_seconds": "histogram",
    "streamer_rebalances_total": "counter",
    "streamer_assigned_partitions": "gauge",
    "streamer_kafka_errors_total": "counter",
    "streamer_checkpoints_total": "counter",
    "streamer_last_checkpoint_timestamp_seconds": "gauge",
    "streamer_eval_loss": "gauge",
    "streamer_eval_metric": "gauge",
    "streamer_model_loss": "gauge",
    "streamer_train_metric": "gauge",
    "streamer_nonfinite_steps_total": "counter",
    "streamer_build_info": "gauge",
    "streamer_padded_rows_total": "counter",
    "streamer_idle_steps_total": "counter",
    "streamer_rollbacks_total": "counter",
    "streamer_cluster_workers": "gauge",
}
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# `streamer run` options (flag --x-y, env STREAMER_X_Y, config key x_y).
RUN_OPTIONS: tuple[str, ...] = (
    "bootstrap", "topic", "group", "worker-id", "partitions", "shards", "batch-size", "schema",
    "model", "checkpoint-dir", "checkpoint-every-steps", "checkpoint-every-seconds",
    "commit-every-steps", "commit-every-seconds", "metrics-host", "metrics-port",
    "dead-letter-topic", "max-steps", "stop-after-idle", "shutdown-timeout", "audit-log",
    "auto-offset-reset", "security-protocol", "sasl-mechanism", "sasl-username", "ssl-cafile",
    "ssl-certfile", "ssl-keyfile", "log-level", "log-format", "config",
    "cluster-workers", "worker-index", "pad-after-seconds", "peer-stop-exit-code",
    "stall-timeout",
)  # fmt: skip
SIMULATE_OPTIONS: tuple[str, ...] = (
    "bootstrap", "topic", "records", "partitions", "rate", "record-bytes", "seed", "log-level",
)  # fmt: skip
# Secrets: environment only, never flags or config keys.
SECRET_ENV_VARS: tuple[str, ...] = (
    "STREAMER_SASL_PASSWORD",
    "STREAMER_SASL_PASSWORD_FILE",
    "STREAMER_SSL_PASSWORD",
    "STREAMER_SSL_PASSWORD_FILE",
)


def documented_env_vars() -> frozenset[str]:
    """Every STREAMER_* variable the worker reads (to be replaced by the CLI's option table)."""
    from_options = {"STREAMER_" + name.upper().replace("-", "_") for name in RUN_OPTIONS}
    return frozenset(from_options | set(SECRET_ENV_VARS))


# --------------------------------------------------------------------------------------------
# Helpers


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _deploy_files(*suffixes: str) -> list[Path]:
    """Files under deploy/ (deploy/local/ is the test broker, not deployment) by suffix."""
    return sorted(
        p
        for p in DEPLOY.rglob("*")
        if p.is_file() and p.suffix in suffixes and "local" not in p.relative_to(DEPLOY).parts[:1]
    )


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@cache
def _compose() -> dict[str, Any]:
    data = _load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


@cache
def _k8s(kind: str) -> dict[str, Any]:
    """The one object of ``kind`` in deploy/kubernetes/."""
    found = [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("kind") == kind
    ]
    assert len(found) == 1, f"expected one {kind} in {_rel(K8S)}, found {len(found)}"
    return found[0]


def _worker_container() -> dict[str, Any]:
    containers = _k8s("StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _configmap() -> dict[str, str]:
    data: dict[str, str] = _k8s("ConfigMap")["data"]
    return data


def _seconds(value: object) -> float:
    """'25', 25, '25s', '1m30s' -> seconds."""
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {value!r}"
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def _env_dict(env: object) -> dict[str, str]:
    """Compose `environment` as a mapping (it may be a list of KEY=VALUE)."""
    if env is None:
        return {}
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    assert isinstance(env, list)
    return dict(str(item).split("=", 1) for item in env)


def _flags(args: list[str]) -> dict[str, str | None]:
    """--name value / --name=value pairs of a command line (values None for bare flags)."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            name, value = arg[2:].split("=", 1)
            out[name] = value
        elif i < len(args) and not args[i].startswith("--"):
            out[arg[2:]] = args[i]
            i += 1
        else:
            out[arg[2:]] = None
    return out


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _compose_mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(source, target) of every volume of a compose service, short or long syntax."""
    for vol in service.get("volumes", []):
        if isinstance(vol, dict):
            yield str(vol.get("source", "")), str(vol["target"])
        else:
            source, target = str(vol).split(":")[:2]
            yield source, target


def _is_path(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def _instruction_args(rest: str) -> list[str]:
    rest = rest.strip()
    if rest.startswith("["):
        args = json.loads(rest)
        assert isinstance(args, list)
        return [str(a) for a in args]
    return shlex.split(rest)


def _dockerignore_excludes(path: str) -> bool:
    """Whether deploy/docker/Dockerfile.dockerignore keeps ``path`` out of the build context."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, pat) for prefix in prefixes):
            excluded = not negate
    return excluded


def _rule_exprs() -> list[tuple[str, str]]:
    rules = _load_yaml(PROMETHEUS_DIR / "alerts.yml")
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def _alert_rules() -> list[dict[str, Any]]:
    rules = _load_yaml(PROMETHEUS_DIR / "alerts.yml")
    return [r for g in rules["groups"] for r in g["rules"]]


def _dashboard() -> dict[str, Any]:
    data = json.loads((GRAFANA_DIR / "dashboard.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _dashboard_panels() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in _dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return out


def _dashboard_exprs() -> list[tuple[str, str]]:
    exprs = [
        (panel.get("title", "?"), target["expr"])
        for panel in _dashboard_panels()
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    for var in _dashboard()["templating"]["list"]:
        query = var.get("query")
        if var.get("type") == "query":
            text = query.get("query", "") if isinstance(query, dict) else str(query)
            exprs.append((f"variable {var['name']}", text))
    return exprs


def _metric_names(expr: str) -> set[str]:
    names = set()
    for name in re.findall(r"streamer_[a-z_]+", expr):
        for suffix in _HISTOGRAM_SUFFIXES:
            base = name.removesuffix(suffix)
            if base != name and METRICS.get(base) == "histogram":
                name = base
                break
        names.add(name)
    return names


# --------------------------------------------------------------------------------------------
# Every file parses


@pytest.mark.parametrize(
    "path", _deploy_files(".yml", ".yaml"), ids=lambda p: str(p.relative_to(DEPLOY))
)
def test_yaml_parses(path: Path) -> None:
    docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    assert docs and all(doc is not None for doc in docs), f"{_rel(path)}: empty YAML document"


@pytest.mark.parametrize("path", _deploy_files(".json"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_json_parses(path: Path) -> None:
    json.loads(path.read_text(encoding="utf-8"))


def test_expected_files_exist() -> None:
    expected = [
        DOCKERFILE,
        DOCKERIGNORE,
        COMPOSE,
        COMPOSE_CLUSTER,
        DEPLOY / "README.md",
        PROMETHEUS_DIR / "prometheus.yml",
        PROMETHEUS_DIR / "alerts.yml",
        PROMETHEUS_DIR / "alerts_test.yml",
        GRAFANA_DIR / "dashboard.json",
        *(
            K8S / name
            for name in (
                "kustomization.yaml",
                "configmap.yaml",
                "secret.yaml",
                "statefulset.yaml",
                "service.yaml",
                "podmonitor.yaml",
                "networkpolicy.yaml",
            )
        ),
    ]
    missing = [_rel(p) for p in expected if not p.is_file()]
    assert not missing, f"missing deploy files: {missing}"


# --------------------------------------------------------------------------------------------
# References resolve


def test_compose_bind_mounts_and_build_exist() -> None:
    compose = _compose()
    named = set((compose.get("volumes") or {}).keys())
    for name, service in compose["services"].items():
        for source, _target in _compose_mounts(service):
            if _is_path(source):
                path = (COMPOSE.parent / source).resolve()
                assert path.exists(), f"compose service {name}: {source} does not exist"
                assert path.is_relative_to(ROOT), (
                    f"compose service {name}: {source} is outside the repo"
                )
            else:
                assert source in named, f"compose service {name}: volume {source!r} is not declared"
        build = service.get("build")
        if build is not None:
            build = {"context": build} if isinstance(build, str) else build
            context = (COMPOSE.parent / build.get("context", ".")).resolve()
            assert context == ROOT, f"compose service {name}: build context must be the repo root"
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert dockerfile.resolve() == DOCKERFILE.resolve()


def test_compose_cluster_is_three_voters_of_one_cluster() -> None:
    """compose-cluster.yaml: node ids 1..3, one voters line naming every service's controller
    port, one cluster id, replication 3 with min ISR 2, a distinct host port per node."""
    services = _load_yaml(COMPOSE_CLUSTER)["services"]
    assert len(services) == 3
    envs = {name: service["environment"] for name, service in services.items()}
    voters = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in envs.values()}
    assert len(voters) == 1
    expected = ",".join(
        f"{env['KAFKA_NODE_ID']}@{services[name]['hostname']}:9093" for name, env in envs.items()
    )
    assert voters == {expected}
    assert sorted(env["KAFKA_NODE_ID"] for env in envs.values()) == [1, 2, 3]
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1
    host_ports = set()
    for name, env in envs.items():
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == 3
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 3
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == 2
        (published,) = services[name]["ports"]
        host, port, _container = published.split(":")
        assert host == "127.0.0.1"
        assert f"HOST://localhost:{port}" in env["KAFKA_ADVERTISED_LISTENERS"]
        host_ports.add(port)
        (mount,) = services[name]["volumes"]
        assert mount.split(":")[0] in _load_yaml(COMPOSE_CLUSTER)["volumes"]
    assert len(host_ports) == 3


def test_compose_depends_on_known_services() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        deps = service.get("depends_on", [])
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"compose service {name} depends on unknown service {dep}"


def test_dockerfile_copy_sources_exist_and_reach_the_context() -> None:
    copies = [args for word, args in _dockerfile_instructions() if word in ("COPY", "ADD")]
    assert copies, "the Dockerfile copies nothing"
    for rest in copies:
        args = _instruction_args(rest)
        if any(a.startswith("--from") for a in args):
            continue
        sources = [a for a in args if not a.startswith("--")][:-1]
        assert sources, f"COPY without a source: {rest}"
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"Dockerfile COPY {source}: not in the repository"
            assert not _dockerignore_excludes(source.rstrip("/")), (
                f"Dockerfile COPY {source}: excluded by {_rel(DOCKERIGNORE)}"
            )
            if path.is_dir():
                for py in path.rglob("*.py"):
                    rel = str(py.relative_to(ROOT))
                    if "__pycache__" not in rel:
                        assert not _dockerignore_excludes(rel), f"{rel} excluded from the context"


def test_dockerignore_keeps_local_state_out() -> None:
    for path in (".venv/bin/python", ".local-kafka/data", ".git/HEAD", "tests/conftest.py"):
        assert _dockerignore_excludes(path), f"{path} would be sent to the Docker daemon"


def test_dockerfile_runtime_contract() -> None:
    instructions = _dockerfile_instructions()
    by_word: dict[str, list[str]] = {}
    for word, rest in instructions:
        by_word.setdefault(word, []).append(rest)
    assert _instruction_args(by_word["ENTRYPOINT"][-1]) == ["streamer"]
    assert _instruction_args(by_word["CMD"][-1]) == ["run"]
    assert by_word["STOPSIGNAL"][-1].strip() == "SIGTERM"
    assert str(METRICS_PORT) in by_word["EXPOSE"][-1].split()
    user = by_word["USER"][-1].split(":")[0]
    assert user not in ("0", "root"), "the image must not run as root"
    envs = " ".join(by_word["ENV"])
    assert re.search(r"\bSTREAMER_METRICS_HOST=0\.0\.0\.0\b", envs)
    healthcheck = by_word["HEALTHCHECK"][-1]
    assert "/healthz" in healthcheck and "urllib" in healthcheck
    assert re.search(r"\bARG VARIANT\b", "\n".join(f"{w} {r}" for w, r in instructions))
    assert instructions[0][0] in ("ARG", "FROM")
    assert any(
        "python:" in rest and "-slim" in rest for word, rest in instructions if word == "FROM"
    )


def test_kustomization_resources_exist() -> None:
    kustomization = _load_yaml(K8S / "kustomization.yaml")
    resources = kustomization["resources"]
    for resource in resources:
        assert (K8S / resource).is_file(), f"kustomization resource {resource} does not exist"
    listed = {Path(r).name for r in resources}
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == listed, f"manifests not listed in kustomization.yaml: {on_disk - listed}"


def test_prometheus_rule_files_exist_here_and_in_the_container() -> None:
    config = _load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    rule_files = config["rule_files"]
    assert rule_files
    prometheus = _compose()["services"]["prometheus"]
    targets = {target: source for source, target in _compose_mounts(prometheus)}
    config_target = next(
        t for t, s in targets.items() if (COMPOSE.parent / s).resolve().name == "prometheus.yml"
    )
    for rule_file in rule_files:
        assert (PROMETHEUS_DIR / rule_file).is_file(), f"rule file {rule_file} does not exist"
        in_container = str(PurePosixPath(config_target).parent / rule_file)
        assert in_container in targets, f"compose does not mount {rule_file} at {in_container}"
        assert (COMPOSE.parent / targets[in_container]).resolve() == (
            PROMETHEUS_DIR / rule_file
        ).resolve()
    tests = _load_yaml(PROMETHEUS_DIR / "alerts_test.yml")
    for rule_file in tests["rule_files"]:
        assert (PROMETHEUS_DIR / rule_file).is_file()


def test_prometheus_scrapes_the_compose_worker() -> None:
    config = _load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "streamer" in jobs, 'alerts and dashboard select job="streamer"'
    targets = [t for sc in jobs["streamer"]["static_configs"] for t in sc["targets"]]
    services = _compose()["services"]
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert host in services, f"scrape target {target}: no compose service {host}"
        env = _env_dict(services[host].get("environment"))
        assert int(port) == int(env.get("STREAMER_METRICS_PORT", METRICS_PORT)) == METRICS_PORT


def test_grafana_provisioning_paths() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = [
        (COMPOSE.parent / s, PurePosixPath(t)) for s, t in _compose_mounts(grafana) if _is_path(s)
    ]
    prov = next(t for s, t in mounts if s.resolve() == (GRAFANA_DIR / "provisioning").resolve())
    assert str(prov) == "/etc/grafana/provisioning"
    providers = _load_yaml(GRAFANA_DIR / "provisioning" / "dashboards" / "dashboards.yml")[
        "providers"
    ]
    for provider in providers:
        path = PurePosixPath(provider["options"]["path"])
        mounted = [s for s, t in mounts if t == path or t.parent == path]
        assert mounted, f"dashboard provider path {path} is not mounted in the grafana service"
        assert any(s.resolve() == (GRAFANA_DIR / "dashboard.json").resolve() for s in mounted)
    datasources = _load_yaml(GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = datasources["datasources"]
    host = re.match(r"https?://([^:/]+)", source["url"])
    assert host and host.group(1) in _compose()["services"]
    ds_var = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "DS_PROMETHEUS")
    assert ds_var["type"] == "datasource" and ds_var["query"] == "prometheus"
    assert ds_var["current"]["value"] == source["uid"] == "prometheus"


# --------------------------------------------------------------------------------------------
# Ports and probes agree


def test_probes_use_worker_endpoints_on_the_metrics_port() -> None:
    container = _worker_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports.get("metrics") == METRICS_PORT
    assert int(_configmap()["STREAMER_METRICS_PORT"]) == METRICS_PORT
    expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": None}
    for probe_name, expected_path in expected.items():
        probe = container.get(probe_name)
        assert probe, f"the worker container has no {probe_name}"
        http = probe["httpGet"]
        assert http["path"] in HTTP_PATHS
        if expected_path:
            assert http["path"] == expected_path, f"{probe_name} must hit {expected_path}"
        port = http["port"]
        assert (ports[port] if isinstance(port, str) else port) == METRICS_PORT


def test_metrics_port_wiring_in_kubernetes() -> None:
    container = _worker_container()
    port_names = {p["name"] for p in container["ports"]}
    pod = _k8s("StatefulSet")["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == METRICS_PORT
    assert annotations["prometheus.io/path"] == "/metrics"
    (service_port,) = _k8s("Service")["spec"]["ports"]
    assert service_port["port"] == METRICS_PORT and service_port["targetPort"] in port_names
    assert _k8s("Service")["spec"]["clusterIP"] == "None"
    assert _k8s("StatefulSet")["spec"]["serviceName"] == _k8s("Service")["metadata"]["name"]
    podmonitor = _k8s("PodMonitor")
    assert podmonitor["apiVersion"] == "monitoring.coreos.com/v1"
    for endpoint in podmonitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    pod_labels = pod["metadata"]["labels"]
    assert podmonitor["spec"]["jobLabel"] in pod_labels
    assert pod_labels[podmonitor["spec"]["jobLabel"]] == "streamer", 'alerts select job="streamer"'
    for selector in (
        podmonitor["spec"]["selector"]["matchLabels"],
        _k8s("Service")["spec"]["selector"],
        _k8s("NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        _k8s("StatefulSet")["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()


def test_networkpolicy_allows_only_metrics_in_and_kafka_dns_out() -> None:
    spec = _k8s("NetworkPolicy")["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    ingress_ports = {p["port"] for rule in spec["ingress"] for p in rule["ports"]}
    assert ingress_ports == {METRICS_PORT}
    for rule in spec["ingress"]:
        assert rule.get("from"), "ingress must be limited to Prometheus pods"
    egress_ports = {
        (p["port"], p.get("protocol", "TCP")) for r in spec["egress"] for p in r["ports"]
    }
    assert (53, "UDP") in egress_ports and (53, "TCP") in egress_ports
    for server in _configmap()["STREAMER_BOOTSTRAP"].split(","):
        assert (int(server.rsplit(":", 1)[1]), "TCP") in egress_ports, f"egress blocks {server}"


def test_compose_worker_publishes_the_metrics_port() -> None:
    worker = _compose()["services"]["worker"]
    env = _env_dict(worker.get("environment"))
    assert env.get("STREAMER_METRICS_HOST") == "0.0.0.0"
    published = [str(p).rsplit(":", 1)[-1] for p in worker.get("ports", [])]
    assert str(METRICS_PORT) in published
    bootstrap = _flags(_command(worker)).get("bootstrap") or ""
    assert bootstrap.split(":")[0] in _compose()["services"], f"--bootstrap {bootstrap!r}"
    simulator = _compose()["services"]["simulator"]
    assert simulator.get("healthcheck", {}).get("disable") is True, (
        "the simulator serves no /healthz: disable the image's HEALTHCHECK for it"
    )


# --------------------------------------------------------------------------------------------
# Shutdown, secrets, storage, security


def test_grace_period_exceeds_shutdown_timeout() -> None:
    pod = _k8s("StatefulSet")["spec"]["template"]["spec"]
    timeout = _seconds(_configmap()["STREAMER_SHUTDOWN_TIMEOUT"])
    assert pod["terminationGracePeriodSeconds"] > timeout
    worker = _compose()["services"]["worker"]
    compose_timeout = _seconds(
        _env_dict(worker.get("environment")).get("STREAMER_SHUTDOWN_TIMEOUT")
        or _flags(_command(worker)).get("shutdown-timeout")
        or 25
    )
    assert _seconds(worker["stop_grace_period"]) > compose_timeout


def test_worker_id_is_the_pod_name() -> None:
    env = {e["name"]: e for e in _worker_container()["env"]}
    assert env["STREAMER_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    env_from = _worker_container()["envFrom"]
    assert {"configMapRef": {"name": _k8s("ConfigMap")["metadata"]["name"]}} in env_from


def test_sasl_password_comes_from_a_mounted_secret_file() -> None:
    container = _worker_container()
    pod = _k8s("StatefulSet")["spec"]["template"]["spec"]
    secret = _k8s("Secret")
    env = {e["name"]: e for e in container["env"]}
    assert "STREAMER_SASL_PASSWORD" not in env and "STREAMER_SASL_PASSWORD" not in _configmap()
    path = PurePosixPath(env["STREAMER_SASL_PASSWORD_FILE"]["value"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = [m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == path.parent]
    assert len(mounts) == 1, f"nothing mounted at {path.parent}"
    source = volumes[mounts[0]["name"]]["secret"]
    assert source["secretName"] == secret["metadata"]["name"]
    items = {i["path"]: i["key"] for i in source.get("items", [])}
    key = items.get(path.name, path.name)
    assert key in {**secret.get("stringData", {}), **secret.get("data", {})}
    assert "EXAMPLE" in secret["stringData"][key].upper(), "the example secret must look fake"
    assert source.get("defaultMode", 0o644) & 0o040, "fsGroup must be able to read the file"


def test_checkpoints_live_on_persistent_volumes() -> None:
    checkpoint_dir = PurePosixPath(_configmap()["STREAMER_CHECKPOINT_DIR"])
    statefulset = _k8s("StatefulSet")
    claims = {c["metadata"]["name"] for c in statefulset["spec"]["volumeClaimTemplates"]}
    mounts = [
        m
        for m in _worker_container()["volumeMounts"]
        if checkpoint_dir.is_relative_to(m["mountPath"])
    ]
    assert mounts and mounts[-1]["name"] in claims
    worker = _compose()["services"]["worker"]
    compose_dir = PurePosixPath(str(_flags(_command(worker))["checkpoint-dir"]))
    assert any(
        compose_dir.is_relative_to(target) and not _is_path(source)
        for source, target in _compose_mounts(worker)
    ), "the compose worker's checkpoint dir is not on a named volume"


def test_pod_security() -> None:
    pod = _k8s("StatefulSet")["spec"]["template"]["spec"]
    container = _worker_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod.get("enableServiceLinks") is False, "service links inject STREAMER_* variables"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in volumes[tmp[0]["name"]]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


# --------------------------------------------------------------------------------------------
# Metric names, env vars and flags are the documented ones


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_expressions_use_only_exported_metrics(source: str) -> None:
    exprs = _rule_exprs() if source == "alerts" else _dashboard_exprs()
    assert exprs
    unknown = {
        (where, name)
        for where, expr in exprs
        for name in _metric_names(expr)
        if name not in METRICS
    }
    assert not unknown, f"unknown metric names in {source}: {sorted(unknown)}"


def test_dashboard_panels() -> None:
    dashboard = _dashboard()
    panels = [p for p in _dashboard_panels() if p.get("type") != "row"]
    ids = [p["id"] for p in _dashboard_panels()]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    used = set().union(*(_metric_names(e) for _, e in _dashboard_exprs()))
    for wanted in (
        "streamer_samples_trained_total",
        "streamer_records_polled_total",
        "streamer_consumer_lag_records",
        "streamer_partition_last_trained_timestamp_seconds",
        "streamer_input_wait_seconds",
        "streamer_train_step_seconds",
        "streamer_decode_errors_total",
        "streamer_records_dead_lettered_total",
        "streamer_offset_commits_total",
        "streamer_checkpoints_total",
        "streamer_rebalances_total",
        "streamer_queue_depth_records",
        "streamer_queue_capacity_records",
        "streamer_paused_partitions",
    ):
        assert wanted in used, f"the dashboard shows no {wanted}"
    allowed = (
        {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
        {"type": "prometheus", "uid": "prometheus"},
    )
    for panel in panels:
        assert panel["datasource"] in allowed, f"panel {panel['title']}: datasource"
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) in allowed
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    assert dashboard["uid"] and dashboard["title"]


def test_alert_rules_are_labelled_and_explained() -> None:
    rules = _alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for wanted in (
        "StreamerStopped",
        "StreamerStalled",
        "StreamerLagGrowing",
        "StreamerFreshnessSLO",
        "StreamerRebalanceStorm",
        "StreamerDecodeErrors",
        "StreamerInputBound",
        "StreamerDeadLetterFailing",
        "StreamerDown",
    ):
        assert wanted in names
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = _load_yaml(PROMETHEUS_DIR / "alerts_test.yml")["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    for name in (r["alert"] for r in _alert_rules()):
        fired = [c for c in cases if c["alertname"] == name and c.get("exp_alerts")]
        quiet = [c for c in cases if c["alertname"] == name and not c.get("exp_alerts")]
        assert fired, f"no alerts_test.yml case makes {name} fire"
        assert quiet, f"no alerts_test.yml case checks that {name} stays quiet"


def _deploy_text_files() -> list[Path]:
    files = _deploy_files(".yml", ".yaml", ".json", ".md", ".dockerignore")
    return [*files, DOCKERFILE]


def test_env_vars_are_documented() -> None:
    documented = documented_env_vars()
    unknown = {
        (_rel(path), name)
        for path in _deploy_text_files()
        for name in re.findall(r"\bSTREAMER_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8"))
        if name not in documented
    }
    assert not unknown, f"undocumented STREAMER_* variables: {sorted(unknown)}"


def test_env_var_values_in_configmap_look_sane() -> None:
    config = _configmap()
    assert all(isinstance(v, str) for v in config.values()), "ConfigMap values must be strings"
    assert config["STREAMER_LOG_FORMAT"] in ("text", "json")
    assert config["STREAMER_METRICS_HOST"] == "0.0.0.0"
    assert "STREAMER_WORKER_ID" not in config, "the worker id is the pod name (fieldRef)"
    assert not set(config) & set(SECRET_ENV_VARS), "secrets do not belong in a ConfigMap"


def test_compose_commands_use_documented_flags() -> None:
    for name, service in _compose()["services"].items():
        args = _command(service)
        if not args or args[0] not in ("run", "simulate"):
            continue
        known = RUN_OPTIONS if args[0] == "run" else SIMULATE_OPTIONS
        unknown = set(_flags(args[1:])) - set(known)
        assert not unknown, f"compose service {name}: unknown `streamer {args[0]}` flags {unknown}"
    k8s_args = _worker_container().get("args", [])
    assert k8s_args[:1] == ["run"]
    assert not set(_flags(k8s_args[1:])) - set(RUN_OPTIONS)


# --------------------------------------------------------------------------------------------
# External tools


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        msg = "promtool not found (Debian: apt-get install prometheus)"
        if _in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return found


@pytest.mark.parametrize(
    "args",
    [
        ("check", "config", "deploy/prometheus/prometheus.yml"),
        ("check", "rules", "deploy/prometheus/alerts.yml"),
        ("test", "rules", "deploy/prometheus/alerts_test.yml"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_promtool(args: tuple[str, ...]) -> None:
    proc = subprocess.run(
        [_promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


def _grafana_to_promql(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced, as Prometheus would receive it."""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", expr, re.S)
    if label_values:  # a Grafana function: check its series selector
        expr = label_values.group(1)
    for variable, value in (
        ("$__rate_interval", "1m"),
        ("$__interval", "1m"),
        ("$__range", "1h"),
        ("$instance", ".*"),
        ("$topic", ".*"),
    ):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses every dashboard query (as recording rules of a scratch rule file)."""
    promtool = _promtool()
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _grafana_to_promql(expr)}
        for i, (_where, expr) in enumerate(_dashboard_exprs())
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"dashboard queries do not parse:\n{proc.stdout}\n{proc.stderr}"


def test_kustomize_builds() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    proc = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(proc.stdout) if doc}
    assert kinds == {"ConfigMap", "Secret", "Service", "StatefulSet", "PodMonitor", "NetworkPolicy"}


# --------------------------------------------------------------------------------------------
# One model on N workers: deploy/kubernetes/multiworker/ (a JobSet)


@cache
def _mw(kind: str) -> dict[str, Any]:
    """The one object of ``kind`` in deploy/kubernetes/multiworker/."""
    found = [
        doc
        for path in sorted(K8S_MW.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("kind") == kind
    ]
    assert len(found) == 1, f"expected one {kind} in {_rel(K8S_MW)}, found {len(found)}"
    return found[0]


def _mw_job() -> dict[str, Any]:
    (rjob,) = _mw("JobSet")["spec"]["replicatedJobs"]
    job: dict[str, Any] = rjob["template"]["spec"]
    return job


def _mw_pod() -> dict[str, Any]:
    pod: dict[str, Any] = _mw_job()["template"]
    return pod


def _mw_container() -> dict[str, Any]:
    (container,) = _mw_pod()["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _mw_config() -> dict[str, str]:
    data: dict[str, str] = _mw("ConfigMap")["data"]
    return data


def test_multiworker_kustomization_lists_every_manifest() -> None:
    resources = _load_yaml(K8S_MW / "kustomization.yaml")["resources"]
    on_disk = {p.name for p in K8S_MW.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(resources) == on_disk
    assert _mw("JobSet")["apiVersion"] == "jobset.x-k8s.io/v1alpha2"


def test_multiworker_hosts_are_the_jobsets_pods_on_the_headless_service() -> None:
    """STREAMER_CLUSTER_WORKERS names pod <jobset>-<job>-0-<index>.<subdomain>:<cluster port>
    for every index of the Indexed Job, N = parallelism = completions."""
    jobset = _mw("JobSet")
    (rjob,) = jobset["spec"]["replicatedJobs"]
    job = _mw_job()
    n = job["parallelism"]
    assert rjob["replicas"] == 1 and job["completions"] == n and n >= 2
    assert job["completionMode"] == "Indexed"
    network = jobset["spec"]["network"]
    service = _mw("Service")
    assert network["enableDNSHostnames"] is True
    assert network["subdomain"] == service["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in _mw_container()["ports"]}
    hosts = _mw_config()["STREAMER_CLUSTER_WORKERS"].split(",")
    prefix = f"{jobset['metadata']['name']}-{rjob['name']}-0"
    assert hosts == [f"{prefix}-{i}.{network['subdomain']}:{ports['cluster']}" for i in range(n)]
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in spec["ports"]}["cluster"] == ports["cluster"]
    assert spec["selector"].items() <= _mw_pod()["metadata"]["labels"].items()
    # The index comes from the Job (JOB_COMPLETION_INDEX), never from the shared ConfigMap.
    assert "STREAMER_WORKER_INDEX" not in _mw_config()
    assert "TF_CONFIG" not in {e["name"] for e in _mw_container()["env"]}


def test_multiworker_one_failure_restarts_the_whole_set() -> None:
    jobset = _mw("JobSet")
    job = _mw_job()
    assert job["backoffLimit"] == 0, "a failed pod must fail the Job (the JobSet restarts all)"
    assert _mw_pod()["spec"]["restartPolicy"] == "Never"
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] >= 1
    # A worker stopped because another got SIGTERM fails its Job: the set restarts.
    assert int(_mw_config()["STREAMER_PEER_STOP_EXIT_CODE"]) != 0


def test_multiworker_checkpoints_on_storage_every_pod_mounts() -> None:
    pvc = _mw("PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    volumes = {v["name"]: v for v in _mw_pod()["spec"]["volumes"]}
    checkpoint_dir = PurePosixPath(_mw_config()["STREAMER_CHECKPOINT_DIR"])
    mounts = [
        m for m in _mw_container()["volumeMounts"] if checkpoint_dir.is_relative_to(m["mountPath"])
    ]
    assert mounts, f"nothing mounted above {checkpoint_dir}"
    claim = volumes[mounts[-1]["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == pvc["metadata"]["name"]


def test_multiworker_probes_grace_and_security_match_the_single_worker() -> None:
    container, pod = _mw_container(), _mw_pod()["spec"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == METRICS_PORT == int(_mw_config()["STREAMER_METRICS_PORT"])
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
    liveness = container["livenessProbe"]
    assert float(_mw_config()["STREAMER_STALL_TIMEOUT"]) < (
        liveness["periodSeconds"] * liveness["failureThreshold"] * 2
    ), "a hung cluster must be restarted within minutes"
    assert pod["terminationGracePeriodSeconds"] > _seconds(
        _mw_config()["STREAMER_SHUTDOWN_TIMEOUT"]
    )
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["enableServiceLinks"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["STREAMER_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert {"configMapRef": {"name": _mw("ConfigMap")["metadata"]["name"]}} in container["envFrom"]
    assert container["args"] == ["run"]


def test_multiworker_pods_are_scraped_as_job_streamer_and_may_talk_to_each_other() -> None:
    labels = _mw_pod()["metadata"]["labels"]
    podmonitor = _mw("PodMonitor")["spec"]
    assert labels[podmonitor["jobLabel"]] == "streamer", 'alerts select job="streamer"'
    assert podmonitor["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in podmonitor["podMetricsEndpoints"]] == ["metrics"]
    # Not selected by the single-worker PodMonitor too (every series would be scraped twice).
    single = _k8s("PodMonitor")["spec"]["selector"]["matchLabels"]
    assert not single.items() <= labels.items()
    policy = _mw("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    cluster = {p["containerPort"] for p in _mw_container()["ports"] if p["name"] == "cluster"}
    ingress = {p["port"] for r in policy["ingress"] for p in r["ports"]}
    egress = {p["port"] for r in policy["egress"] for p in r["ports"]}
    assert ingress == {METRICS_PORT, *cluster} and cluster <= egress
    for server in _mw_config()["STREAMER_BOOTSTRAP"].split(","):
        assert int(server.rsplit(":", 1)[1]) in egress
    annotations = _mw_pod()["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == METRICS_PORT


def test_multiworker_kustomize_builds() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    proc = subprocess.run(
        [kubectl, "kustomize", str(K8S_MW)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(proc.stdout) if doc}
    assert kinds == {
        "ConfigMap", "Service", "PersistentVolumeClaim", "JobSet", "PodMonitor", "NetworkPolicy"
    }  # fmt: skip
