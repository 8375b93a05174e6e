"""Decoding many tokenised sentences: length-sorted batches, greedy or beam search, input order,
optionally over a vocabulary shortlist's candidates."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from nmt.config import DecodingConfig
from nmt.decoding.beam import beam_search
from nmt.decoding.common import (
    Hypothesis,
    batch_source_tokens,
    budget_for_source,
    check_prefixes,
    check_shortlist,
    length_sorted_batches,
    pad_batch,
)
from nmt.decoding.greedy import greedy_search
from nmt.decoding.shortlist import Shortlist
from nmt.models.base import Seq2Seq


def search(
    model: Seq2Seq,
    src: Tensor,
    cfg: DecodingConfig,
    limit: int,
    prefixes: Sequence[Sequence[int]] | None = None,
    shortlist: Shortlist | None = None,
) -> list[list[Hypothesis]]:
    """Greedy when beam_size is 1 (same result, less bookkeeping), beam search otherwise."""
    if cfg.beam_size == 1 and cfg.nbest == 1:
        return [[h] for h in greedy_search(model, src, cfg, limit, prefixes, shortlist)]
    return beam_search(model, src, cfg, limit, prefixes, shortlist)


@torch.inference_mode()
def translate_ids(
    model: Seq2Seq,
    sources: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    device: torch.device | str,
    max_positions: int,
    prefixes: Sequence[Sequence[int]] | None = None,
    progress: bool = False,
    shortlist: Shortlist | None = None,
) -> list[list[Hypothesis]]:
    """Decode many tokenised sentences in length-sorted batches; results in input order.

    Sources longer than the model's positions are truncated (the caller warns). An empty source
    without a target prefix is not decoded: its translation is empty (log-probability 0), so that an
    evaluation split keeps all its lines and an empty line is scored as the empty hypothesis, as in
    ``Translator.translate``.

    ``prefixes`` (one list of target ids per source, possibly empty) force the start of each
    translation: every hypothesis begins with its sentence's prefix, whose log-probabilities count in
    its score. All prefixes are checked before anything is decoded; one that does not fit its
    sentence's length budget is refused in one line naming the sentence (its index in ``sources``).

    With a ``shortlist`` (loaded once by the caller: ``decoding.shortlist`` names its file, which the
    Translator reads), each sentence is decoded over its own candidates
    (:class:`~nmt.decoding.common.BatchVocab`), and gets the translation it gets alone.
    """
    model.eval()
    if shortlist is not None:
        check_shortlist(shortlist, model.vocab_sizes)
    sources = [list(s[: max_positions - 1]) for s in sources]
    if prefixes is not None:
        limit = max_positions - 1
        budgets = [budget_for_source(len(s), cfg, limit) for s in sources]
        check_prefixes(prefixes, budgets, model.vocab_sizes["tgt"], range(len(sources)))
    wanted = [bool(s) or bool(prefixes and prefixes[i]) for i, s in enumerate(sources)]
    results = [[] if want else [Hypothesis([], 0.0, 0.0)] for want in wanted]
    todo = [i for i, want in enumerate(wanted) if want]
    batches = list(length_sorted_batches([len(sources[i]) + 1 for i in todo], batch_source_tokens(cfg)))
    with tqdm(total=len(sources), disable=not progress, desc="decoding", unit="sent") as bar:
        bar.update(len(sources) - len(todo))
        for batch in batches:
            idx = [todo[j] for j in batch]
            src = pad_batch([sources[i] for i in idx], device)
            batch_prefixes = [prefixes[i] for i in idx] if prefixes is not None else None
            found = search(model, src, cfg, max_positions - 1, batch_prefixes, shortlist)
            for i, hyps in zip(idx, found):
                results[i] = hyps
            bar.update(len(idx))
    return results
