"""AuditLog: its folder is made; a path that cannot be written is a ConfigError naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from consumers.errors import ConfigError
from streamer.ops.audit import AuditLog


def test_the_audit_logs_folder_is_made_and_lines_append(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "kafka" / "audit.csv"  # the README's path in a fresh clone
    log = AuditLog(str(path), "samples")
    log.add(np.array([0, 1]), np.array([5, 7]))
    log.close()
    again = AuditLog(str(path), "samples")
    again.add(np.array([2]), np.array([0]))
    again.close()
    assert path.read_text(encoding="ascii") == "samples,0,5\nsamples,1,7\nsamples,2,0\n"


def test_a_file_in_the_way_of_the_folder_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"audit_log.*pick another path") as info:
        AuditLog(str(tmp_path / "runs" / "audit.csv"), "samples")
    assert info.value.exit_code == 2


def test_a_rollback_cuts_the_log_back_to_a_checkpoints_size(tmp_path: Path) -> None:
    """Lines after the checkpoint gone back to are dropped; later lines follow on."""
    path = tmp_path / "audit.csv"
    path.write_text("samples,0,1\n", encoding="ascii")  # an earlier run's line
    log = AuditLog(str(path), "samples")
    assert log.synced == len("samples,0,1\n")
    log.add(np.array([0, 0]), np.array([2, 3]))
    log.flush()  # a checkpoint
    at_checkpoint = log.synced
    log.add(np.array([1, 1, 1]), np.array([8, 9, 10]))
    assert log.truncate(at_checkpoint) == 3
    log.add(np.array([1]), np.array([8]))
    log.close()
    assert path.read_text(encoding="ascii") == (
        "samples,0,1\nsamples,0,2\nsamples,0,3\nsamples,1,8\n"
    )
