"""Prepare a corpus (clean text, SentencePiece, encoded ids) into the cache and print its summary.

    python scripts/prepare_data.py data=local data.dir=../shared/data/wmt14-de-en
    python scripts/prepare_data.py experiment=toy

Training prepares the data itself; running this first only separates the two steps.
"""

import hydra
from omegaconf import DictConfig

from nmt.cli import run_cli
from nmt.config import register_configs
from nmt.data import format_summary, prepare_corpus

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@run_cli
def main(cfg: DictConfig) -> None:
    data = prepare_corpus(cfg.data, cfg.tokenizer, progress=True)
    print(format_summary(data.summary))


if __name__ == "__main__":
    main()
