"""The tutorials' shell blocks, run as a user pastes them (from the repository root, one after
the other in one shell), against a broker of their own: every ```bash block of the pages in
``PAGES`` runs and exits 0, or says why not.

A block may be preceded by one marker (an HTML comment, not shown on the site):

- ``<!-- docs-test: skip: WHY -->``: not run (it installs, or needs Docker or two machines);
- ``<!-- docs-test: ctrl-c after N -->``: a command that runs until stopped: after N seconds
  it gets a Ctrl-C (SIGINT to its process group) and must then exit 0 (the worker's clean
  stop); blocks marked ``concurrent`` right after it run while it does;
- ``<!-- docs-test: concurrent, retry N -->``: "in another terminal, while it runs": run
  while the block before it runs, again every 2 s until it exits 0, for up to N seconds.

Variables a block sets (``BOOTSTRAP=...``) are seen by the blocks after it, as in one shell;
background jobs (``&``) live until the page ends. The blocks run in a scratch folder whose
``.venv``, ``deploy`` and ``examples`` are the checkout's (``.venv`` is the running
interpreter's environment), with ``KAFKA_LOCAL_DIR`` set, so ``deploy/local/kafka.sh start``
and ``stop`` start and stop a broker of this module's own, never the suite's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: The pages whose shell blocks a reader pastes: the tutorials and the operations walkthrough.
PAGES = [
    "getting-started.md",
    "tutorials/kafka.md",
    "tutorials/your-model.md",
    "tutorials/recommender.md",
    "tutorials/online-learning.md",
    "tutorials/scaling-out.md",
    "how-to/operations.md",
]

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

_BLOCK = re.compile(r"(?:<!-- docs-test: (?P<marker>[^>]*?) -->\n)?```bash\n(?P<body>.*?)```", re.S)
#: A block runs at most this long unless its marker says otherwise.
BLOCK_TIMEOUT_S = 300


@dataclass
class Block:
    page: str
    index: int
    body: str
    marker: str

    @property
    def name(self) -> str:
        return f"{self.page} block {self.index + 1}"


def blocks_of(page: str) -> list[Block]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return [
        Block(page, i, m["body"], (m["marker"] or "").strip())
        for i, m in enumerate(_BLOCK.finditer(text))
    ]


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-n:] if path.exists() else ""


class Shell:
    """One reader's shell: the blocks of a page in order, variables carried from one to the
    next, every process group it started stopped at the end."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = env
        self.groups: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def start(self, block: Block) -> tuple[subprocess.Popen[bytes], Path, Path]:
        self.count += 1
        state = self.cwd / f".block-{self.count}.env"
        log = self.cwd / f".block-{self.count}.log"
        script = (
            "set -a\n"  # every assignment is exported: the next block sees it
            f"trap 'env -0 > {state}' EXIT\n"
            "set -eo pipefail\n" + block.body
        )
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", script],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a Ctrl-C reaches it alone
            )
        self.groups.append(proc)
        return proc, state, log

    def finished(self, proc: subprocess.Popen[bytes], state: Path) -> int:
        """The block's exit code; its variables become the shell's."""
        code = proc.returncode
        if state.exists():
            pairs = state.read_bytes().split(b"\0")
            self.env = dict(p.decode("utf-8", "replace").split("=", 1) for p in pairs if b"=" in p)
        return int(code)

    def run(self, block: Block, timeout: float = BLOCK_TIMEOUT_S) -> None:
        proc, state, log = self.start(block)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.name} still ran after {timeout:.0f}s:\n{_tail(log)}")
        code = self.finished(proc, state)
        assert code == 0, f"{block.name} exited {code}:\n{block.body}\n---\n{_tail(log)}"

    def retry(self, block: Block, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            proc, state, log = self.start(block)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{block.name} still ran after 60s:\n{_tail(log)}")
            if self.finished(proc, state) == 0:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"{block.name} did not succeed in {seconds:.0f}s:\n{_tail(log)}")
            time.sleep(2)

    def close(self) -> None:
        for proc in self.groups:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(0.5)


def _marker_seconds(marker: str, word: str) -> float:
    match = re.search(rf"{word} (\d+)", marker)
    assert match, f"marker {marker!r} needs '{word} N'"
    return float(match.group(1))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The folder and environment the blocks run in; the broker they start is stopped last."""
    base = tmp_path_factory.mktemp("docs")
    broker = base / "kafka"
    env = dict(os.environ)
    env.update(
        KAFKA_LOCAL_DIR=str(broker),
        PYTHONPATH=str(ROOT),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    for name in list(env):  # a reader's shell has none of the suite's settings
        if name == "KAFKA_BOOTSTRAP" or name.startswith("STREAMER_"):
            env.pop(name)
    yield base, env
    subprocess.run(
        ["bash", str(ROOT / "deploy" / "local" / "kafka.sh"), "stop"],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("page", PAGES)
def test_every_shell_block_of_the_page_runs_as_pasted(
    page: str, scratch: tuple[Path, dict[str, str]]
) -> None:
    base, env = scratch
    cwd = base / page.replace("/", "-").removesuffix(".md")
    cwd.mkdir()
    (cwd / ".venv").symlink_to(sys.prefix)
    for name in ("deploy", "examples"):
        (cwd / name).symlink_to(ROOT / name)
    blocks = blocks_of(page)
    assert blocks, f"{page} has no ```bash block"
    shell = Shell(cwd, env)
    ran = 0
    try:
        i = 0
        while i < len(blocks):
            block = blocks[i]
            marker = block.marker
            if marker.startswith("skip"):
                assert re.match(r"skip: \S", marker), f"{block.name}: say why it is skipped"
                i += 1
                continue
            if marker.startswith("ctrl-c after"):
                stop_at = time.monotonic() + _marker_seconds(marker, "after")
                proc, state, log = shell.start(block)
                i += 1
                while i < len(blocks) and blocks[i].marker.startswith("concurrent"):
                    shell.retry(blocks[i], _marker_seconds(blocks[i].marker, "retry"))
                    assert proc.poll() is None, f"{block.name} ended early:\n{_tail(log)}"
                    ran += 1
                    i += 1
                time.sleep(max(0.0, stop_at - time.monotonic()))
                assert proc.poll() is None, f"{block.name} ended before its Ctrl-C:\n{_tail(log)}"
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{block.name} did not stop 120s after Ctrl-C:\n{_tail(log)}")
                code = shell.finished(proc, state)
                assert code == 0, f"{block.name} exited {code} after Ctrl-C:\n{_tail(log)}"
                ran += 1
                continue
            assert not marker, f"{block.name}: unknown marker {marker!r}"
            shell.run(block)
            ran += 1
            i += 1
    finally:
        shell.close()
    assert ran, f"no block of {page} ran"


def test_only_known_markers_and_every_skip_says_why() -> None:
    for page in PAGES:
        for block in blocks_of(page):
            m = block.marker
            assert (
                not m
                or re.fullmatch(r"skip: .+", m)
                or re.fullmatch(r"ctrl-c after \d+", m)
                or re.fullmatch(r"concurrent, retry \d+", m)
            ), f"{block.name}: {m!r}"
