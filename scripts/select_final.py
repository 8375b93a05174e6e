"""Choose a run's final model on valid: ``python scripts/select_final.py run_dir=RUN [alphas=[...]]``."""

import hydra
from omegaconf import DictConfig, OmegaConf

from nmt.cli import run_cli
from nmt.config import register_configs
from nmt.selection import choose_final

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="select_final")
@run_cli
def main(cfg: DictConfig) -> None:
    choice = choose_final(OmegaConf.to_object(cfg))
    print(choice.summary())
    print(f"report: {choice.report}")


if __name__ == "__main__":
    main()
