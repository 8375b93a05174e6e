"""The main job as one Hydra job: train, average, choose the final model on valid, test it.

    python scripts/pipeline.py experiment=multi30k_cpu [pipeline.average_last=5] ['pipeline.alphas=[1.0,2.0]']
    python scripts/pipeline.py -m experiment=toy optim.lr=1e-3,2e-3            # per job, each tested
    python scripts/pipeline.py hparams_search=multi30k_optuna experiment=multi30k_cpu

Takes every setting of scripts/train.py plus ``pipeline.*`` (nmt.config.PipelineConfig); returns the
run's best validation score by ``trainer.best_metric`` (a sweeper's objective: never the test score).
"""

import shlex
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from nmt.cli import launch_id, script_main
from nmt.pipeline import run_pipeline, split_pipeline_config
from nmt.sweep import check_direction, claim_run_dir, job_result, objective, write_result
from nmt.training.distributed import launched_rank


@script_main("pipeline")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    task = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        check_direction(hydra_cfg.sweeper.get("direction"), cfg.trainer.best_metric)
        claim_run_dir(run_dir, task, hydra_cfg.job.num, launch_id())
    overrides = [o for o in task if not o.startswith("trainer.resume=")]
    hint = shlex.join(
        ["python", "scripts/pipeline.py", *overrides, f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    )
    train_cfg, steps = split_pipeline_config(cfg)
    rank = launched_rank()
    run_pipeline(train_cfg, steps, run_dir, resume_hint=hint, rank=rank)
    return objective(write_result(run_dir, task) if rank == 0 else job_result(run_dir, task))


if __name__ == "__main__":
    main()
