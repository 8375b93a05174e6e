"""Train a model: ``python scripts/train.py [data=local data.dir=...] [model=...] [key=value ...]``.

Returns the run's best validation score by ``trainer.best_metric``: the objective of a sweeper
(``hparams_search=multi30k_optuna``). Under ``-m`` each job trains in its own folder (docs/training.md).
"""

from omegaconf import DictConfig, OmegaConf

from nmt.runs.cli import script_main
from nmt.runs.sweep import end_job, start_job
from nmt.training.distributed import launched_rank
from nmt.training.loop import train


@script_main("train")
def main(cfg: DictConfig) -> float:
    job = start_job("train", cfg.trainer.best_metric)
    train(OmegaConf.to_object(cfg), job.run_dir, resume_hint=job.resume_hint)
    return end_job(job, launched_rank())


if __name__ == "__main__":
    main()
