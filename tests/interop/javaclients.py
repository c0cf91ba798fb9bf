"""Kafka's own Java clients for interop tests: the Java producer and Kafka's command-line tools.

None of our code writes what these read or reads what they write: the producer is Apache
Kafka's ``kafka-clients`` (the jar the broker ships), driven by ``JavaProducer.java``; the
tools are ``org.apache.kafka:kafka-tools`` (``kafka-consumer-groups``, ``kafka-dump-log``),
fetched from Maven Central once into ``~/.cache/streamer``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "deploy" / "local" / "kafka.sh"
HERE = Path(__file__).resolve().parent
PRODUCER_SOURCE = HERE / "JavaProducer.java"
TOOLS_POM = HERE / "pom.xml"
CACHE = Path(os.environ.get("STREAMER_TEST_CACHE", Path.home() / ".cache" / "streamer"))


def kafka_libs() -> Path:
    """The broker's jar folder (kafka-clients and the codec jars), fetched once by kafka.sh."""
    proc = subprocess.run(
        ["bash", str(KAFKA_SH), "libs"], capture_output=True, text=True, timeout=900, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"kafka.sh libs failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return Path(lines[-1])


def broker_data_dir() -> Path | None:
    """The log.dirs folder of the broker kafka.sh runs (None for a broker given by address)."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return None
    out = subprocess.run(
        ["bash", str(KAFKA_SH), "datadir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(out) if out else None


def _compile_producer(libs: Path) -> Path:
    digest = hashlib.sha256(PRODUCER_SOURCE.read_bytes()).hexdigest()[:12]
    classes = CACHE / f"java-producer-{digest}"
    if (classes / "JavaProducer.class").exists():
        return classes
    tmp = classes.with_name(classes.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    subprocess.run(
        ["javac", "-d", str(tmp), "-cp", f"{libs}/*", str(PRODUCER_SOURCE)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        tmp.rename(classes)
    except OSError:  # another process compiled it first
        shutil.rmtree(tmp, ignore_errors=True)
    return classes


def tools_libs() -> Path:
    """kafka-tools and its dependencies, fetched from Maven Central once."""
    version = re.search(r"<kafka.version>(.+?)</kafka.version>", TOOLS_POM.read_text()).group(1)  # type: ignore[union-attr]
    libs = CACHE / f"kafka-tools-{version}"
    if (libs / ".complete").exists():
        return libs
    libs.mkdir(parents=True, exist_ok=True)
    # One fetch at a time (parallel test workers, kafka.sh's consumer-groups): flock(2), as
    # kafka.sh takes it; a fetch that waited finds the jars complete.
    with open(f"{libs}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (libs / ".complete").exists():
            _fetch_tools(libs)
    return libs


def _fetch_tools(libs: Path) -> None:
    proc = subprocess.run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(TOOLS_POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={libs}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"maven could not fetch kafka-tools:\n{proc.stdout[-3000:]}")
    (libs / ".complete").touch()


@dataclass(frozen=True)
class ManifestEntry:
    partition: int
    offset: int
    kind: str  # committed, aborted or tombstone


def read_manifest(path: Path) -> list[ManifestEntry]:
    out = []
    for line in path.read_text(encoding="ascii").splitlines():
        p, o, kind = line.split(",")
        out.append(ManifestEntry(int(p), int(o), kind))
    return out


def by_kind(entries: list[ManifestEntry]) -> dict[str, set[tuple[int, int]]]:
    out: dict[str, set[tuple[int, int]]] = {}
    for e in entries:
        out.setdefault(e.kind, set()).add((e.partition, e.offset))
    return out


class JavaProducer:
    """Runs ``JavaProducer.java`` (Kafka's Java producer): phases of ``key=value`` settings."""

    def __init__(self) -> None:
        self.libs = kafka_libs()
        self.classes = _compile_producer(self.libs)

    def command(self, bootstrap: str, topic: str, manifest: Path, *phases: str) -> list[str]:
        return [
            "java",
            "-Xmx256m",
            "-cp",
            f"{self.classes}:{self.libs}/*",
            "JavaProducer",
            bootstrap,
            topic,
            str(manifest),
            *phases,
        ]

    def run(
        self, bootstrap: str, topic: str, manifest: Path, *phases: str, timeout: float = 300
    ) -> str:
        """Run to the end; returns the producer's stderr (its per-phase summary lines)."""
        proc = subprocess.run(
            self.command(bootstrap, topic, manifest, *phases),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"Java producer failed (exit {proc.returncode}):\n{proc.stderr}")
        return proc.stderr

    def start(
        self, bootstrap: str, topic: str, manifest: Path, *phases: str, log: Path
    ) -> subprocess.Popen[bytes]:
        """Run in the background (``records=0`` phases run until ``stop``)."""
        with open(log, "ab") as fh:
            return subprocess.Popen(
                self.command(bootstrap, topic, manifest, *phases), stdout=fh, stderr=fh
            )

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
        """SIGTERM: the producer finishes its transaction, writes its manifest lines, exits."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)


@dataclass(frozen=True)
class GroupRow:
    topic: str
    partition: int
    current_offset: int | None
    log_end_offset: int
    lag: int | None


def describe_group(bootstrap: str, group: str) -> list[GroupRow]:
    """``kafka-consumer-groups --describe --group G`` (Kafka's ConsumerGroupCommand), parsed."""
    libs = tools_libs()
    proc = subprocess.run(
        [
            "java",
            "-Xmx256m",
            "-cp",
            f"{libs}/*",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--group",
            group,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"kafka-consumer-groups failed:\n{proc.stdout}\n{proc.stderr}")
    rows = []
    header: list[str] | None = None
    for line in proc.stdout.splitlines():
        cols = line.split()
        if not cols:
            continue
        if cols[0] == "GROUP":
            header = cols
            continue
        if header is None or len(cols) < len(header):
            continue
        rec = dict(zip(header, cols, strict=False))

        def num(key: str, rec: dict[str, str] = rec) -> int | None:
            value = rec.get(key, "-")
            return None if value == "-" else int(value)

        end = num("LOG-END-OFFSET")
        assert end is not None, line
        rows.append(
            GroupRow(rec["TOPIC"], int(rec["PARTITION"]), num("CURRENT-OFFSET"), end, num("LAG"))
        )
    return rows


def log_codecs(data_dir: Path, topic: str) -> Counter[str]:
    """Batches per compression codec in ``topic``'s log segments (``kafka-dump-log``)."""
    libs = tools_libs()
    segments = sorted(str(p) for p in data_dir.glob(f"{topic}-*/*.log"))
    assert segments, f"no log segments of {topic} under {data_dir}"
    proc = subprocess.run(
        [
            "java",
            "-Xmx256m",
            "-cp",
            f"{libs}/*",
            "org.apache.kafka.tools.DumpLogSegments",
            "--files",
            ",".join(segments),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    counts: Counter[str] = Counter()
    for line in proc.stdout.splitlines():
        if "isControl: true" in line:
            counts["control"] += 1
            continue
        found = re.search(r"compresscodec: (\w+)", line)
        if found and line.startswith("baseOffset"):
            counts[found.group(1).lower()] += 1
    return counts
