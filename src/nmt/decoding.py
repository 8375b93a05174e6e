"""Greedy and beam search over the :class:`~nmt.models.base.Seq2Seq` interface.

Both are batched: sentences (and, for beam search, their beams flattened into the batch) advance
together one token per step, with the model's incremental state (the Transformer's key/value cache,
RNNsearch's hidden state). A sentence leaves the batch as soon as it is finished, and decoding stops
when every sentence is. The bookkeeping stays in tensors: the host learns once per step which
sentences are done, and builds the hypotheses at the end.

Length normalisation is GNMT's (Wu et al., 2016): a finished hypothesis y scores
``log P(y | x) / ((5 + |y|) / 6) ** alpha + word_reward * |y|``, where |y| counts the generated tokens
including EOS; ``alpha = 0`` ranks by plain log-probability. The word reward (Murray and Chiang, 2018;
Marian's negative word penalty) could be added per token during search as well, but every candidate
that a step compares has the same length, so it only matters when finished hypotheses of different
lengths are ranked. Output length is at most ``max_len_a * src_len + max_len_b`` tokens before EOS
(and within the model's positions). ``no_repeat_ngram = n`` bans every token that would repeat an
n-gram of the hypothesis (fairseq's and Hugging Face's ``no_repeat_ngram_size``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from nmt.config import DecodingConfig
from nmt.models.base import Seq2Seq
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


def max_lengths(src: Tensor, a: float, b: int, limit: int) -> list[int]:
    """Per-sentence output budget a * src_len + b (src_len counts real tokens including EOS)."""
    src_len = src.ne(PAD_ID).sum(dim=1).tolist()
    return [max(1, min(limit, int(a * n + b))) for n in src_len]


def _mask_logits(log_probs: Tensor, no_unk: bool) -> Tensor:
    log_probs[:, PAD_ID] = -math.inf
    log_probs[:, BOS_ID] = -math.inf
    if no_unk:
        log_probs[:, UNK_ID] = -math.inf
    return log_probs


def _force_eos(log_probs: Tensor, rows: Tensor) -> None:
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


@torch.inference_mode()
def greedy_search(model: Seq2Seq, src: Tensor, cfg: DecodingConfig, limit: int) -> list[Hypothesis]:
    """Most probable next token at every step; one hypothesis per sentence."""
    batch, device = src.size(0), src.device
    budgets = max_lengths(src, cfg.max_len_a, cfg.max_len_b, limit)
    budget = torch.tensor(budgets, device=device)
    next_budget = min(budgets)  # the first step at which a live sentence must end
    state = model.init_state(model.encode(src), cache=cfg.cache)
    alive = torch.arange(batch, device=device)
    tokens = torch.full((batch,), BOS_ID, dtype=torch.long, device=device)
    out = torch.zeros(batch, max(budgets) + 1, dtype=torch.long, device=device)  # EOS included
    length = torch.zeros(batch, dtype=torch.long, device=device)
    log_prob = torch.zeros(batch, dtype=torch.float64, device=device)  # summed as Python floats would be
    step = 0
    while True:
        log_probs, state = model.step(tokens, state)
        log_probs = _mask_logits(log_probs, cfg.no_unk)
        if cfg.no_repeat_ngram:
            block_repeated_ngrams(log_probs, out[alive, :step], cfg.no_repeat_ngram)
        if step >= next_budget:
            _force_eos(log_probs, budget[alive] <= step)
        best, tokens = log_probs.max(dim=-1)
        out[alive, step] = tokens
        log_prob[alive] += best.double()
        running = tokens.ne(EOS_ID)
        if not bool(running.all()):
            length[alive[~running]] = step
            keep = running.nonzero().squeeze(1)
            if not keep.numel():
                break
            alive, tokens, state = alive[keep], tokens[keep], model.reorder(state, keep)
            next_budget = int(budget[alive].min())
        step += 1
    out_list, length_list = out.tolist(), length.tolist()
    return [hypothesis(t[:n], lp, cfg) for t, n, lp in zip(out_list, length_list, log_prob.tolist())]


@torch.inference_mode()
def beam_search(model: Seq2Seq, src: Tensor, cfg: DecodingConfig, limit: int) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``cfg.nbest`` best hypotheses per sentence, best first.

    Each step keeps the 2k best (beam, token) extensions of every sentence: the ones ending in EOS
    among the top k are finished hypotheses, the first k finite others are the new beams. A sentence
    is done when it has k finished hypotheses, reaches its length budget or has no live beam left.

    With a tiny vocabulary there may be fewer than k finite extensions that do not end: the missing
    beams are dummies scored -inf, which can never finish, rather than extensions past an EOS.

    Finished hypotheses are kept in tensors, in the order found (which breaks ties when sorting):
    k slots per sentence, plus a sink slot that takes the writes of the EOS candidates not kept.
    """
    k, batch, device = cfg.beam_size, src.size(0), src.device
    budgets = max_lengths(src, cfg.max_len_a, cfg.max_len_b, limit)
    alive_budgets = budgets  # of the sentences still searched, on the host
    budget = torch.tensor(budgets, device=device)
    next_budget = min(budgets)  # the first step at which a live sentence must end
    # k identical hypotheses per sentence, as a batch of one hypothesis per row: the first step computes
    # exactly what it always did (a matrix product of other row counts may round differently), and
    # the first reorder keeps one row per sentence of what the model shares between beams.
    rows = torch.arange(batch, device=device).repeat_interleave(k)
    state = model.init_state(model.reorder(model.encode(src), rows), cache=cfg.cache)
    scores = torch.full((batch, k), -math.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: only the first may extend at step 0
    history = torch.full((batch * k, 0), BOS_ID, dtype=torch.long, device=device)
    tokens = torch.full((batch * k,), BOS_ID, dtype=torch.long, device=device)
    alive = torch.arange(batch, device=device)
    found = torch.zeros(batch, dtype=torch.long, device=device)
    found_tokens = torch.zeros(batch, k + 1, max(budgets), dtype=torch.long, device=device)
    found_length = torch.zeros(batch, k + 1, dtype=torch.long, device=device)
    found_log_prob = torch.zeros(batch, k + 1, device=device)
    step = 0
    while True:
        n = alive.numel()
        log_probs, state = model.step(tokens, state)
        log_probs = _mask_logits(log_probs, cfg.no_unk)
        if cfg.no_repeat_ngram:
            block_repeated_ngrams(log_probs, history, cfg.no_repeat_ngram)
        at_budget = budget[alive] <= step
        if step >= next_budget:
            _force_eos(log_probs, at_budget.repeat_interleave(k))
        vocab = log_probs.size(-1)
        total = log_probs.view(n, k, vocab).add_(scores[:, :, None]).view(n, k * vocab)  # no new buffer
        top_scores, top_ids = total.topk(min(2 * k, k * vocab), dim=1)
        beam_of, token_of = top_ids // vocab, top_ids % vocab
        finite = top_scores.isfinite()

        # Finished hypotheses: EOS among each sentence's top k, while it has fewer than k.
        ends = token_of[:, :k].eq(EOS_ID) & finite[:, :k]
        before = found[alive]
        count = (before + ends.sum(dim=1)).clamp_(max=k)

        # New beams: the first k finite candidates that do not end; if there are fewer, dummies.
        live = token_of.ne(EOS_ID) & finite
        order = (~live).long() * (2 * k) + torch.arange(top_ids.size(1), device=device)
        pick = order.topk(k, dim=1, largest=False).indices
        scores = top_scores.gather(1, pick).masked_fill(~live.gather(1, pick), -math.inf)
        beam_rows = (torch.arange(n, device=device)[:, None] * k + beam_of.gather(1, pick)).view(-1)
        tokens = token_of.gather(1, pick).view(-1)

        done = count.ge(k) | at_budget | ~scores.isfinite().any(dim=1)
        *done_list, any_end = torch.cat([done, ends.any()[None]]).tolist()  # the one transfer per step
        if any_end:
            slot = (before[:, None] + ends.cumsum(dim=1) - 1).masked_fill_(~ends, k).clamp_(max=k)
            sentence = alive[:, None].expand(n, k)
            found_log_prob[sentence, slot] = top_scores[:, :k]
            found_length[sentence, slot] = step
            prefixes = history.view(n, k, step).gather(1, beam_of[:, :k, None].expand(n, k, step))
            found_tokens[sentence, slot, :step] = prefixes
            found[alive] = count
        staying = None
        if any(done_list):
            keep = [i for i, d in enumerate(done_list) if not d]
            if not keep:
                break
            alive_budgets = [alive_budgets[i] for i in keep]
            next_budget = min(alive_budgets)
            staying = torch.tensor(keep, device=device)
            scores, tokens = scores[staying], tokens.view(n, k)[staying].view(-1)
            beam_rows = beam_rows.view(n, k)[staying].view(-1)
            alive = alive[staying]
        history = torch.cat([history[beam_rows], tokens[:, None]], dim=1)
        if step == 0:  # one row per sentence, each of its first beam, of what beams share from now on
            sentences = (staying if staying is not None else torch.arange(n, device=device)) * k
            state = model.reorder(state, beam_rows, sentences)
        else:
            state = model.reorder(state, beam_rows, staying)
        step += 1
    counts, lengths = found.tolist(), found_length.tolist()
    all_tokens, log_prob = found_tokens.tolist(), found_log_prob.tolist()
    results = []
    for s in range(batch):
        hyps = [hypothesis(all_tokens[s][j][: lengths[s][j]], log_prob[s][j], cfg) for j in range(counts[s])]
        results.append(sorted(hyps, key=lambda h: -h.score)[: cfg.nbest])
    return results


def search(model: Seq2Seq, src: Tensor, cfg: DecodingConfig, limit: int) -> list[list[Hypothesis]]:
    """Greedy when beam_size is 1 (same result, less bookkeeping), beam search otherwise."""
    if cfg.beam_size == 1 and cfg.nbest == 1:
        return [[h] for h in greedy_search(model, src, cfg, limit)]
    return beam_search(model, src, cfg, limit)


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
