"""The final model of a run, chosen on the validation set (never on test).

Which checkpoint translates best depends on the run: the average of the last step checkpoints usually
beats the best single one, but not when they reach back into early training (a slow machine, a short
budget); the length penalty that suits a model is found the same way. So the main job scores each
candidate (and each length penalty asked for, here or by the run's ``final.alphas``) on the validation
split and keeps the winner.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from nmt.checkpoint import (
    atomic_save,
    check_not_training_checkpoint,
    checkpoint_config,
    load_checkpoint,
    make_checkpoint,
)
from nmt.config import DecodingOverrides, EvalDataConfig, EvalFilesConfig, EvaluateConfig, SelectConfig
from nmt.errors import NMTError
from nmt.evaluation.evaluate import mean_scores
from nmt.outputs import check_output_file


@dataclass
class Candidate:
    checkpoint: str
    alpha: float
    bleu: float
    chrf: float


@dataclass
class FinalChoice:
    chosen: Candidate
    candidates: list[Candidate]
    split: str
    output: str  # the final checkpoint
    report: str  # the JSON file describing the choice

    def summary(self) -> str:
        rows = [f"{'checkpoint':<16} {'alpha':>5} {'BLEU':>7} {'chrF':>7}   ({self.split})"]
        for c in self.candidates:
            mark = "  <- chosen" if c is self.chosen else ""
            rows.append(f"{Path(c.checkpoint).name:<16} {c.alpha:>5g} {c.bleu:>7.2f} {c.chrf:>7.2f}{mark}")
        rows.append(
            f"final model: {Path(self.chosen.checkpoint).name} with alpha {self.chosen.alpha:g} "
            f"(highest {self.split} BLEU, chrF breaks ties) -> {self.output}"
        )
        return "\n".join(rows)


def choose_final(cfg: SelectConfig) -> FinalChoice:
    """Score every candidate checkpoint x alpha on ``cfg.split``; save the best as ``cfg.output``."""
    if cfg.split == "test":
        raise NMTError(
            "split=test: the final model and its length penalty are chosen on the validation set; "
            "the test set is scored once, afterwards (scripts/evaluate.py)"
        )
    ckpt_dir = Path(cfg.run_dir) / "checkpoints"
    paths = [ckpt_dir / name for name in cfg.candidates if (ckpt_dir / name).is_file()]
    if not paths:
        raise NMTError(f"candidates={cfg.candidates}: none of them is in {ckpt_dir}")
    output = ckpt_dir / cfg.output
    check_output_file(output, {"candidates": paths}, make_folder=True)  # before the decodes
    check_not_training_checkpoint(output)
    alphas = cfg.alphas or checkpoint_config(load_checkpoint(paths[0])).final.alphas
    out_dir = Path(cfg.run_dir) / "eval" / "selection"
    candidates = []
    for path in paths:
        for alpha in alphas or [None]:
            name = f"{path.stem}.{cfg.split}" + ("" if alpha is None else f".alpha{alpha:g}")
            eval_cfg = EvaluateConfig(
                checkpoint=str(path),
                data=EvalDataConfig(split=cfg.split),
                decoding=DecodingOverrides(alpha=alpha),
                eval=EvalFilesConfig(out=str(out_dir / f"{name}.hyp")),
                device=cfg.device,
            )
            scores, report = mean_scores(eval_cfg, out_dir)  # several directions: their mean
            candidates.append(Candidate(str(path), report.decoding.alpha, scores["bleu"], scores["chrf"]))
    chosen = max(candidates, key=lambda c: (c.bleu, c.chrf))  # ties: the earlier candidate
    ckpt = load_checkpoint(chosen.checkpoint)
    config = {**ckpt["config"], "decoding": {**ckpt["config"]["decoding"], "alpha": chosen.alpha}}
    extra = {key: ckpt[key] for key in ("averaged_from", "parent") if key in ckpt}
    final = make_checkpoint(
        ckpt["model"], config, ckpt["tokenizer"], ckpt["vocab"], ckpt["progress"], **extra
    )
    atomic_save(final, output)
    report_path = Path(cfg.run_dir) / "eval" / "final_choice.json"
    choice = FinalChoice(chosen, candidates, cfg.split, str(output), str(report_path))
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(asdict(choice), indent=2) + "\n")
    return choice
