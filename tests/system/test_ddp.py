"""Data-parallel training on CPU (gloo), through the project's own set-up and training step.

(a) One update over 2 ranks with a batch each equals one update of a single process on the combined
batch (and likewise with 2 accumulated micro-batches per rank, the ``no_sync`` path): the step divides
the summed loss by the target tokens of all ranks, so only float rounding may differ.
(b) ``torchrun --nproc_per_node=2 scripts/train.py`` trains, validates and checkpoints once, from rank 0,
exits 0, and resumes from that checkpoint on 2 ranks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from nmt.checkpoint import load_checkpoint
from nmt.config import TrainConfig
from nmt.data import collate, prepare_corpus
from nmt.training.loop import train_step
from nmt.training.setup import set_up

ROOT = Path(__file__).resolve().parents[2]
# A tiny model without dropout (its masks would differ between the two set-ups), on a small toy corpus.
SMALL = ["data.train_size=300", "data.valid_size=20", "data.test_size=20", "trainer.device=cpu"]
TINY = ["model.d_model=32", "model.ff_dim=64", "model.heads=2", "model.dropout=0.0"]
# Plain SGD at lr 1 with clipping: the update is the (clipped) gradient itself, so comparing weights
# compares gradients. Adam's first update is lr * sign(gradient), which rounding can flip near zero.
SGD_OVERRIDES = ["optim.lr=1.0", "optim.warmup_steps=0", "optim.schedule=constant"]
# Sentence indices per rank: 2 micro-batches of 6 and 10 sentences each.
MICRO = [[list(range(0, 6)), list(range(6, 16))], [list(range(16, 22)), list(range(22, 32))]]


@pytest.fixture(scope="module")
def cache_dir(toy) -> Path:
    """The session's toy data cache (conftest), with this small corpus prepared once in it: the ranks
    and the torchrun runs only read it."""
    cfg = toy.config(*SMALL, *TINY)
    prepare_corpus(cfg.data, cfg.tokenizer, progress=False)
    return toy.data_cache


@pytest.fixture(scope="module")
def sgd_config(toy, cache_dir) -> TrainConfig:
    return toy.config(*SMALL, *TINY, *SGD_OVERRIDES)


def one_update(cfg: TrainConfig, run_dir: Path, micro: list[list[int]]) -> tuple[dict, float]:
    """The real set-up and ``train_step`` (SGD instead of Adam) on micro-batches of these sentences."""
    run = set_up(cfg, run_dir)
    run.monitor.close({})
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=cfg.optim.lr)
    split = run.data.splits["train"]
    batches = [collate(split, idx, cfg.model.max_positions) for idx in micro]
    stats = train_step(run, batches)
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}, stats["all_tokens"]


def _rank(rank: int, port: int, cfg: TrainConfig, out_dir: Path) -> None:
    """One of the 2 processes, with the environment torchrun would give it."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    results = {n: one_update(cfg, out_dir / f"run{rank}", MICRO[rank][-n:]) for n in (1, 2)}
    if rank == 0:
        torch.save(results, out_dir / "ddp.pt")
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_update_equals_single_process_on_the_combined_batch(sgd_config: TrainConfig, tmp_path: Path):
    assert "WORLD_SIZE" not in os.environ
    mp.spawn(_rank, args=(free_port(), sgd_config, tmp_path), nprocs=2, join=True)
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    cfg = sgd_config
    initial = set_up(cfg, tmp_path / "init").model.state_dict()
    for n in (1, 2):  # micro-batches per rank
        ddp_params, ddp_tokens = ddp[n]
        combined = [i for rank in MICRO for idx in rank[-n:] for i in idx]
        single_params, single_tokens = one_update(cfg, tmp_path / f"single{n}", [combined])
        assert ddp_tokens == single_tokens
        moved = sum(float((single_params[k] - initial[k]).abs().sum()) for k in initial)
        assert moved > 1.0  # a real update, not a no-op that would compare equal trivially
        for name, value in single_params.items():
            torch.testing.assert_close(ddp_params[name], value, rtol=1e-4, atol=1e-5, msg=f"{name}, n={n}")


def torchrun_train(toy, run_dir: Path, *extra: str) -> str:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "scripts" / "train.py"),
        *toy.overrides(*SMALL, *TINY),
        "trainer.valid_bleu_sentences=10",
        "trainer.attention_image=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr  # the log goes to stdout, warnings to stderr


@pytest.mark.slow
def test_torchrun_trains_checkpoints_once_and_resumes(toy, cache_dir: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    first = torchrun_train(toy, run_dir, "trainer.max_steps=4", "trainer.valid_every=4")
    assert "2 rank(s)" in first
    assert first.count("stopped after 4 steps") == 1  # rank 0 alone logs ...
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.pt", "last.pt", "step_4.pt"]
    first_state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert first_state["progress"]["step"] == 4
    rng = first_state["rng"]  # each rank's own random state (seeded with seed + rank: own dropout masks)
    assert len(rng) == 2 and not torch.equal(rng[0]["torch"], rng[1]["torch"])

    second = torchrun_train(
        toy, run_dir, "trainer.max_steps=6", "trainer.valid_every=6", "trainer.resume=auto"
    )
    assert second.count("resumed from") == 2  # ... but both ranks restore the same checkpoint
    assert second.count("stopped after 6 steps") == 1
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["progress"]["step"] == 6
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "best.pt",
        "last.pt",
        "step_4.pt",
        "step_6.pt",
    ]
