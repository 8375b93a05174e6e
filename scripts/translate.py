"""Translate text: ``echo "A man is riding a bike." | python scripts/translate.py checkpoint=PATH``.

Reads stdin (line by line when it is a terminal) or ``input=FILE``; writes ``output=FILE`` or stdout.
"""

import contextlib
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.cli import run_cli
from nmt.config import merge_decoding, register_configs
from nmt.devices import select_device
from nmt.translator import Translator, translate_stream

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="translate")
@run_cli
def main(cfg: DictConfig) -> None:
    overrides = list(HydraConfig.get().overrides.task)
    cfg = OmegaConf.to_object(cfg)
    translator = Translator.from_checkpoint(
        cfg.checkpoint, select_device(cfg.device), backend=cfg.backend, ct2_model=cfg.ct2_model
    )
    cfg.decoding = merge_decoding(translator.cfg.decoding, overrides)
    with contextlib.ExitStack() as files:
        source = files.enter_context(open(cfg.input, encoding="utf-8")) if cfg.input else sys.stdin
        target = files.enter_context(open(cfg.output, "w", encoding="utf-8")) if cfg.output else sys.stdout
        translate_stream(translator, source, target, cfg.decoding, cfg.batch_sentences)


if __name__ == "__main__":
    main()
