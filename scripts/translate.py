"""Translate text: ``echo "A man is riding a bike." | python scripts/translate.py checkpoint=PATH``.

Reads stdin (line by line when it is a terminal) or ``input=FILE``; writes ``output=FILE`` or stdout.
``prefix_file=FILE``: each translation starts with its line of FILE (an empty line: no prefix);
``alignments=true``: a tab and the translation's word alignment (Pharaoh ``i-j``) after each translation.
"""

import contextlib
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.config import checkpoint_paths
from nmt.devices import select_device
from nmt.errors import NMTError
from nmt.inference.streaming import StreamOptions, translate_stream
from nmt.inference.translator import Translator
from nmt.outputs import check_output_file
from nmt.runs.cli import script_main


@script_main("translate")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    # before anything is opened: output=FILE is emptied when opened, so it must be none of the inputs
    inputs = {"input": cfg.input, "stdin": None if cfg.input else sys.stdin, "prefix_file": cfg.prefix_file}
    check_output_file(cfg.output, inputs | {"checkpoint": checkpoint_paths(cfg.checkpoint)})
    translator = Translator.from_checkpoint(
        cfg.checkpoint,
        select_device(cfg.device),
        backend=cfg.backend,
        ct2_model=cfg.ct2_model,
        ct2_threads=(cfg.ct2_inter_threads, cfg.ct2_intra_threads),
        workers=cfg.workers,
    )
    translator.choose_target(cfg.tgt_lang, cfg.src_lang, cfg.zero_shot)
    decoding = translator.decoding_with(cfg.decoding)
    if cfg.alignments:
        translator.require_attention("alignments=true")
        translator.check_alignment_layer(cfg.alignment_layer)
    if cfg.prefix_file and not Path(cfg.prefix_file).is_file():
        raise NMTError(f"prefix_file={cfg.prefix_file}: no such file")
    with contextlib.ExitStack() as files:
        source = files.enter_context(open(cfg.input, "rb")) if cfg.input else sys.stdin.buffer
        target = files.enter_context(open(cfg.output, "w", encoding="utf-8")) if cfg.output else sys.stdout
        prefixes = files.enter_context(open(cfg.prefix_file, "rb")) if cfg.prefix_file else None
        name, prefix_name = cfg.input or "stdin", f"prefix_file={cfg.prefix_file}"
        options = StreamOptions(prefixes, prefix_name, cfg.alignments, cfg.alignment_layer)
        translate_stream(translator, source, target, decoding, cfg.batch_sentences, name, options)


if __name__ == "__main__":
    main()
