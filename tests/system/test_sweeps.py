"""Sweeps of the training script: ``-m`` (Hydra's basic sweeper and launcher), the Optuna sweeper
(``hparams_search``) and the submitit launcher (``hydra/launcher=submitit_local``, as on Slurm): a folder
per job named by what it varies, its objective, its resume, DDP over a job's tasks, a killed job relaunched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from nmt.checkpoint import load_checkpoint
from nmt.data import prepare_corpus

ROOT = Path(__file__).resolve().parents[2]
# A tiny model on a small toy corpus: each job trains a few updates in a second or two.
SMALL = ["data.train_size=300", "data.valid_size=20", "data.test_size=20", "trainer.device=cpu"]
TINY = ["model.d_model=32", "model.ff_dim=64", "model.heads=2", "model.dropout=0.0"]
SHORT = ["trainer.valid_bleu_sentences=10", "trainer.attention_image=false"]


@pytest.fixture(scope="module")
def job(toy) -> list[str]:
    """The fixed overrides of every job here, its corpus prepared once in the session's toy cache."""
    cfg = toy.config(*SMALL, *TINY)
    prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    return toy.overrides(*SMALL, *TINY, *SHORT)


def sweep(toy, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    done = toy.script("train.py", *args, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def result(job_dir: Path) -> dict:
    return json.loads((job_dir / "result.json").read_text())


def best_in_checkpoint(job_dir: Path) -> float:
    return load_checkpoint(job_dir / "checkpoints" / "last.pt")["progress"]["best"]


@pytest.mark.slow
def test_multirun_jobs_get_folders_named_by_the_sweep_and_resume_their_own(toy, job, tmp_path: Path):
    common = [*job, "trainer.valid_every=2", "trainer.best_metric=loss"]
    sweep(toy, "-m", *common, "trainer.max_steps=2", "optim.lr=1e-3,2e-3", cwd=tmp_path)
    (sweep_dir,) = (tmp_path / "outputs" / "multirun").glob("*/*")  # outputs/multirun/DATE/TIME
    jobs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert jobs == ["optim.lr=0.001", "optim.lr=0.002"]  # the fixed overrides are not in the names
    for name in jobs:
        assert result(sweep_dir / name)["steps"] == 2
        assert result(sweep_dir / name)["best"] == best_in_checkpoint(sweep_dir / name)
    assert result(sweep_dir / jobs[0])["loss"] != result(sweep_dir / jobs[1])["loss"]

    # Relaunched into the same folder with a larger budget: each job continues its own run.
    again = sweep(
        toy,
        "-m",
        *common,
        "trainer.max_steps=4",
        "optim.lr=1e-3,2e-3",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert again.stdout.count("at step 2 (epoch") == 2  # "resumed from <its own last.pt> at step 2"
    for name in jobs:
        assert f"{name}/checkpoints/last.pt at step 2" in again.stdout
        assert result(sweep_dir / name)["steps"] == 4


@pytest.mark.slow
def test_multirun_over_model_composes_each_job(toy, tmp_path: Path):
    vocab = "tokenizer.vocab_size=300"  # the toy preset's
    cfg = toy.config(*SMALL, vocab, preset=False)
    prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    args = toy.overrides(*SMALL, *SHORT, vocab, "trainer.max_steps=1", "trainer.valid_every=1", preset=False)
    sweep(toy, "-m", *args, "model=transformer_tiny,rnnsearch_small", "hydra.sweep.dir=sw", cwd=tmp_path)
    names = {}
    for folder in ("model=transformer_tiny", "model=rnnsearch_small"):
        state = load_checkpoint(tmp_path / "sw" / folder / "checkpoints" / "last.pt")
        names[folder] = state["config"]["model"]["arch"]
    assert names == {"model=transformer_tiny": "transformer", "model=rnnsearch_small": "rnnsearch"}


@pytest.mark.slow
def test_a_sweep_whose_jobs_share_a_folder_is_refused(toy, job, tmp_path: Path):
    done = toy.script(
        "train.py", "-m", *job, "trainer.max_steps=1", "trainer.valid_every=1", "optim.lr=1e-3,2e-3",
        "hydra.sweep.dir=sw", "hydra.sweep.subdir=same", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"error: {tmp_path / 'sw' / 'same'}: jobs 0 and 1 (optim.lr=0.002) of this sweep")
    assert "would share this run dir" in line and "${hydra.job.num}" in line
    assert result(tmp_path / "sw" / "same")["steps"] == 1  # the first job's run is left whole


@pytest.mark.slow
def test_optuna_sweeper_optimizes_the_best_validation_score(toy, job, tmp_path: Path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep(
        toy, "hparams_search=multi30k_optuna", *job, "trainer.max_steps=2", "trainer.valid_every=2",
        "trainer.max_minutes=0", "trainer.best_metric=loss", "hydra.sweeper.direction=minimize",
        "hydra.sweeper.n_trials=3", "hydra.sweep.dir=study", cwd=tmp_path,
    )  # fmt: skip
    study = tmp_path / "study"
    trials = [p for p in study.iterdir() if (p / "result.json").is_file()]
    assert len(trials) == 3
    # Named by what the search varies; model.dropout, fixed by the command (TINY), is not.
    assert all(p.name.startswith("optim.label_smoothing=") and ",optim.lr=" in p.name for p in trials)
    assert not any("model.dropout" in p.name for p in trials)
    found = yaml.safe_load((study / "optimization_results.yaml").read_text())
    scores = {p.name: result(p)["best"] for p in trials}
    assert found["best_value"] == min(scores.values())  # the objective is each trial's best valid loss
    best = min(scores, key=scores.get)
    assert f"optim.warmup_steps={found['best_params']['optim.warmup_steps']}" in best
    assert scores[best] == best_in_checkpoint(study / best)


@pytest.mark.slow
def test_submitit_local_runs_a_two_job_sweep(toy, job, tmp_path: Path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep(
        toy, "-m", "hydra/launcher=submitit_local", *job, "trainer.max_steps=2", "trainer.valid_every=2",
        "optim.lr=1e-3,2e-3", "hydra.sweep.dir=sw", cwd=tmp_path,
    )  # fmt: skip
    for name in ("optim.lr=0.001", "optim.lr=0.002"):
        assert result(tmp_path / "sw" / name)["steps"] == 2


def torchrun(toy, job: list[str], run_dir: Path, cwd: Path) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(ROOT / "scripts" / "train.py"), *job, f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    env = {k: v for k, v in toy.env().items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_a_two_task_submitit_job_trains_as_one_ddp_run_like_torchrun(toy, job, tmp_path: Path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    steps = [*job, "trainer.max_steps=4", "trainer.valid_every=2"]
    sweep(
        toy, "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", *steps,
        "hydra.sweep.dir=sw", cwd=tmp_path,
    )  # fmt: skip
    log = "".join(p.read_text() for p in (tmp_path / "sw" / ".submitit").glob("*/*_0_log.out"))
    assert "2 rank(s)" in log
    torchrun(toy, steps, tmp_path / "torchrun", tmp_path)
    ours = load_checkpoint(tmp_path / "sw" / "checkpoints" / "last.pt")
    theirs = load_checkpoint(tmp_path / "torchrun" / "checkpoints" / "last.pt")
    assert [h["loss"] for h in ours["progress"]["history"]] == [
        h["loss"] for h in theirs["progress"]["history"]
    ]
    assert len(ours["rng"]) == 2  # a random state per rank: one run of 2 ranks, not 2 runs
    for name, value in theirs["model"].items():
        assert torch.equal(ours["model"][name], value), name


def wait_for(path_glob, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path_glob():
        assert time.monotonic() < deadline, "the job wrote no checkpoint in time"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_killed_submitit_job_relaunched_continues(toy, job, tmp_path: Path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")

    def command(max_steps: int) -> list[str]:
        return [
            "-m", "hydra/launcher=submitit_local", *job, f"trainer.max_steps={max_steps}",
            "trainer.valid_every=2", "hydra.sweep.dir=sw",
        ]  # fmt: skip

    ckpts = tmp_path / "sw" / "checkpoints"
    launcher = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *command(400)], cwd=tmp_path, env=toy.env(),
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: list(ckpts.glob("step_*.pt")))
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher, submitit's controller and the task
        launcher.wait()
    killed_at = load_checkpoint(ckpts / "last.pt")["progress"]["step"]
    assert 0 < killed_at < 400 and not (tmp_path / "sw" / "result.json").exists()
    sweep(toy, *command(killed_at + 2), cwd=tmp_path)
    log = "".join(p.read_text() for p in (tmp_path / "sw" / ".submitit").glob("*/*_0_log.out"))
    assert f"at step {killed_at} (epoch" in log  # resumed from its last.pt
    assert result(tmp_path / "sw")["steps"] == killed_at + 2


def hparams_sessions(tb_dir: Path) -> dict:
    """The hparams plugin's session record of a run's TensorBoard (what its HPARAMS tab lists)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {key: value.ListFields()[0][1] for key, value in start.hparams.items()}


@pytest.mark.slow
def test_pipeline_sweep_tests_each_job_and_the_summary_lists_them(toy, job, tmp_path: Path):
    done = toy.script(
        "pipeline.py", "-m", *job, "trainer.max_steps=4", "trainer.valid_every=2", "decoding.beam_size=2",
        "pipeline.alphas=[1.0]", "optim.lr=1e-3,2e-3", "hydra.sweep.dir=sw", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("optim.lr=0.001", "optim.lr=0.002"):
        folder = tmp_path / "sw" / name
        assert {p.name for p in (folder / "checkpoints").iterdir()} >= {"averaged.pt", "final.pt"}
        assert json.loads((folder / "eval" / "final_choice.json").read_text())
        (report,) = (folder / "eval").glob("final.test.beam2.json")  # each job ends with its test report
        assert result(folder)["steps"] == 4
        hparams = hparams_sessions(folder / "tb")  # TensorBoard's HPARAMS tab: the swept value, per job
        assert hparams["optim.lr"] == float(name.split("=")[1])
    summary = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sweep_summary.py"), str(tmp_path / "sw")],
        capture_output=True, text=True, env=toy.env(), timeout=60,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    head, *rows, csv_line = summary.stdout.splitlines()
    assert head.split()[:4] == ["job", "overrides", "steps", "best"]
    assert sorted(r.split()[1] for r in rows) == ["optim.lr=0.001", "optim.lr=0.002"]
    table = (tmp_path / "sw" / "sweep_summary.csv").read_text().splitlines()
    assert table[0].startswith("job,num,overrides,steps,metric,best") and len(table) == 3
