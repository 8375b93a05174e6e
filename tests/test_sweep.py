"""A sweep's jobs: their run-dir claims, names and bad input refused before Hydra starts."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.errors import NMTError
from nmt.runs import cli, launching
from nmt.runs.sweep import JobResult, check_direction, claim_run_dir, format_table, job_result, ranked

REPO = Path(__file__).resolve().parents[1]


def test_a_job_of_the_same_launch_may_not_take_another_jobs_folder(tmp_path: Path):
    claim_run_dir(tmp_path, ["optim.lr=0.1", "data.dir=x"], 0, "launch1")
    claim_run_dir(tmp_path, ["optim.lr=0.1", "data.dir=x", "trainer.resume=auto"], 0, "launch1")  # itself
    with pytest.raises(NMTError, match=r"jobs 0 and 1 \(optim.lr=0.2\) of this sweep would share"):
        claim_run_dir(tmp_path, ["optim.lr=0.2", "data.dir=x"], 1, "launch1")
    claim_run_dir(tmp_path, ["optim.lr=0.1", "trainer.max_steps=9"], 3, "launch2")  # a relaunch continues


def test_multirun_with_hydra_run_dir_is_refused_in_one_line():
    with pytest.raises(NMTError, match=r"^hydra.run.dir=out: a sweep \(-m, hparams_search\) ignores it"):
        launching.check_sweep(["optim.lr=1,2", "hydra.run.dir=out"], multirun=True, config_dir=cli.CONFIG_DIR)
    with pytest.raises(NMTError, match="give hydra.sweep.dir"):
        launching.check_sweep(
            ["hparams_search=multi30k_optuna", "hydra.run.dir=out"], multirun=False, config_dir=cli.CONFIG_DIR
        )
    launching.check_sweep(["hydra.run.dir=out"], multirun=False, config_dir=cli.CONFIG_DIR)


@pytest.mark.parametrize(
    ("override", "package", "extra"),
    [
        ("hydra/launcher=submitit_slurm", "hydra-submitit-launcher", "cluster"),
        ("hparams_search=multi30k_optuna", "hydra-optuna-sweeper", "sweep"),
        ("hydra/sweeper=optuna", "hydra-optuna-sweeper", "sweep"),
    ],
)
def test_a_plugin_not_installed_is_named_with_its_package(monkeypatch, override, package, extra):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name.startswith("hydra_plugins") else real(name)
    )
    with pytest.raises(NMTError) as e:
        launching.check_sweep([override], multirun=True, config_dir=cli.CONFIG_DIR)
    assert str(e.value) == (
        f"{override}: needs {package}, which is not installed: pip install -e '.[{extra}]' "
        f"(or pip install {package})"
    )


def compose_train(overrides: list[str]):
    return cli._compose("train", [o for o in overrides if cli._is_group_line(o)])


def test_jobs_are_named_by_what_the_sweep_varies():
    args = argparse.Namespace(
        overrides=["experiment=toy", "trainer.max_steps=9", "optim.lr=1e-3,2e-3", "model=a,b"], multirun=True
    )
    (override,) = launching.job_name_overrides(args, compose_train)
    key, value = override.split("=", 1)
    assert key == "hydra.job.config.override_dirname.exclude_keys"
    excluded = value.strip("[]").split(",")
    assert {"experiment", "trainer.max_steps", "trainer.resume", "data.cache_dir"} <= set(excluded)
    assert "optim.lr" not in excluded and "model" not in excluded
    one_run = argparse.Namespace(overrides=["optim.lr=1"], multirun=False)
    assert launching.job_name_overrides(one_run, compose_train) == []


def test_torchrun_needs_one_run_dir_and_no_sweep(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(NMTError, match=r"^torchrun without hydra.run.dir: each rank would name its own"):
        launching.check_torchrun(["optim.lr=1"], multirun=False)
    with pytest.raises(NMTError, match=r"^-m under torchrun: every rank would run the whole sweep"):
        launching.check_torchrun(["optim.lr=1,2"], multirun=True)
    launching.check_torchrun(["hydra.run.dir=outputs/x"], multirun=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    launching.check_torchrun([], multirun=False)


def test_a_search_composes_with_hydras_flags_after_the_overrides():
    """The job-name override goes among the user's overrides: argparse takes them as one block."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), "hparams_search=multi30k_optuna",
         "experiment=multi30k_cpu", "--cfg", "job"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "  max_minutes: 15.0\n" in done.stdout  # the search's reduced budget, over the experiment's hour


def test_a_sweeper_optimizing_the_objective_the_wrong_way_is_refused():
    check_direction("maximize", "bleu")
    check_direction("minimize", "loss")
    check_direction(None, "loss")  # the basic sweeper has no direction
    with pytest.raises(NMTError, match=r"^hydra.sweeper.direction=maximize but trainer.best_metric=loss, "):
        check_direction("maximize", "loss")


def test_jobs_are_ranked_best_first_by_their_metric():
    def row(num: int, best: float | None, metric: str = "loss") -> JobResult:
        return JobResult(str(num), num, "", 4, metric, best, None, None, None, 0.0, "ended")

    rows = ranked([row(0, 2.0), row(1, None), row(2, 1.5), row(3, float("nan"))])
    assert [r.num for r in rows][:2] == [2, 0]  # lower loss first; never-validated jobs last
    assert [r.num for r in ranked([row(0, 20.0, "bleu"), row(1, 30.0, "bleu")])] == [1, 0]
    table = format_table(rows).splitlines()
    assert table[0].split()[:5] == ["job", "overrides", "steps", "best", "loss"]
    assert table[1].split()[0] == "2" and len(table) == 5


GOOD = {"steps": 4, "metric": "bleu", "best": 30.5, "bleu": 30.5, "chrf": 50.0, "loss": 2.0}


@pytest.mark.parametrize(
    "text, error",
    [
        ("{", "not JSON"),
        ("[1, 2]", "has exactly the fields steps, metric, best"),
        (json.dumps({**GOOD, "minutes": 1.0}), "has exactly the fields"),  # no status
        (json.dumps({**GOOD, "minutes": 1.0, "status": "ended", "extra": 1}), "has exactly the fields"),
        (json.dumps({**GOOD, "minutes": "1", "status": "ended"}), "minutes must be a number, not '1'"),
        (json.dumps({**GOOD, "best": True, "minutes": 1, "status": "ended"}), "best must be a number"),
        (json.dumps({**GOOD, "metric": "rouge", "minutes": 1, "status": "ended"}), "metric must be one of"),
    ],
)
def test_an_edited_result_json_is_refused_naming_the_file(tmp_path: Path, text: str, error: str):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "result.json").write_text(text)
    with pytest.raises(NMTError, match=f"^{re.escape(str(tmp_path / 'job' / 'result.json'))}: .*{error}"):
        job_result(tmp_path / "job", [])
    (tmp_path / "job" / "result.json").write_text(json.dumps({**GOOD, "minutes": 1, "status": "ended"}))
    assert job_result(tmp_path / "job", []).best == 30.5
