"""backend=ct2 against CTranslate2 called directly: ``python scripts/benchmark_ct2.py checkpoint=PATH
ct2_model=DIR ['layouts=[1x2,2x1,1x1]'] [repeats=5]``. The checkpoint's decoding settings (or
``decoding.*``) on a split's sentences, per thread layout, side by side; prints a table, writes JSON.
Kernels capped at AVX2: prefix ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2``."""

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.benchmark.ct2_speed import format_direct, run_ct2_speed
from nmt.runs.cli import script_main


@script_main("benchmark_ct2")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    results = run_ct2_speed(cfg)
    path = Path(HydraConfig.get().runtime.output_dir) / cfg.output
    path.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(format_direct(results)))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
