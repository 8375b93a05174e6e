"""Training and decoding throughput, next to a plain torch.nn.Transformer: ``python scripts/benchmark.py``.

Takes every setting of scripts/train.py plus ``bench.*`` (nmt.config.BenchConfig); prints a table and
writes the results as JSON into the run dir. What is measured and how: docs/speed.md.
"""

import json
import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from nmt.benchmark import format_report, run_benchmark, split_benchmark_config
from nmt.runs.cli import script_main

log = logging.getLogger("benchmark")


@script_main("benchmark")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    train_cfg, bench = split_benchmark_config(cfg)
    results = run_benchmark(train_cfg, bench, run_dir)
    path = run_dir / bench.output
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(format_report(results))
    log.info("results written to %s", path)


if __name__ == "__main__":
    main()
