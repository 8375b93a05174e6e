"""The main job as one function: train (preparing the data through the cache), average the newest step
checkpoints, choose the final model on the validation set, evaluate it on the test set. As one Hydra job
(scripts/pipeline.py) it runs per job under ``-m``, a sweeper or a launcher, and ``scripts/run.sh`` calls
it for a single run."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from nmt.checkpoint import atomic_save, step_checkpoints
from nmt.config import (
    EvalDataConfig,
    EvalFilesConfig,
    EvaluateConfig,
    PipelineConfig,
    SelectConfig,
    TrainConfig,
)
from nmt.evaluation.evaluate import evaluate_directions, format_directions, report_dir
from nmt.evaluation.selection import choose_final
from nmt.metrics import format_scores
from nmt.tooling.average import average_checkpoints, last_checkpoints
from nmt.training.loop import train

log = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    final: Path  # checkpoints/final.pt
    selection: str  # the choice on valid, as a table
    test_report: Path | None  # eval/final.test...json (None with pipeline.test=false)
    test_scores: str  # BLEU and chrF on test, with their signatures


def split_pipeline_config(cfg: DictConfig) -> tuple[TrainConfig, PipelineConfig]:
    """scripts/pipeline.py's composed config as the training config it extends and its ``pipeline``."""
    steps = OmegaConf.to_object(cfg.pipeline)
    with open_dict(cfg):
        del cfg["pipeline"]  # the rest is a TrainConfig
    return OmegaConf.to_object(cfg), steps


def run_pipeline(
    cfg: TrainConfig, steps: PipelineConfig, run_dir: Path, resume_hint: str = "", rank: int = 0
) -> PipelineResult | None:
    """Train into ``run_dir`` (or continue it: trainer.resume), then average, select and test; the other
    ranks of a multi-process run (``rank`` > 0) only train, and return None."""
    train(cfg, run_dir, resume_hint=resume_hint)
    if rank != 0:
        return None
    ckpt_dir = run_dir / "checkpoints"
    if steps.average_last > 0 and step_checkpoints(ckpt_dir):
        paths = last_checkpoints(run_dir, steps.average_last)
        atomic_save(average_checkpoints(paths), ckpt_dir / "averaged.pt")
        log.info("averaged %d checkpoints (%s)", len(paths), ", ".join(p.name for p in paths))
    choice = choose_final(SelectConfig(run_dir=str(run_dir), alphas=steps.alphas, device=cfg.trainer.device))
    log.info("final model chosen on valid:\n%s", choice.summary())
    final = Path(choice.output)
    if not steps.test:
        return PipelineResult(final, choice.summary(), None, "")
    test = EvaluateConfig(
        checkpoint=str(final),
        data=EvalDataConfig(split="test"),
        eval=EvalFilesConfig(tb_dir=str(run_dir)),
        device=cfg.trainer.device,
    )
    reports, overall = evaluate_directions(test, report_dir(final))  # several: each direction's, a table
    scores = format_scores(reports[0].scores) if overall is None else format_directions(reports)
    report = overall or Path(reports[0].report)
    log.info("test (%s):\n%s\nreport: %s", final, scores, report)
    return PipelineResult(final, choice.summary(), report, scores)
