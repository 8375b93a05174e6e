"""Score translations with a checkpoint: the model's log-probability of each given translation (teacher
forcing, one forward pass per batch: no search).

    python scripts/score.py checkpoint=PATH eval.src=FILE eval.ref=FILE [format=json] [per_token=true]
    python scripts/score.py checkpoint=PATH data.split=test      # the split's references

One line per sentence pair to stdout or ``output=FILE``: log-probability, score and subwords (TSV), or a
JSON object (``format=json``); ``per_token=true`` adds each subword's log-probability and
``alignments=true`` each pair's word alignment. The corpus means go to stderr. ``backend=ct2``, ensembles
(``checkpoint=[a.pt,b.pt]``) and ``decoding.alpha``/``decoding.word_reward`` (the score) as for evaluate.py.
"""

import contextlib
import sys

from omegaconf import DictConfig, OmegaConf

from nmt.config import checkpoint_paths
from nmt.evaluation.scoring import format_scores, score_corpus
from nmt.outputs import check_output_file
from nmt.runs.cli import script_main


@script_main("score")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    inputs = {
        "eval.src": cfg.eval.src,
        "eval.ref": cfg.eval.ref,
        "checkpoint": checkpoint_paths(cfg.checkpoint),
    }
    check_output_file(cfg.output, inputs)  # the scores would replace the text they score
    run = score_corpus(cfg)
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(cfg.output, "w", encoding="utf-8")) if cfg.output else sys.stdout
        out.write(format_scores(run, cfg.format, cfg.per_token))
    print(run.summary(), file=sys.stderr)


if __name__ == "__main__":
    main()
