"""One training process per run dir (nmt.training.lock)."""

from __future__ import annotations

import os

import pytest

from nmt.errors import NMTError
from nmt.training.lock import LOCK_NAME, hold_run_dir


def test_a_held_run_dir_is_refused_naming_the_pid_and_released_after(tmp_path):
    with hold_run_dir(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        refused = rf"^{tmp_path}: another training process \(PID {os.getpid()}\)"
        with pytest.raises(NMTError, match=refused), hold_run_dir(tmp_path):
            pass
    with hold_run_dir(tmp_path):  # released
        pass


@pytest.mark.parametrize(
    "launcher, rank_key",
    [({"WORLD_SIZE": "2"}, "RANK"), ({"SLURM_STEP_NUM_TASKS": "2"}, "SLURM_PROCID")],
    ids=["torchrun", "srun"],
)
def test_rank_0_holds_the_run_dir_for_the_job(tmp_path, monkeypatch, launcher, rank_key):
    """The other ranks of the job neither take the lock nor are refused by rank 0's."""
    for key in ("WORLD_SIZE", "RANK", "SUBMITIT_EXECUTOR", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in launcher.items():
        monkeypatch.setenv(key, value)
    with hold_run_dir(tmp_path):
        monkeypatch.setenv(rank_key, "1")
        with hold_run_dir(tmp_path):
            pass
        monkeypatch.setenv(rank_key, "0")
        with pytest.raises(NMTError, match="another training process"), hold_run_dir(tmp_path):
            pass


def test_a_run_dir_made_for_a_refused_run_is_not_left_behind(tmp_path):
    with pytest.raises(NMTError), hold_run_dir(tmp_path / "run"):
        raise NMTError("refused before anything was written")
    assert list(tmp_path.iterdir()) == []
    with hold_run_dir(tmp_path / "run"):
        (tmp_path / "run" / "checkpoints").mkdir()
    assert (tmp_path / "run" / LOCK_NAME).read_text() == ""
