"""PyTorch and CTranslate2, each at its best configuration for the cores, side by side:
``python scripts/benchmark_decoders.py checkpoint=PATH ct2_model=DIR [shortlist=FILE ct2_vmap_model=DIR]``.

Times PyTorch per thread count and as single-threaded processes (with and without the shortlist),
CTranslate2 called directly per thread layout, and backend=ct2 (with and without its vocabulary map),
in turns on a split's sentences (test by default) with the checkpoint's decoding settings (or
``decoding.*``); prints a table with each row's BLEU, writes JSON. Kernels capped at AVX2: prefix
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2``."""

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.benchmark.decoders import format_decoders, run_decoders_speed
from nmt.runs.cli import script_main


@script_main("benchmark_decoders")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    results = run_decoders_speed(cfg)
    path = Path(HydraConfig.get().runtime.output_dir) / cfg.output
    path.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(format_decoders(results)))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
