"""Data preparation at scale: ``python scripts/benchmark_prepare.py ['sizes=[100000,400000]']``. Builds
corpora of N unique pairs from local parallel text and prepares each from scratch in a fresh process:
wall time, pairs/s apart from the SentencePiece trainer, the trainer's own time and peak, peak RSS and
cache bytes per pair; prints a table, writes JSON (docs/speed.md)."""

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.benchmark.prepare_speed import format_prepare, run_prepare_speed
from nmt.runs.cli import script_main


@script_main("benchmark_prepare")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    results = run_prepare_speed(cfg)
    path = Path(HydraConfig.get().runtime.output_dir) / cfg.output
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(format_prepare(results))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
