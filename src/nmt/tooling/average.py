"""Checkpoint averaging (Vaswani et al. average the last 5 or 20 checkpoints for their BLEU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nmt.checkpoint import (
    check_not_training_checkpoint,
    check_same_task,
    checkpoint_step,
    checkpoint_task,
    load_checkpoint,
    make_checkpoint,
    step_checkpoints,
)
from nmt.errors import NMTError
from nmt.outputs import check_output_file


def last_checkpoints(run_dir: Path, count: int, window: float = 0.0) -> list[Path]:
    """The newest ``count`` step_N.pt of a run (or of its checkpoints/ folder); with ``window`` > 0 only
    those from the last ``window`` share of the run's steps (0.2: steps >= 80 % of the newest one)."""
    folder = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    found = step_checkpoints(folder)
    if not found:
        raise NMTError(f"no step_N.pt checkpoints in {folder}")
    if window > 0:
        newest = checkpoint_step(found[-1])
        found = [p for p in found if checkpoint_step(p) >= (1 - window) * newest]
    return found[-count:]


def check_average_output(output: Path, paths: list[Path]) -> None:
    """Refuse, before loading a checkpoint, an ``output`` that is one of the averaged ``paths`` or a
    checkpoint training resumes from, or that cannot be written."""
    check_output_file(output, {"inputs": paths}, make_folder=True)
    check_not_training_checkpoint(output)


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """A checkpoint whose weights are the mean of ``paths``' weights (config, tokenizer of the last).

    Refuses checkpoints of different directions, SentencePiece models (as an ensemble does),
    architectures or vocabulary sizes. Training state (optimizer, sampler) is dropped: the result is for
    evaluation and translation, not for resuming.
    """
    if not paths:
        raise NMTError("nothing to average: no checkpoints given")
    first = load_checkpoint(paths[0])
    task = checkpoint_task(first)
    total = {k: v.detach().double().clone() for k, v in first["model"].items()}
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        check_same_task(str(path), checkpoint_task(ckpt), str(paths[0]), task, "the checkpoints averaged")
        if ckpt["config"]["model"] != first["config"]["model"] or ckpt["vocab"] != first["vocab"]:
            raise NMTError(
                f"cannot average {path} with {paths[0]}: different model architecture or vocabulary "
                f"({ckpt['config']['model']} vs {first['config']['model']})"
            )
        if ckpt["model"].keys() != total.keys() or any(
            ckpt["model"][k].shape != v.shape for k, v in total.items()
        ):
            raise NMTError(f"cannot average {path} with {paths[0]}: different parameter names or shapes")
        for k, v in ckpt["model"].items():
            total[k] += v.double()
    last = ckpt if len(paths) > 1 else first
    averaged = {k: (v / len(paths)).to(first["model"][k].dtype) for k, v in total.items()}
    return make_checkpoint(
        averaged,
        last["config"],
        last["tokenizer"],
        last["vocab"],
        last.get("progress", {}),
        averaged_from=[str(p) for p in paths],
        **{key: last[key] for key in ("parent",) if key in last},  # a fine-tune's parent checkpoint
    )
