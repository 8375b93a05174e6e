"""Training throughput: the project's ``train_step`` and the reference, taking turns on the same batches.

The two alternate step by step (A B A B ...), so load changes on a shared machine hit both alike;
ratios are medians of per-batch ratios. Each precision gets its own copy of the run (own gradient
scaler and schedule position) sharing the model and optimizer, so the caller's run is left as it was.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from nmt.benchmark.hardware import MiB, PeakMemory, synchronize
from nmt.benchmark.reference import ReferenceTrainer, transformer_flops
from nmt.benchmark.step_profile import profile_steps
from nmt.config import BenchConfig
from nmt.data import Batch, collate
from nmt.errors import NMTError
from nmt.models import Transformer
from nmt.training.loop import train_step
from nmt.training.setup import Progress, Run

log = logging.getLogger(__name__)


def real_batches(run: Run, count: int) -> tuple[list[Batch], list[float]]:
    """The first ``count`` batches the training sampler hands out, and how long each took to collate."""
    split, batches, seconds = run.data.splits["train"], [], []
    for indices in run.sampler:
        start = time.perf_counter()
        batches.append(collate(split, indices, run.cfg.model.max_positions).to(run.device))
        seconds.append(time.perf_counter() - start)
        if len(batches) == count:
            return batches, seconds
    raise NMTError(f"the training split has fewer than {count} batches; lower bench.steps")


def timed(fn: Callable[[], Any], device: torch.device, memory: PeakMemory) -> tuple[float, int]:
    """Seconds and peak memory (bytes) of ``fn()``."""
    memory.reset()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start, memory.peak()


def project_step(turn: Run, batch: Batch) -> None:
    """One update as train() makes it, on a copy of the run (its own precision, scaler, schedule)."""
    train_step(turn, [batch])
    turn.progress.step += 1  # the learning rate follows the schedule


def measure_training(
    run: Run, bench: BenchConfig, precisions: list[str], ceilings: dict[str, float]
) -> dict[str, Any]:
    """Project and reference steps, in every precision, taking turns on the same real batches.

    Results are keyed "project fp32", "reference bf16", ...; ``ceilings`` are the device's matmul
    FLOP/s per precision. Both models keep training across precisions (speed does not depend on the
    weights); each precision has its own gradient scaler, as a run in that precision would.
    """
    batches, collate_s = real_batches(run, bench.warmup_steps + bench.steps)
    steps = training_steps(run, bench, precisions)
    memory = PeakMemory(run.device)
    times, peaks, first_step = take_turns(run, bench, batches, steps, memory)
    measured = batches[bench.warmup_steps :]
    real = [b.src_tokens + b.tgt_tokens for b in measured]
    flops = [transformer_flops(run.model, b) for b in measured] if isinstance(run.model, Transformer) else []
    out: dict[str, Any] = {
        "steps": bench.steps,
        "warmup_steps": bench.warmup_steps,
        "batches": batch_summary(run, measured, collate_s[bench.warmup_steps :]),
        "model_flops_per_token": sum(flops) / sum(real) if flops else None,
        "first_step_s": first_step,
        "memory_peak_is_per_step": memory.resettable,
        "results": {},
    }
    if bench.profile_steps:
        own, _ = steps[f"project {run.precision}"]
        out["profile"] = profile_steps(own, (measured * bench.profile_steps)[: bench.profile_steps])
    for name, seconds in times.items():
        result = step_result(measured, seconds, peaks[name])
        if flops:
            result["model_flops_per_s_median"] = statistics.median(f / s for f, s in zip(flops, seconds))
            result["share_of_ceiling"] = result["model_flops_per_s_median"] / ceilings[steps[name][1]]
        out["results"][name] = result
    return {**out, **speed_ratios(times, precisions, bench.reference)}


Step = tuple[Callable[[Batch], None], str]  # one update on a batch, and its precision


def training_steps(run: Run, bench: BenchConfig, precisions: list[str]) -> dict[str, Step]:
    """The updates that take turns, by name: the project's in each precision, with ``bench.reference``
    the reference's too."""
    steps: dict[str, Step] = {}
    for precision in precisions:
        turn = replace(
            run, precision=precision, scaler=scaler_for(run.device, precision), progress=Progress()
        )
        steps[f"project {precision}"] = (functools.partial(project_step, turn), precision)
    if bench.reference:
        if not isinstance(run.model, Transformer):
            raise NMTError("bench.reference=true needs model.arch=transformer (or set bench.reference=false)")
        tok = run.data.tokenizer
        reference = ReferenceTrainer(run.cfg, dict(run.model.vocab_sizes), tok.joint, run.device)
        for precision in precisions:
            scaler = scaler_for(run.device, precision)
            steps[f"reference {precision}"] = (
                functools.partial(reference.step, precision=precision, scaler=scaler),
                precision,
            )
    return steps


def take_turns(
    run: Run, bench: BenchConfig, batches: list[Batch], steps: dict[str, Step], memory: PeakMemory
) -> tuple[dict[str, list[float]], dict[str, list[int]], float]:
    """Every step on each batch in turn: the seconds and peak memory of each measured one, by step name,
    and the seconds of the run's own first step."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    peaks: dict[str, list[int]] = {name: [] for name in steps}
    first_step = 0.0
    log.info(
        "training: %d warmup + %d measured batches, each timed for %s",
        len(batches) - bench.steps,
        bench.steps,
        ", ".join(steps),
    )
    for i, batch in enumerate(batches):
        for name, (step, _) in steps.items():
            seconds, peak = timed(functools.partial(step, batch), run.device, memory)
            if i == 0 and name == f"project {run.precision}":
                first_step = seconds  # includes torch.compile's compilation with trainer.compile=true
            if i >= bench.warmup_steps:
                times[name].append(seconds)
                peaks[name].append(peak)
    return times, peaks, first_step


def batch_summary(run: Run, measured: list[Batch], collate_s: list[float]) -> dict[str, Any]:
    """What the measured batches hold, and how long collating them took."""
    real = [b.src_tokens + b.tgt_tokens for b in measured]
    padded = sum(b.src.numel() + b.tgt_in.numel() for b in measured)
    return {
        "max_tokens": run.cfg.trainer.max_tokens,
        "sentences_mean": statistics.mean(len(b) for b in measured),
        "real_tokens_mean": statistics.mean(real),
        "tgt_tokens_mean": statistics.mean(b.tgt_tokens for b in measured),
        "padding_fraction": 1.0 - sum(real) / padded,
        "collate_ms_median": 1000 * statistics.median(collate_s),
    }


def step_result(measured: list[Batch], seconds: list[float], peaks: list[int]) -> dict[str, Any]:
    """One step's speed over the measured batches: medians, peak memory and each step's time."""
    real = [b.src_tokens + b.tgt_tokens for b in measured]
    return {
        "step_ms_median": 1000 * statistics.median(seconds),
        "tokens_per_s_median": statistics.median(n / s for n, s in zip(real, seconds)),
        "tgt_tokens_per_s_median": statistics.median(b.tgt_tokens / s for b, s in zip(measured, seconds)),
        "peak_memory_mib": max(peaks) / MiB,
        "step_ms": [round(1000 * x, 2) for x in seconds],  # per measured step, in batch order
    }


def speed_ratios(times: dict[str, list[float]], precisions: list[str], reference: bool) -> dict[str, Any]:
    """The project over the reference in each precision (with ``reference``), and each precision over
    fp32."""

    def paired(slow: str, fast: str) -> float:
        """Median over batches of time(slow) / time(fast): how many times faster ``fast`` is."""
        return statistics.median(a / b for a, b in zip(times[slow], times[fast]))

    out: dict[str, Any] = {}
    if reference:
        out["project_over_reference"] = {p: paired(f"reference {p}", f"project {p}") for p in precisions}
    out["speedup_over_fp32"] = {
        f"{model} {p}": paired(f"{model} fp32", f"{model} {p}")
        for p in precisions
        if p != "fp32" and "fp32" in precisions
        for model in ("project", "reference")
        if f"{model} {p}" in times
    }
    return out


def scaler_for(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling only for fp16, as set_up decides."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
