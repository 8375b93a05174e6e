"""Evaluate a checkpoint: ``python scripts/evaluate.py checkpoint=PATH [data.split=test] ...``.

Prints BLEU and chrF (sacrebleu, with signatures), what is wrong with the outputs (length ratio,
repetition loops, words copied from the source), with ``eval.by_length=true`` the scores per
source-length bucket; writes the hypotheses and a JSON report into ``eval/`` beside the run's
checkpoints folder. A multilingual checkpoint: every direction it trained (``tgt_lang=`` for one), a
table of their scores and one report of them all.
"""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.config import checkpoint_paths
from nmt.evaluation.evaluate import evaluate_directions, format_directions, report_dir
from nmt.metrics import format_by_length, format_scores
from nmt.runs.cli import script_main


@script_main("evaluate")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    reports, overall = evaluate_directions(cfg, report_dir(Path(checkpoint_paths(cfg.checkpoint)[0])))
    if overall is not None:  # a multilingual model, every direction it trained
        print(format_directions(reports))
        print(f"reports: {', '.join(r.report for r in reports)}\nreport: {overall}")
        return
    report = reports[0]
    print(format_scores(report.scores))
    print(report.outputs.summary())
    if report.by_length:
        print(format_by_length(report.by_length))
    print(
        f"{report.sentences} sentences in {report.elapsed_s:.1f} s "
        f"({report.sentences_per_s:.1f} sent/s, {report.tokens_per_s:.0f} tok/s)"
    )
    print(f"hypotheses: {report.hypotheses}\nreport: {report.report}")


if __name__ == "__main__":
    main()
