"""Private Kafka brokers and test certificates for the reliability tests (issue 6).

Every broker here is a separate ``deploy/local/kafka.sh`` instance with its own
``KAFKA_LOCAL_DIR`` under ``tmp_path_factory``: these tests stop, kill and restart brokers and
add SASL and TLS listeners, which must never touch the shared broker of ``kafka_bootstrap``.
Each fixture stops its broker at the end (``kafka.sh stop``: SIGTERM, then SIGKILL after 30 s).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "deploy" / "local" / "kafka.sh"

# SCRAM users are created at format time (StorageTool --add-scram); PLAIN users live in the
# listener's JAAS config. The passwords are distinctive so a leak is easy to grep for.
USERS = {
    "alice": ("SCRAM-SHA-256", "alice-S3cr3t-7f2b9c"),
    "bob": ("SCRAM-SHA-512", "bob-S3cr3t-41d8e0"),
    "carol": ("PLAIN", "carol-S3cr3t-a93c15"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(msg: str) -> None:
    if _in_ci():
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


@dataclass
class Certs:
    """A test CA, a broker certificate for 127.0.0.1/localhost, client certificates."""

    ca: Path  # CA that signed the broker and the good client certificate
    other_ca: Path  # an unrelated CA: trusting only it must fail
    server_keystore: Path  # PKCS#8 key + certificate chain (Kafka's file-based PEM keystore)
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate signed by other_ca
    rogue_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    days = "2"
    for ca in ("ca", "other-ca"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
            "-out", f"{ca}.pem", "-days", days, "-subj", f"/CN=streamer-test-{ca}", cwd=d,
        )  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ca, ext in (
        ("server", "ca", "server.ext"),
        ("client", "ca", None),
        ("rogue", "other-ca", None),
    ):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN=streamer-test-{name}", cwd=d,
        )  # fmt: skip
        sign = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key"]
        sign += ["-CAcreateserial", "-out", f"{name}.crt", "-days", days]
        if ext:
            sign += ["-extfile", ext]
        _openssl(*sign, cwd=d)
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.p8", cwd=d)
    keystore = d / "server-keystore.pem"
    keystore.write_text((d / "server.p8").read_text() + (d / "server.crt").read_text())
    return Certs(
        ca=d / "ca.pem",
        other_ca=d / "other-ca.pem",
        server_keystore=keystore,
        client_cert=d / "client.crt",
        client_key=d / "client.key",
        rogue_cert=d / "rogue.crt",
        rogue_key=d / "rogue.key",
    )


@dataclass
class PrivateBroker:
    """One kafka.sh broker instance with its own state folder; ``plaintext`` for admin work."""

    state: Path
    extra_properties: Path | None = None
    format_args: str = ""
    listeners: dict[str, str] = field(default_factory=dict)  # listener name -> host:port

    @property
    def plaintext(self) -> str:
        return self.listeners["PLAINTEXT"]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KAFKA_LOCAL_DIR"] = str(self.state)
        env.pop("KAFKA_PORT", None)
        if self.extra_properties is not None:
            env["KAFKA_EXTRA_PROPERTIES"] = str(self.extra_properties)
        else:
            env.pop("KAFKA_EXTRA_PROPERTIES", None)
        if self.format_args:
            env["KAFKA_FORMAT_ARGS"] = self.format_args
        else:
            env.pop("KAFKA_FORMAT_ARGS", None)
        return env

    def sh(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        # cwd: KAFKA_FORMAT_ARGS is word-split unquoted; its [name=...] must not glob-match.
        return subprocess.run(
            ["bash", str(KAFKA_SH), command],
            cwd=self.state,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> str:
        proc = self.sh("start")
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(
                f"private broker in {self.state} did not start (exit {proc.returncode}):\n"
                f"{proc.stderr[-3000:]}\n{self.server_log()[-3000:]}"
            )
        address = lines[-1]
        self.listeners.setdefault("PLAINTEXT", address)
        assert address == self.plaintext, (address, self.plaintext)
        return address

    def stop(self) -> None:
        """SIGTERM (clean shutdown), SIGKILL after 30 s."""
        proc = self.sh("stop")
        assert proc.returncode == 0, proc.stderr

    def kill(self) -> None:
        """SIGKILL: no clean shutdown."""
        proc = self.sh("kill")
        assert proc.returncode == 0, proc.stderr

    def running(self) -> bool:
        return self.sh("status", timeout=30).returncode == 0

    def server_log(self) -> str:
        path = self.state / "logs" / "server.log"
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def logs_text(self) -> str:
        """Every log file of this broker (server, stdout, format), concatenated."""
        out = []
        for path in sorted((self.state / "logs").glob("*.log*")):
            out.append(path.read_text(encoding="utf-8", errors="replace"))
        return "\n".join(out)

    def clean(self) -> None:
        self.sh("stop")
        if self.running():  # pragma: no cover - stop escalates to SIGKILL itself
            self.sh("kill")


def serve(broker: PrivateBroker) -> Iterator[PrivateBroker]:
    """Fixture body: start ``broker`` (a start failure fails in CI, skips elsewhere), yield it,
    clean it up."""
    try:
        broker.start()
    except RuntimeError as exc:
        broker.clean()
        unavailable(str(exc))
    yield broker
    broker.clean()


def need_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        unavailable(f"needs {', '.join(missing)} on PATH")


def fixed_ports(state: Path) -> tuple[int, int]:
    """Pick the broker and controller ports ourselves: extra listeners must name them too.

    kafka.sh reuses ``state/ports`` when ``state/data`` exists (its restart path) and formats
    the storage when ``data/meta.properties`` is missing, so this only fixes the ports.
    """
    port, cport = free_port(), free_port()
    while cport == port:
        cport = free_port()
    (state / "data").mkdir(parents=True)
    (state / "ports").write_text(f"{port} {cport}\n")
    return port, cport
