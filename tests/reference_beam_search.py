"""The greedy and beam search of nmt.decoding before it kept per-sentence state and finished
hypotheses in tensors (commit 9a8ac6d), kept verbatim as the reference that the faster search must
reproduce exactly (the helpers it shares with today's search, which did not change, are imported). It
runs on today's models: it never tells ``reorder`` which sentences stay, so
every state keeps one hypothesis per sentence (one row each) and is reordered whole, as before."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from nmt.config import DecodingConfig
from nmt.decoding import Hypothesis, length_penalty, mask_logits, max_lengths
from nmt.models.base import Seq2Seq
from nmt.text.special import BOS_ID, EOS_ID


def _only_eos(log_probs: Tensor, rows: Tensor) -> None:
    """Rows that reached their length budget may only end."""
    if rows.any():
        eos = log_probs[rows, EOS_ID].clone()
        log_probs[rows] = -math.inf
        log_probs[rows, EOS_ID] = eos


@torch.no_grad()
def greedy_search(model: Seq2Seq, src: Tensor, cfg: DecodingConfig, limit: int) -> list[Hypothesis]:
    """Most probable next token at every step; one hypothesis per sentence."""
    batch = src.size(0)
    budget = torch.tensor(max_lengths(src, cfg.max_len_a, cfg.max_len_b, limit), device=src.device)
    state = model.init_state(model.encode(src), cache=cfg.cache)
    alive = torch.arange(batch, device=src.device)
    tokens = torch.full((batch,), BOS_ID, dtype=torch.long, device=src.device)
    out: list[list[int]] = [[] for _ in range(batch)]
    log_prob = [0.0] * batch
    step = 0
    while alive.numel():
        log_probs, state = model.step(tokens, state)
        log_probs = mask_logits(log_probs, cfg.no_unk)
        _only_eos(log_probs, budget[alive] <= step)
        best, tokens = log_probs.max(dim=-1)
        for sent, tok, lp in zip(alive.tolist(), tokens.tolist(), best.tolist()):
            log_prob[sent] += lp
            if tok != EOS_ID:
                out[sent].append(tok)
        running = tokens.ne(EOS_ID)
        if not bool(running.all()):
            keep = running.nonzero().squeeze(1)
            alive, tokens, state = alive[keep], tokens[keep], model.reorder(state, keep)
        step += 1
    return [Hypothesis(t, lp / length_penalty(len(t) + 1, cfg.alpha), lp) for t, lp in zip(out, log_prob)]


@torch.no_grad()
def beam_search(model: Seq2Seq, src: Tensor, cfg: DecodingConfig, limit: int) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``cfg.nbest`` best hypotheses per sentence, best first.

    Each step keeps the 2k best (beam, token) extensions of every sentence: the ones ending in EOS
    among the top k are finished hypotheses, the first k finite others are the new beams. A sentence
    is done when it has k finished hypotheses, reaches its length budget or has no live beam left.

    With a tiny vocabulary there may be fewer than k finite extensions that do not end: the missing
    beams are dummies scored -inf, which can never finish, rather than extensions past an EOS.
    """
    k, batch, device = cfg.beam_size, src.size(0), src.device
    budget = max_lengths(src, cfg.max_len_a, cfg.max_len_b, limit)
    rows = torch.arange(batch, device=device).repeat_interleave(k)
    state = model.init_state(model.reorder(model.encode(src), rows), cache=cfg.cache)
    scores = torch.full((batch, k), -math.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: only the first may extend at step 0
    history = torch.full((batch * k, 0), BOS_ID, dtype=torch.long, device=device)
    tokens = torch.full((batch * k,), BOS_ID, dtype=torch.long, device=device)
    alive = list(range(batch))
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    step = 0
    while alive:
        n = len(alive)
        log_probs, state = model.step(tokens, state)
        log_probs = mask_logits(log_probs, cfg.no_unk)
        at_budget = torch.tensor([budget[s] <= step for s in alive], device=device).repeat_interleave(k)
        _only_eos(log_probs, at_budget)
        vocab = log_probs.size(-1)
        total = (scores[:, :, None] + log_probs.view(n, k, vocab)).view(n, k * vocab)
        top_scores, top_ids = total.topk(min(2 * k, k * vocab), dim=1)
        beam_of, token_of = top_ids // vocab, top_ids % vocab
        is_eos = token_of.eq(EOS_ID) & top_scores.isfinite()

        # Finished hypotheses: EOS among each sentence's top k candidates.
        for i, j in is_eos[:, :k].nonzero().tolist():
            sent = alive[i]
            if len(finished[sent]) < k:
                prefix = history[i * k + beam_of[i, j]].tolist()
                lp = top_scores[i, j].item()
                finished[sent].append(Hypothesis(prefix, lp / length_penalty(len(prefix) + 1, cfg.alpha), lp))

        # New beams: the first k finite candidates that do not end; if there are fewer, dummies.
        live = token_of.ne(EOS_ID) & top_scores.isfinite()
        order = (~live).long() * (2 * k) + torch.arange(top_ids.size(1), device=device)
        pick = order.topk(k, dim=1, largest=False).indices
        scores = top_scores.gather(1, pick).masked_fill(~live.gather(1, pick), -math.inf)
        beam_rows = (torch.arange(n, device=device)[:, None] * k + beam_of.gather(1, pick)).view(-1)
        tokens = token_of.gather(1, pick).view(-1)

        has_live = scores.isfinite().any(dim=1).tolist()
        done = [len(finished[s]) >= k or budget[s] <= step or not h for s, h in zip(alive, has_live)]
        keep = [i for i, d in enumerate(done) if not d]
        if len(keep) < n:
            keep_t = torch.tensor(keep, dtype=torch.long, device=device)
            scores, tokens = scores[keep_t], tokens.view(n, k)[keep_t].view(-1)
            beam_rows = beam_rows.view(n, k)[keep_t].view(-1)
            alive = [alive[i] for i in keep]
        history = torch.cat([history[beam_rows], tokens[:, None]], dim=1)
        state = model.reorder(state, beam_rows)
        step += 1
    return [sorted(h, key=lambda h: -h.score)[: cfg.nbest] for h in finished]
