"""The jobs of a sweep as a table, best first: ``python scripts/sweep_summary.py outputs/multirun/DATE/TIME``.

A line per job (its number, the overrides the sweep varies, steps, best validation score by
trainer.best_metric, the last validation's BLEU, chrF and loss, training minutes, whether it ended); also
written as CSV (``csv=PATH``; default: sweep_summary.csv in the sweep's folder). TensorBoard compares the
same in its HPARAMS tab: ``tensorboard --logdir outputs/multirun/DATE/TIME``.
"""

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.cache import atomic_write_text
from nmt.runs.cli import script_main
from nmt.runs.sweep import format_table, ranked, summarize, to_csv


@script_main("sweep_summary")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    rows = ranked(summarize(Path(cfg.dir)))
    output = Path(cfg.csv) if cfg.csv else Path(cfg.dir) / "sweep_summary.csv"
    atomic_write_text(output, to_csv(rows))
    print(format_table(rows))
    print(f"csv: {output}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and Path(sys.argv[1]).is_dir():  # the folder alone, as a path
        sys.argv[1] = f"dir={sys.argv[1]}"
    main()
