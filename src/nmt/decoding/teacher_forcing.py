"""Scoring given translations: the model's log-probability of a target (and EOS) given its source,
under teacher forcing, with one forward pass per batch (``Seq2Seq.teacher_forced_log_probs``).

These are the numbers that search sums for the same tokens (fp32 log-softmax; an ensemble's mean of
probabilities), so rescoring a search's output, a reference or another system's output compares
with the search's own log-probabilities. With a vocabulary shortlist, the search normalises each
sentence's distributions over its candidates, and so does scoring: over the candidates of the source's
subwords and the target's own subwords, as a search forced through the target as a prefix would (a
search's own output is among its candidates: it gets the log-probability its search gave it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nmt.decoding.common import check_shortlist, length_sorted_batches, pad_batch
from nmt.decoding.shortlist import Shortlist
from nmt.errors import NMTError
from nmt.models.base import Seq2Seq
from nmt.text.special import BOS_ID, PAD_ID


@dataclass
class TeacherForcedScore:
    """The model's teacher-forced score of one given translation (:func:`score_ids`)."""

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
    shortlist: Shortlist | None = None,
) -> list[TeacherForcedScore]:
    """log P(target + EOS | source) of each pair and its per-token terms, in input order; with a
    ``shortlist``, normalised over each pair's candidates (the module's docstring).

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
    if shortlist is not None:
        check_shortlist(shortlist, model.vocab_sizes)
    sources = [list(s[: max_positions - 1]) for s in sources]
    results: dict[int, TeacherForcedScore] = {}
    lengths = [len(s) + len(t) + 2 for s, t in zip(sources, targets)]
    for batch in length_sorted_batches(lengths, max_tokens):
        src = pad_batch([sources[i] for i in batch], device)
        tgt_out = pad_batch([targets[i] for i in batch], device)  # target + EOS
        keep = tgt_out.ne(PAD_ID)
        bos = torch.full((len(batch), 1), BOS_ID, dtype=torch.long, device=src.device)
        tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=1).masked_fill_(~keep, PAD_ID)  # BOS + target
        outside = None
        if shortlist is not None:
            outside = _outside_candidates(shortlist, [(sources[i], targets[i]) for i in batch], src.device)
        log_probs = model.teacher_forced_log_probs(src, tgt_in, keep, outside)  # (tokens, vocab), row-major
        picked = log_probs.gather(1, tgt_out[keep][:, None]).squeeze(1).double()
        for i, terms in zip(batch, picked.split(keep.sum(dim=1).tolist())):
            results[i] = TeacherForcedScore(terms.sum().item(), terms.tolist())
    return [results[i] for i in range(len(sources))]


def _outside_candidates(
    shortlist: Shortlist, pairs: list[tuple[Sequence[int], Sequence[int]]], device: torch.device
) -> torch.Tensor:
    """(target tokens + EOS of all pairs, in order; target vocabulary) True where an id is not among its
    pair's candidates: those of the source's subwords (specials and frequent ones included) and the
    target's own."""
    rows = []
    for source, target in pairs:
        outside = torch.ones(shortlist.tgt_vocab_size, dtype=torch.bool)
        outside[torch.tensor([*shortlist.select([source]), *target], dtype=torch.long)] = False
        rows.append(outside.expand(len(target) + 1, -1))
    return torch.cat(rows).to(device)
