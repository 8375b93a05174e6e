"""The main job as one Hydra job: train, average, choose the final model on valid, test it.

    python scripts/pipeline.py experiment=multi30k_cpu [pipeline.average_last=5] ['pipeline.alphas=[1.0,2.0]']
    python scripts/pipeline.py -m experiment=toy optim.lr=1e-3,2e-3            # per job, each tested
    python scripts/pipeline.py hparams_search=multi30k_optuna experiment=multi30k_cpu

Takes every setting of scripts/train.py plus ``pipeline.*`` (nmt.config.PipelineConfig); returns the
run's best validation score by ``trainer.best_metric`` (a sweeper's objective: never the test score).
"""

from omegaconf import DictConfig

from nmt.runs.cli import script_main
from nmt.runs.pipeline import run_pipeline, split_pipeline_config
from nmt.runs.sweep import end_job, start_job
from nmt.training.distributed import launched_rank


@script_main("pipeline")
def main(cfg: DictConfig) -> float:
    job = start_job("pipeline", cfg.trainer.best_metric)
    train_cfg, steps = split_pipeline_config(cfg)
    rank = launched_rank()
    run_pipeline(train_cfg, steps, job.run_dir, resume_hint=job.resume_hint, rank=rank)
    return end_job(job, rank)


if __name__ == "__main__":
    main()
