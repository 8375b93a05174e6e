"""End-to-end fixtures: one toy model trained once per session (``toy_run``), shared by the training,
evaluation and translation tests, and ``toy``, which trains in-process and runs the scripts.

Every run here uses one CPU thread, in-process and in the subprocesses: the toy model is small, so
this costs little on an idle machine and saves a lot on a busy one (OpenMP threads spin-wait for
each other), and runs compared bit for bit must use the same number of threads anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nmt.config import TrainConfig
from nmt.data import prepare_text
from nmt.training.loop import train

REPO = Path(__file__).resolve().parents[2]
THREADS = 1


@dataclass
class ToyRun:
    cfg: TrainConfig
    run_dir: Path
    final: dict[str, float]  # the last validation

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


@dataclass
class Toy:
    """``experiment=toy`` runs sharing one data cache, in-process or through the scripts."""

    data_cache: Path
    compose_train: Callable[..., TrainConfig]  # the root conftest's
    # For short runs: a cheap validation (a few sentences, no attention image), a log line every 10 steps.
    short: tuple[str, ...] = (
        "trainer.valid_bleu_sentences=10",
        "trainer.attention_image=false",
        "trainer.log_every=10",
    )
    # For runs whose assertions do not need the model to learn (determinism, resuming, budgets,
    # checkpoints): width 32 instead of the preset's 128, a few times faster per update.
    tiny: tuple[str, ...] = ("model.d_model=32", "model.ff_dim=64", "model.heads=2")

    def overrides(self, *overrides: str, preset: bool = True) -> list[str]:
        """The toy preset (``preset=False``: its data only, for models whose keys it does not set), the
        shared data cache, no progress bar, and fp32: the same numbers on every CPU (precision=auto picks
        bf16 on some, fp32 on others)."""
        fixed = ["experiment=toy" if preset else "data=toy", f"data.cache_dir={self.data_cache}"]
        return [*fixed, "trainer.progress=false", "trainer.precision=fp32", *overrides]

    def config(self, *overrides: str, preset: bool = True) -> TrainConfig:
        """The typed config that ``scripts/train.py experiment=toy <overrides>`` gets."""
        return self.compose_train(*self.overrides(*overrides, preset=preset))

    def train(self, run_dir: Path, *overrides: str) -> ToyRun:
        """``scripts/train.py experiment=toy <overrides>``, in this process."""
        cfg = self.config(*overrides)
        return ToyRun(cfg, run_dir, train(cfg, run_dir))

    @staticmethod
    def env() -> dict[str, str]:
        return {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}

    def script(
        self, script: str, *args: str, cwd: Path, stdin: str | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """``python scripts/<script> <args>`` in ``cwd``; stdout and stderr captured separately."""
        return subprocess.run(
            [sys.executable, str(REPO / "scripts" / script), *args],
            cwd=cwd,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
        )


@pytest.fixture(scope="session")
def toy(tmp_path_factory, one_thread, compose_train_cfg) -> Toy:
    return Toy(tmp_path_factory.mktemp("data-cache"), compose_train_cfg)


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory, toy) -> ToyRun:
    """``experiment=toy`` with its defaults (1000 steps, validation at 500 and 1000): the trained model."""
    return toy.train(tmp_path_factory.mktemp("toy") / "run")


@pytest.fixture(scope="session")
def toy_text(toy_run) -> Path:
    """The toy run's prepared (cleaned) text: the folder of its {train,valid,test}.{src,tgt} files."""
    return prepare_text(toy_run.cfg.data, progress=False)


@pytest.fixture(scope="session")
def toy_ct2(toy, toy_run, tmp_path_factory) -> Path:
    """The toy model's last checkpoint as a CTranslate2 model directory, written by the export script."""
    pytest.importorskip("ctranslate2")
    output = tmp_path_factory.mktemp("ct2") / "model"
    checkpoint = toy_run.checkpoints / "last.pt"
    proc = toy.script("export_ct2.py", f"checkpoint={checkpoint}", f"output={output}", cwd=output.parent)
    assert proc.returncode == 0, proc.stderr
    return output
