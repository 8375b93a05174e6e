"""Prepare a corpus (clean text, SentencePiece, encoded ids) into the cache and print its summary.

    python scripts/prepare_data.py data=local data.dir=../shared/data/wmt14-de-en
    python scripts/prepare_data.py experiment=toy

Training prepares the data itself; running this first only separates the two steps. With
``trainer.init_from=PATH`` (a fine-tune) the corpus is encoded with that checkpoint's tokenizer, as the
fine-tune's training run encodes it.
"""

from omegaconf import DictConfig, OmegaConf

from nmt.data import format_summary, prepare_corpus
from nmt.runs.cli import script_main
from nmt.training.init_from import parent_tokenizer, warn_unknown


@script_main("train")
def main(cfg: DictConfig) -> None:
    train_cfg = OmegaConf.to_object(cfg)
    tokenizer = parent_tokenizer(train_cfg)
    data = prepare_corpus(train_cfg.data, train_cfg.tokenizer, progress=True, tokenizer=tokenizer)
    if tokenizer is not None:
        warn_unknown(data, train_cfg.trainer.init_unk_warning, train_cfg.trainer.init_from)
    print(format_summary(data.summary))


if __name__ == "__main__":
    main()
