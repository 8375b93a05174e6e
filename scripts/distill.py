"""Sequence-level distillation: ``python scripts/distill.py teacher=PATH`` (or ``teacher=[a.pt,b.pt]``).

The teacher translates the training sources of its data (or of ``data=...``) with its tuned beam search
(override with ``decoding.*``); the corpus is cached under ``{data.cache_dir}/distilled/<key>/``. An
interrupted run continues where it stopped. Prints the corpus folder and the command that trains the
student on it (docs/distillation.md).
"""

from omegaconf import DictConfig, OmegaConf

from nmt.runs.cli import script_main
from nmt.tooling.distill import distill


@script_main("distill")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    corpus = distill(cfg, progress=True)
    now = corpus.translated_now
    speed = f", {now / corpus.seconds:.1f} sent/s" if now else ""
    print(
        f"distilled {corpus.distilled} training sentences ({now} translated now{speed}, "
        f"{corpus.distilled - now} from the cache; {corpus.empty} empty)"
    )
    print(f"corpus: {corpus.folder} ({corpus.train_pairs} training pairs)")
    print(f"train the student: {corpus.student_command()}")


if __name__ == "__main__":
    main()
