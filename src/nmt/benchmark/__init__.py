"""How fast training and decoding are, measured on real batches, next to a plain PyTorch reference.

``scripts/benchmark.py`` composes the pieces: :mod:`~nmt.benchmark.hardware` (machine, matmul
ceiling, peak memory), :mod:`~nmt.benchmark.training_speed` (the project's ``train_step`` against
:mod:`~nmt.benchmark.reference`), :mod:`~nmt.benchmark.decoding_speed` (and
:mod:`~nmt.benchmark.ct2_speed`), and :mod:`~nmt.benchmark.report` (the table). What is measured and
why: docs/speed.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from nmt.benchmark.ct2_speed import check_ct2_bench
from nmt.benchmark.decoding_speed import measure_decoding
from nmt.benchmark.hardware import hardware, matmul_ceiling
from nmt.benchmark.reference import ReferenceTransformer, transformer_flops
from nmt.benchmark.report import format_report
from nmt.benchmark.training_speed import measure_training
from nmt.config import BenchConfig, TrainConfig, to_container
from nmt.devices import resolve_precision
from nmt.models import count_parameters
from nmt.training.setup import set_up

__all__ = [
    "ReferenceTransformer",
    "format_report",
    "run_benchmark",
    "split_benchmark_config",
    "transformer_flops",
]


def split_benchmark_config(cfg: DictConfig) -> tuple[TrainConfig, BenchConfig]:
    """scripts/benchmark.py's composed config as the training config it extends and its ``bench``."""
    bench = OmegaConf.to_object(cfg.bench)
    with open_dict(cfg):
        del cfg["bench"]  # the rest is a TrainConfig
    return OmegaConf.to_object(cfg), bench


def run_benchmark(cfg: TrainConfig, bench: BenchConfig, run_dir: Path) -> dict[str, Any]:
    """Measure what ``bench`` asks for; returns the results (also written to ``run_dir/bench.output``)."""
    if bench.decode and bench.ct2:
        check_ct2_bench(cfg, bench)
    with tempfile.TemporaryDirectory() as scratch:  # set_up's TensorBoard writer is of no use here
        run = set_up(cfg, Path(scratch))
        run.monitor.close({})
    extra = [resolve_precision(p, run.device)[0] for p in bench.precisions]
    precisions = list(dict.fromkeys([run.precision, *extra]))  # the run's own first
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "config": {**to_container(cfg), "bench": vars(bench)},
        "hardware": hardware(run.device),
        "model": {
            "arch": cfg.model.arch,
            "parameters": count_parameters(run.model),
            "precision": run.precision,
            "device": str(run.device),
            "compile": cfg.trainer.compile,
        },
        "ceiling_flops": matmul_ceiling(run.device, precisions, bench.matmul_size),
    }
    initial = {k: v.clone() for k, v in run.model.state_dict().items()}
    if bench.train:
        results["train"] = measure_training(run, bench, precisions, results["ceiling_flops"])
    if bench.decode:
        # Decode with the initial weights: a few hundred tiny updates already teach a random model to
        # emit EOS (a frequent token), which would make decoding speed depend on bench.steps.
        run.model.load_state_dict(initial)
        results["decode"] = measure_decoding(run, bench)
    results["hardware"]["load_average_end"] = list(os.getloadavg())
    return results
