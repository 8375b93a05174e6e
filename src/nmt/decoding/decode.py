"""Decoding many tokenised sentences: length-sorted batches, greedy or beam search, input order."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from nmt.config import DecodingConfig
from nmt.decoding.beam import beam_search
from nmt.decoding.common import Hypothesis, length_sorted_batches, pad_batch
from nmt.decoding.greedy import greedy_search
from nmt.models.base import Seq2Seq


def search(model: Seq2Seq, src: Tensor, cfg: DecodingConfig, limit: int) -> list[list[Hypothesis]]:
    """Greedy when beam_size is 1 (same result, less bookkeeping), beam search otherwise."""
    if cfg.beam_size == 1 and cfg.nbest == 1:
        return [[h] for h in greedy_search(model, src, cfg, limit)]
    return beam_search(model, src, cfg, limit)


@torch.inference_mode()
def translate_ids(
    model: Seq2Seq,
    sources: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    device: torch.device | str,
    max_positions: int,
    progress: bool = False,
) -> list[list[Hypothesis]]:
    """Decode many tokenised sentences in length-sorted batches; results in input order.

    Sources longer than the model's positions are truncated (the caller warns). An empty source is
    not decoded: its translation is empty (log-probability 0), so that an evaluation split keeps all
    its lines and an empty line is scored as the empty hypothesis, as in ``Translator.translate``.
    """
    model.eval()
    sources = [list(s[: max_positions - 1]) for s in sources]
    results: list[list[Hypothesis]] = [[] if s else [Hypothesis([], 0.0, 0.0)] for s in sources]
    todo = [i for i, s in enumerate(sources) if s]
    source_tokens = max(1, cfg.max_tokens // max(cfg.beam_size, 1))  # per batch, before the beam
    batches = list(length_sorted_batches([len(sources[i]) + 1 for i in todo], source_tokens))
    with tqdm(total=len(sources), disable=not progress, desc="decoding", unit="sent") as bar:
        bar.update(len(sources) - len(todo))
        for batch in batches:
            idx = [todo[j] for j in batch]
            src = pad_batch([sources[i] for i in idx], device)
            for i, hyps in zip(idx, search(model, src, cfg, max_positions - 1)):
                results[i] = hyps
            bar.update(len(idx))
    return results
