"""Plot where a model looks: ``python scripts/plot_attention.py checkpoint=PATH text="..." [heads=all]``.

Translates ``text`` with the checkpoint's decoding settings (``decoding.*=...`` overrides them), prints
the translation and writes the cross-attention heatmap of decoder ``layer`` to ``output`` (PNG); by
default into the checkpoint's run, ``eval/<checkpoint>.attention-<hash>.png``, the hash naming the text
and the settings.
"""

from dataclasses import asdict
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.devices import select_device
from nmt.errors import NMTError
from nmt.evaluation.evaluate import run_file
from nmt.inference.translator import Translator
from nmt.plotting import PNG_DPI, attention_figure
from nmt.runs.cli import script_main


@script_main("plot_attention")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    translator = Translator.from_checkpoint(cfg.checkpoint, select_device(cfg.device))
    source = translator.encode([cfg.text])[0]
    if not source:
        raise NMTError("text is empty: nothing to translate")
    decoding = translator.decoding_with(cfg.decoding)
    best = translator.search([source], decoding)[0][0]
    panels = translator.attention(source, best.tokens).panels(cfg.layer, cfg.heads)
    fig = attention_figure(
        panels.weights, panels.source_tokens, panels.target_tokens, titles=panels.titles, title=panels.title
    )
    translation = translator.texts([best])[0]
    what = [cfg.text, cfg.layer, cfg.heads, asdict(decoding)]
    output = Path(cfg.output) if cfg.output else run_file(Path(cfg.checkpoint), "attention", what, ".png")
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=PNG_DPI)
    print(translation)
    print(f"attention map: {output}")


if __name__ == "__main__":
    main()
