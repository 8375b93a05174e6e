"""Plot where a model looks: ``python scripts/plot_attention.py checkpoint=PATH text="..." [heads=all]``.

Translates ``text`` with the checkpoint's decoding settings (``decoding.*=...`` overrides them), prints
the translation and writes the cross-attention heatmap of decoder ``layer`` to ``output`` (PNG).
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from nmt.cli import run_cli
from nmt.config import register_configs
from nmt.devices import select_device
from nmt.plotting import PNG_DPI
from nmt.translator import Translator

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="plot_attention")
@run_cli
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    translator = Translator.from_checkpoint(cfg.checkpoint, select_device(cfg.device))
    fig, translation = translator.plot_attention(
        cfg.text, translator.decoding_with(cfg.decoding), cfg.layer, cfg.heads
    )
    output = Path(cfg.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=PNG_DPI)
    print(translation)
    print(f"attention map: {output}")


if __name__ == "__main__":
    main()
