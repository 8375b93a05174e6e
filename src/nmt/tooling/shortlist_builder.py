"""Building a vocabulary shortlist (:mod:`nmt.decoding.shortlist`) from a training corpus: co-occurrence
counts over the prepared, memory-mapped ids, in one pass of bounded memory. Apart from the table itself,
so that the search, which reads the table, sits below the data pipeline that this module reads."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from nmt.checkpoint import checkpoint_config, load_checkpoint
from nmt.config import ShortlistConfig, data_or_model_data
from nmt.data import EncodedSplit, prepare_ids
from nmt.decoding.shortlist import SPECIALS, Coverage, Shortlist, coverage
from nmt.errors import NMTError
from nmt.outputs import check_output_file
from nmt.text.tokenizer import Tokenizer


def build_shortlist(
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    tokenizer: Tokenizer,
    k: int,
    frequent: int,
    direction: tuple[str, str],
    built_from: dict[str, str] | None = None,
) -> Shortlist:
    """The shortlist of a parallel corpus encoded with ``tokenizer`` (ids without BOS/EOS), whose
    sources are in ``direction[0]`` and targets in ``direction[1]``."""
    if k < 0 or frequent < 0:
        raise NMTError(f"k={k}, frequent={frequent}: must be >= 0")
    if len(sources) != len(targets):
        raise NMTError(f"{len(sources)} source sentences but {len(targets)} target sentences")
    src_vocab, tgt_vocab = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
    target_counts, with_source, (pair_s, pair_t, together) = _count(sources, targets, src_vocab, tgt_vocab)
    target_counts[list(SPECIALS)] = 0
    by_count = np.lexsort((np.arange(tgt_vocab), -target_counts))  # most frequent first, ties by id
    top = [int(t) for t in by_count[:frequent] if target_counts[t] > 0]
    always = sorted({*SPECIALS, *top})

    keep = ~np.isin(pair_t, always) & ~np.isin(pair_s, SPECIALS)
    pair_s, pair_t, together = pair_s[keep], pair_t[keep], together[keep]
    p = together / with_source[pair_s]
    order = np.lexsort((pair_t, -p, pair_s))  # by source, then likeliest first, ties by id
    pair_s, pair_t = pair_s[order], pair_t[order]
    starts = np.searchsorted(pair_s, np.arange(src_vocab))
    ends = np.searchsorted(pair_s, np.arange(src_vocab), side="right")
    candidates = [pair_t[a : min(b, a + k)].tolist() for a, b in zip(starts, ends)]
    src_lang, tgt_lang = direction
    return Shortlist(
        k,
        frequent,
        tokenizer.fingerprint,
        tgt_vocab,
        always,
        candidates,
        len(sources),
        src_lang,
        tgt_lang,
        dict(built_from or {}),
    )


def _concat(seqs: Iterable[Sequence[int]]) -> np.ndarray:
    arrays = [np.asarray(s, dtype=np.int64) for s in seqs]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def _count(
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    src_vocab: int,
    tgt_vocab: int,
    block: int = 20_000,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """In one pass over the corpus, a block of sentence pairs at a time, so that memory follows the
    distinct pairs of ids, not the corpus: the occurrences of each target id, the sentence pairs holding
    each source id, and (source id, target id, pairs holding both) over every pair of ids co-occurring
    in a sentence pair, each sentence pair counted once."""
    target_counts = np.zeros(tgt_vocab, dtype=np.int64)
    with_source = np.zeros(src_vocab, dtype=np.int64)
    keys, counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for start in range(0, len(sources), block):
        rows = range(start, min(start + block, len(sources)))
        src = [np.unique(np.asarray(sources[i], dtype=np.int64)) for i in rows]
        tgt = [np.asarray(targets[i], dtype=np.int64) for i in rows]
        target_counts += np.bincount(_concat(tgt), minlength=tgt_vocab)
        with_source += np.bincount(_concat(src), minlength=src_vocab)
        part = _concat([(s[:, None] * tgt_vocab + np.unique(t)).ravel() for s, t in zip(src, tgt)])
        keys, counts = _merge(keys, counts, *np.unique(part, return_counts=True))
    return target_counts, with_source, (keys // tgt_vocab, keys % tgt_vocab, counts)


def _merge(
    keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted tables of distinct keys and their counts as one (``counts`` is added to in place), in
    time linear in their sizes: sorting the union again at every block would grow with the corpus."""
    at = np.searchsorted(keys, new_keys)
    known = at < len(keys)
    known[known] = keys[at[known]] == new_keys[known]
    counts[at[known]] += new_counts[known]
    fresh = ~known
    return np.insert(keys, at[fresh], new_keys[fresh]), np.insert(counts, at[fresh], new_counts[fresh])


class _Side:
    """One side of a prepared split as a sequence of id arrays, read from its memory-mapped ids a
    sentence at a time: a corpus of millions of pairs is never held in memory."""

    def __init__(self, split: EncodedSplit, side: str):
        self.split, self.side = split, side

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.split.src(i) if self.side == "src" else self.split.tgt(i)


def shortlist_for_checkpoint(cfg: ShortlistConfig, progress: bool = True) -> tuple[Shortlist, Path, Coverage]:
    """``scripts/build_shortlist.py``: the shortlist of the checkpoint's training data (or ``cfg.data``),
    encoded with its tokenizer, saved beside it (or to ``cfg.output``), with its coverage of valid. The
    ids are the prepared ones (memory-mapped, encoded once and cached), as training read them."""
    check_output_file(cfg.output, {"checkpoint": cfg.checkpoint})  # before the work, and never over it
    ckpt = load_checkpoint(cfg.checkpoint)
    tokenizer = Tokenizer.from_state_dict(ckpt["tokenizer"])
    data = data_or_model_data(cfg.data, checkpoint_config(ckpt).data)
    splits = prepare_ids(data, tokenizer, progress=progress)  # the training run's, when it made them
    train, valid = splits["train"], splits["valid"]
    built_from = {
        "checkpoint": str(Path(cfg.checkpoint).resolve()),
        "data": str(getattr(data, "dir", data.name)),
    }
    direction = (data.src_lang, data.tgt_lang)
    shortlist = build_shortlist(
        _Side(train, "src"), _Side(train, "tgt"), tokenizer, cfg.k, cfg.frequent, direction, built_from
    )
    path = Path(cfg.output) if cfg.output else Path(cfg.checkpoint).parent / shortlist.filename()
    shortlist.save(path)
    return shortlist, path, coverage(shortlist, _Side(valid, "src"), _Side(valid, "tgt"))
