"""Which decoder layer's attention gives the best word alignments, and how to read them off it: every
layer x row (the step that predicts a target word, or the one that reads it) x word method
(nmt.analysis.word_alignment), scored against reference alignments of the same sentence pairs.

    python scripts/compare_alignments.py checkpoint=PATH eval.src=FILE eval.ref=FILE reference=LINKS
        [reference_reverse=LINKS]       # the other direction: the reference is grow-diag-final-and of both

The model reads each reference translation under teacher forcing. ``reference`` is a Pharaoh file
(``i-j`` per link, a line per pair), e.g. a gold alignment or an aligner's (eflomal, fast_align) over
the whitespace-separated words of the same lines. Prints precision, recall, F1 and AER per reading.
"""

from omegaconf import DictConfig, OmegaConf

from nmt.analysis.word_alignment import compare_readings, grow_diag_final_and, parse_pharaoh
from nmt.data import read_lines
from nmt.devices import select_device
from nmt.errors import NMTError
from nmt.evaluation.evaluate import evaluation_text
from nmt.inference.translator import Translator
from nmt.runs.cli import script_main


def read_links(path: str, pairs: int) -> list[set[tuple[int, int]]]:
    lines = read_lines(path)
    if len(lines) != pairs:
        raise NMTError(f"{path} has {len(lines)} lines for {pairs} sentence pairs")
    return [parse_pharaoh(line, f"{path}:{n}") for n, line in enumerate(lines, start=1)]


@script_main("compare_alignments")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    translator = Translator.from_checkpoint(cfg.checkpoint, select_device(cfg.device))
    sources, targets, name = evaluation_text(cfg, translator.cfg)
    reference = read_links(cfg.reference, len(sources))
    if cfg.reference_reverse:
        reverse = read_links(cfg.reference_reverse, len(sources))
        reference = [grow_diag_final_and(f, r) for f, r in zip(reference, reverse)]
    attentions = translator.attentions(
        translator.encode(sources), translator.encode_targets(targets), cfg.max_tokens
    )
    readings = compare_readings(
        [a.weights for a in attentions],
        [a.source_tokens[:-1] for a in attentions],
        [a.target_tokens[:-1] for a in attentions],
        reference,
    )
    best = max(readings, key=lambda r: r.scores.f1)
    print(f"{name}: {len(sources)} pairs, {best.scores.reference_links} reference links")
    print("layer  row      words  precision  recall     F1    AER")
    for r in readings:
        s = r.scores
        mark = "  <- best F1" if r is best else ""
        row = "reads" if r.shift else "predicts"
        print(
            f"{r.layer:5d}  {row:8s} {r.method:5s}  {s.precision:9.4f}  {s.recall:6.4f}  "
            f"{s.f1:.4f}  {s.aer:.4f}{mark}"
        )


if __name__ == "__main__":
    main()
