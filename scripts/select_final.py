"""Choose a run's final model on valid: ``python scripts/select_final.py run_dir=RUN [alphas=[...]]``."""

from omegaconf import DictConfig, OmegaConf

from nmt.evaluation.selection import choose_final
from nmt.runs.cli import script_main


@script_main("select_final")
def main(cfg: DictConfig) -> None:
    choice = choose_final(OmegaConf.to_object(cfg))
    print(choice.summary())
    print(f"report: {choice.report}")


if __name__ == "__main__":
    main()
