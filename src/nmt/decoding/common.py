"""What greedy search, beam search and scoring share: hypotheses and their ranking score, length
budgets, the rules applied to the model's next-token log-probabilities, batches."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.config import DecodingConfig
from nmt.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS/EOS
    score: float  # length-normalised log-probability plus word reward (the ranking score)
    log_prob: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def hypothesis(tokens: list[int], log_prob: float, cfg: DecodingConfig) -> Hypothesis:
    """A finished hypothesis and its ranking score (its length counts EOS)."""
    length = len(tokens) + 1
    score = log_prob / length_penalty(length, cfg.alpha)
    return Hypothesis(tokens, score + cfg.word_reward * length if cfg.word_reward else score, log_prob)


def length_budget(src_len: int, a: float, b: int, limit: int) -> int:
    """Output tokens allowed before EOS: a * src_len + b (src_len counts EOS), within ``limit``."""
    return max(1, min(limit, int(a * src_len + b)))


def max_lengths(src: Tensor, a: float, b: int, limit: int) -> list[int]:
    """Per-sentence output budget of a padded batch (src_len counts real tokens including EOS)."""
    return [length_budget(n, a, b, limit) for n in src.ne(PAD_ID).sum(dim=1).tolist()]


def mask_logits(log_probs: Tensor, no_unk: bool) -> Tensor:
    """Tokens a hypothesis never contains: PAD, BOS (and UNK with ``no_unk``)."""
    log_probs[:, PAD_ID] = -math.inf
    log_probs[:, BOS_ID] = -math.inf
    if no_unk:
        log_probs[:, UNK_ID] = -math.inf
    return log_probs


def force_eos(log_probs: Tensor, rows: Tensor) -> None:
    """Rows that reached their length budget may only end (the caller knows that some did)."""
    eos = log_probs[rows, EOS_ID].clone()
    log_probs[rows] = -math.inf
    log_probs[rows, EOS_ID] = eos


def block_repeated_ngrams(log_probs: Tensor, prefixes: Tensor, n: int) -> None:
    """Ban, in each row, the tokens that would complete an n-gram already in its prefix (rows, length).

    Every n-gram of the prefix is compared with the last n - 1 tokens at once; a banned token is
    scattered to -inf, a non-match to PAD, which is banned anyway. EOS is never in a prefix: a
    hypothesis can always end.
    """
    if prefixes.size(1) < n:
        return
    ngrams = prefixes.unfold(1, n, 1)  # (rows, length - n + 1, n)
    context = prefixes[:, prefixes.size(1) - n + 1 :]
    repeats = ngrams[:, :, :-1].eq(context[:, None, :]).all(dim=2)
    log_probs.scatter_(1, ngrams[:, :, -1].masked_fill(~repeats, PAD_ID), -math.inf)


def constrain(
    log_probs: Tensor,
    cfg: DecodingConfig,
    history: Tensor | None,
    must_end: Tensor | None,
) -> Tensor:
    """The search's rules on the model's next-token log-probabilities (rows, vocab), in place: PAD and
    BOS (UNK with no_unk) are banned, so are repeated n-grams of ``history`` (rows, step; only needed
    with ``cfg.no_repeat_ngram``), and rows at their length budget (``must_end``, bool) may only end."""
    log_probs = mask_logits(log_probs, cfg.no_unk)
    if cfg.no_repeat_ngram:
        block_repeated_ngrams(log_probs, history, cfg.no_repeat_ngram)
    if must_end is not None:
        force_eos(log_probs, must_end)
    return log_probs


def length_sorted_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices grouped by similar length, longest first, each group within ``max_tokens`` (padded)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * max(lengths[batch[0]], 1) > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def pad_batch(seqs: Sequence[Sequence[int]], device: torch.device | str) -> Tensor:
    """Right-padded (batch, max_len) long tensor; every sequence gets EOS appended."""
    width = max(len(s) for s in seqs) + 1
    out = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s) + 1] = torch.tensor([*s, EOS_ID], dtype=torch.long)
    return out.to(device)
