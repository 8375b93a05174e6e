"""Does a change to the code leave training bitwise the same? ``python -m nmt.training.sameness BASE HEAD
OUT [--data-dir DIR] [OVERRIDE ...]`` trains the main job's preset on the checkouts BASE and HEAD (their
``src/`` and ``scripts/``; ``git worktree add BASE COMMIT`` makes one) and prints what differs.

It trains the same short run on two checkouts (say, a commit before a refactor and the working tree after
it) and compares every update's loss, every weight, the optimizer's state (Adam's ``exp_avg``,
``exp_avg_sq``, ``step``), the sampler's position, the random states and the progress record, bit for bit.

Each checkout trains in a child process on its own ``src/`` (``PYTHONPATH``) and its own
``scripts/train.py``, pinned to one core with one thread: this module is run as that child's script, so it
imports nothing of ``nmt`` at module level and reads only what every version of the loop has (the
``batch_loss`` it calls). ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` pass through to the children.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

# The main job's preset, 200 updates in fp32: enough to cross every code path of an update, short enough
# to run twice in a few minutes on one core. data.dir and the output folders are added per run.
PRESET = (
    "experiment=multi30k_cpu",
    "trainer.max_steps=200",
    "trainer.precision=fp32",
    "trainer.progress=false",
)
LOSSES = "losses.json"
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
COMPARED = ("model", "optimizer", "scaler", "sampler", "rng", "progress")
NOT_COMPARED = {"elapsed_s"}  # wall-clock time: never the same twice


def train_checkout(checkout: Path, out: Path, overrides: list[str]) -> Path:
    """Train ``checkout``'s code with ``overrides`` into ``out`` (a child process); its ``last.pt``."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    args = [f"data.cache_dir={out / 'cache'}", f"hydra.run.dir={run_dir}", "trainer.resume=null"]
    env = {**os.environ, **SINGLE_THREAD, "PYTHONPATH": str(checkout / "src"), "PYTHONSAFEPATH": "1"}
    command = [sys.executable, __file__, "--record", str(out / LOSSES), str(checkout / "scripts/train.py")]
    with open(out / "train.log", "w") as log:
        done = subprocess.run([*command, *overrides, *args], env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"training {checkout} failed (exit {done.returncode}): see {out / 'train.log'}")
    return run_dir / "checkpoints" / "last.pt"


def record(losses_path: Path, script: Path, overrides: list[str]) -> None:
    """The child: run ``script`` on one core, writing the loss of every micro-batch to ``losses_path``."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    from nmt.training import loop  # the checkout's, by PYTHONPATH

    losses: list[float] = []
    batch_loss = loop.batch_loss

    def recorded(*args: Any, **kwargs: Any):
        loss, nll = batch_loss(*args, **kwargs)
        losses.append(float(loss.detach()))  # float32 -> float64 is exact
        return loss, nll

    loop.batch_loss = recorded
    sys.argv = [str(script), *overrides]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        losses_path.write_text(json.dumps([x.hex() for x in losses]))


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two checkpoint values differ: tensors bit for bit, floats exactly, the rest by ``==``."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes()
        )
        return [] if same else [f"{where}: tensors differ"]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(map(str, set(a) ^ set(b)))} in one only"]
        found = [differences(a[k], b[k], f"{where}.{k}") for k in a if k not in NOT_COMPARED]
        return [line for lines in found for line in lines]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items against {len(b)}"]
        return [line for i, (x, y) in enumerate(zip(a, b)) for line in differences(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = a.hex() == b.hex() or (math.isnan(a) and math.isnan(b))
        return [] if same else [f"{where}: {a!r} against {b!r}"]
    return [] if a == b else [f"{where}: {a!r} against {b!r}"]


def compare_runs(a: Path, b: Path) -> list[str]:
    """What differs between the runs written to folders ``a`` and ``b`` by :func:`train_checkout`."""
    losses = [json.loads((out / LOSSES).read_text()) for out in (a, b)]
    found = differences(losses[0], losses[1], "losses")
    if not losses[0]:
        found.append("losses: none recorded")
    states = [
        torch.load(out / "run/checkpoints/last.pt", map_location="cpu", weights_only=False) for out in (a, b)
    ]
    for key in COMPARED:
        found += differences(states[0].get(key), states[1].get(key), key)
    return found


def check(base: Path, head: Path, out: Path, overrides: list[str]) -> list[str]:
    """Train ``base`` then ``head`` into ``out/base`` and ``out/head``; what differs (empty: the same)."""
    for name, checkout in (("base", base), ("head", head)):
        train_checkout(checkout.resolve(), out / name, overrides)
    return compare_runs(out / "base", out / "head")


def main(argv: list[str]) -> int:
    """The check's command line; ``--record`` is the child's."""
    if argv[:1] == ["--record"]:
        record(Path(argv[1]), Path(argv[2]), argv[3:])
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m nmt.training.sameness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("base", type=Path, help="the checkout before the change")
    parser.add_argument("head", type=Path, help="the checkout after it")
    parser.add_argument("out", type=Path, help="a folder for both runs (base/, head/)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path("../shared/data/multi30k-de-en"), help="Multi30k"
    )
    parser.add_argument("overrides", nargs="*", help=f"after the preset: {' '.join(PRESET)}")
    args = parser.parse_args(argv)
    overrides = [*PRESET, f"data.dir={args.data_dir.resolve()}", *args.overrides]
    found = check(args.base, args.head, args.out, overrides)
    updates = len(json.loads((args.out / "head" / LOSSES).read_text()))
    print(
        "\n".join(found) if found else f"bitwise the same: {updates} losses, weights, optimizer, sampler, rng"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
