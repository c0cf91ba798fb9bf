"""examples/: the schema files are the simulator tasks' own, and the index names every file."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamer.decode.schema import Schema
from streamer.input.simulator import TASKS, task_named

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("task", sorted(TASKS))
def test_each_simulator_task_ships_its_schema_as_a_file(task: str) -> None:
    path = EXAMPLES / f"{task}.toml"
    assert path.is_file(), f"examples/{task}.toml is missing"
    assert Schema.from_file(path).to_dict() == task_named(task).schema().to_dict()


def test_the_index_names_every_example() -> None:
    index = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    files = sorted(
        p.name
        for p in EXAMPLES.iterdir()
        if p.is_file() and p.name not in ("__init__.py", "README.md") and p.suffix != ".pyc"
    )
    missing = [name for name in files if f"`{name}`" not in index]
    assert not missing, f"examples/README.md does not list {missing}"
