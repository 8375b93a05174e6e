"""Prepare a corpus (clean text, SentencePiece, encoded ids) into the cache and print its summary.

    python scripts/prepare_data.py data=local data.dir=../shared/data/wmt14-de-en
    python scripts/prepare_data.py experiment=toy

Training prepares the data itself; running this first only separates the two steps.
"""

from omegaconf import DictConfig

from nmt.cli import script_main
from nmt.data import format_summary, prepare_corpus


@script_main("train")
def main(cfg: DictConfig) -> None:
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=True)
    print(format_summary(data.summary))


if __name__ == "__main__":
    main()
