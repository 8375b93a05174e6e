"""Translate text: ``echo "A man is riding a bike." | python scripts/translate.py checkpoint=PATH``.

Reads stdin (line by line when it is a terminal) or ``input=FILE``; writes ``output=FILE`` or stdout.
"""

import contextlib
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from nmt.cli import run_cli
from nmt.config import register_configs
from nmt.devices import select_device
from nmt.translator import Translator, translate_stream

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="translate")
@run_cli
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    translator = Translator.from_checkpoint(
        cfg.checkpoint, select_device(cfg.device), backend=cfg.backend, ct2_model=cfg.ct2_model
    )
    decoding = translator.decoding_with(cfg.decoding)
    with contextlib.ExitStack() as files:
        source = files.enter_context(open(cfg.input, "rb")) if cfg.input else sys.stdin.buffer
        target = files.enter_context(open(cfg.output, "w", encoding="utf-8")) if cfg.output else sys.stdout
        translate_stream(translator, source, target, decoding, cfg.batch_sentences, cfg.input or "stdin")


if __name__ == "__main__":
    main()
