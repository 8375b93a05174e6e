"""Train a model: ``python scripts/train.py [data=local data.dir=...] [model=...] [key=value ...]``.

Returns the run's best validation score by ``trainer.best_metric``: the objective of a sweeper
(``hparams_search=multi30k_optuna``). Under ``-m`` each job trains in its own folder (docs/training.md).
"""

import shlex
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nmt.cli import launch_id, script_main
from nmt.sweep import check_direction, claim_run_dir, job_result, objective, write_result
from nmt.training.distributed import launched_rank
from nmt.training.loop import train


@script_main("train")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    task = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        check_direction(hydra_cfg.sweeper.get("direction"), cfg.trainer.best_metric)
        claim_run_dir(run_dir, task, hydra_cfg.job.num, launch_id())
    overrides = [o for o in task if not o.startswith("trainer.resume=")]
    # Quoted for the shell: overrides may hold brackets (lists) or spaces (paths).
    hint = shlex.join(
        ["python", "scripts/train.py", *overrides, f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    )
    train(OmegaConf.to_object(cfg), run_dir, resume_hint=hint)
    return objective(write_result(run_dir, task) if launched_rank() == 0 else job_result(run_dir, task))


if __name__ == "__main__":
    main()
