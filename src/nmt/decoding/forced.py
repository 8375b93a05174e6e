"""Scoring given translations: the model's log-probability of a target (and EOS) given its source,
under teacher forcing, with one forward pass per batch (``Seq2Seq.teacher_forced_log_probs``).

These are the numbers that search sums for the same tokens (fp32 log-softmax; an ensemble's mean of
probabilities), so rescoring a search's output, a reference or another system's output compares
with the search's own log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nmt.decoding.common import length_sorted_batches, pad_batch
from nmt.errors import NMTError
from nmt.models.base import Seq2Seq
from nmt.special import BOS_ID, PAD_ID


@dataclass
class Score:
    log_prob: float  # log P(target + EOS | source)
    token_log_probs: list[float]  # one per target token, then EOS's


@torch.inference_mode()
def score_ids(
    model: Seq2Seq,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    device: torch.device | str,
    max_positions: int,
    max_tokens: int,
) -> list[Score]:
    """log P(target + EOS | source) of each pair and its per-token terms, in input order.

    Pairs are batched by length, each batch within ``max_tokens`` source plus target tokens (padded).
    Sources are truncated to the model's positions as in :func:`~nmt.decoding.translate_ids`; a
    target with more tokens than the model can emit is refused in one line naming it.
    """
    if len(targets) != len(sources):
        raise NMTError(f"{len(targets)} targets for {len(sources)} sources: give one per source")
    for i, target in enumerate(targets):
        if len(target) > max_positions - 1:
            raise NMTError(
                f"target {i} has {len(target)} tokens; the model scores at most {max_positions - 1}"
            )
    model.eval()
    sources = [list(s[: max_positions - 1]) for s in sources]
    results: dict[int, Score] = {}
    lengths = [len(s) + len(t) + 2 for s, t in zip(sources, targets)]
    for batch in length_sorted_batches(lengths, max_tokens):
        src = pad_batch([sources[i] for i in batch], device)
        tgt_out = pad_batch([targets[i] for i in batch], device)  # target + EOS
        keep = tgt_out.ne(PAD_ID)
        bos = torch.full((len(batch), 1), BOS_ID, dtype=torch.long, device=src.device)
        tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=1).masked_fill_(~keep, PAD_ID)  # BOS + target
        log_probs = model.teacher_forced_log_probs(src, tgt_in, keep)  # (tokens, vocab), row-major order
        picked = log_probs.gather(1, tgt_out[keep][:, None]).squeeze(1).double()
        for i, terms in zip(batch, picked.split(keep.sum(dim=1).tolist())):
            results[i] = Score(terms.sum().item(), terms.tolist())
    return [results[i] for i in range(len(sources))]
