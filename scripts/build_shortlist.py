"""Build a vocabulary shortlist: ``python scripts/build_shortlist.py checkpoint=PATH [k=10] [frequent=100]``.

For every source subword its k likeliest target subwords (sentence-level co-occurrence in the training
data), plus the most frequent target subwords, written beside the checkpoint as
``shortlist.k{k}.n{frequent}.json`` (``scripts/export_ct2.py shortlist=FILE`` writes it into a CTranslate2
model as its vocabulary map). Prints how much of the validation references the shortlist covers.
"""

from omegaconf import DictConfig, OmegaConf

from nmt.runs.cli import script_main
from nmt.tooling.shortlist_builder import shortlist_for_checkpoint


@script_main("build_shortlist")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    shortlist, path, valid = shortlist_for_checkpoint(cfg)
    vocab = shortlist.tgt_vocab_size
    print(
        f"shortlist of {shortlist.pairs} training pairs: k={shortlist.k}, {len(shortlist.always)} always "
        f"(specials and the {shortlist.frequent} most frequent) -> {path}"
    )
    print(
        f"valid: {valid.mean_candidates:.0f} candidates per sentence on average "
        f"({valid.mean_candidates / vocab:.1%} of the vocabulary), holding {valid.covered:.2%} of the "
        f"reference subwords"
    )


if __name__ == "__main__":
    main()
