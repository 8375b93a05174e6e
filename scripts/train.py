"""Train a model: ``python scripts/train.py [data=local data.dir=...] [model=...] [key=value ...]``."""

import shlex
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.cli import script_main
from nmt.training.loop import train


@script_main("train")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides = [o for o in hydra_cfg.overrides.task if not o.startswith("trainer.resume=")]
    # Quoted for the shell: overrides may hold brackets (lists) or spaces (paths).
    hint = shlex.join(
        ["python", "scripts/train.py", *overrides, f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    )
    train(OmegaConf.to_object(cfg), run_dir, resume_hint=hint)


if __name__ == "__main__":
    main()
