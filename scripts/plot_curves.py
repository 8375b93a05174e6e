"""Plot training loss and validation BLEU of several runs from their TensorBoard event files, into
``output`` (default: ``curves.png`` in the first run's dir).

python scripts/plot_curves.py 'runs=[outputs/a,outputs/b]' 'labels=[dot-product,additive]' output=c.png
"""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.errors import NMTError
from nmt.plotting import curves_figure
from nmt.runs.cli import script_main


@script_main("plot_curves")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    if not cfg.runs or (cfg.labels and len(cfg.labels) != len(cfg.runs)):
        raise NMTError("give runs=[RUN_DIR,...] and optionally as many labels=[...]")
    labels = cfg.labels or [Path(r).name for r in cfg.runs]
    output = Path(cfg.output) if cfg.output else Path(cfg.runs[0]) / "curves.png"
    curves_figure(dict(zip(labels, cfg.runs))).savefig(output, dpi=cfg.dpi)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
