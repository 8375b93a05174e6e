"""The jobs of a sweep as a table, best first: ``python scripts/sweep_summary.py outputs/multirun/DATE/TIME``.

A line per job (its folder, the overrides it varies, steps, best validation score by trainer.best_metric,
the last validation's BLEU, chrF and loss, training minutes, whether it ended); also written as CSV
(default: sweep_summary.csv in the sweep's folder). TensorBoard shows the same in its HPARAMS tab:
``tensorboard --logdir outputs/multirun/DATE/TIME``.
"""

import argparse
import sys
from pathlib import Path

from nmt.cache import atomic_write_text
from nmt.errors import NMTError
from nmt.sweep import format_table, ranked, summarize, to_csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="the sweep's folder (hydra.sweep.dir)")
    parser.add_argument("--csv", type=Path, help="where the CSV goes (default: DIR/sweep_summary.csv)")
    args = parser.parse_args()
    try:
        rows = ranked(summarize(args.sweep_dir))
        output = args.csv or args.sweep_dir / "sweep_summary.csv"
        atomic_write_text(output, to_csv(rows))
    except NMTError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print(format_table(rows))
    print(f"csv: {output}")


if __name__ == "__main__":
    main()
