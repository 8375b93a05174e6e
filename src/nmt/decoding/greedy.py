"""Greedy search: the most probable next token at every step, one hypothesis per sentence.

Sentences advance together one token per step; a sentence leaves the batch (and the model's state,
``reorder``) as soon as it ends, and the search stops when every sentence has. Tokens and
log-probabilities stay in tensors until the end; the host learns once per step whether a sentence
ended.

With target prefixes, a sentence's first tokens are its prefix's (at the model's log-probabilities,
which count in the hypothesis' log-probability), and the search continues freely after them.

With a vocabulary shortlist, each sentence chooses among its own candidates
(:class:`~nmt.decoding.common.BatchVocab`); the model scores their union for each group of a few
sentences.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from nmt.config import DecodingConfig
from nmt.decoding.common import Hypothesis, SearchStart, constrain, hypothesis
from nmt.decoding.shortlist import Shortlist
from nmt.models.base import Seq2Seq
from nmt.text.special import BOS_ID, EOS_ID


@torch.inference_mode()
def greedy_search(
    model: Seq2Seq,
    src: Tensor,
    cfg: DecodingConfig,
    limit: int,
    prefixes: Sequence[Sequence[int]] | None = None,
    shortlist: Shortlist | None = None,
) -> list[Hypothesis]:
    """Most probable next token at every step (under the search's rules); one hypothesis per sentence,
    beginning with the sentence's target prefix when ``prefixes`` (one per row of ``src``) are given,
    among the sentence's candidates of ``shortlist`` when one is given."""
    batch, device = src.size(0), src.device
    start = SearchStart.of(src, cfg, limit, model.vocab_sizes["tgt"], prefixes, shortlist)
    budgets, vocab = start.budgets, start.vocab
    budget = torch.tensor(budgets, device=device)
    next_budget = min(budgets)  # the first step at which a live sentence must end
    state = start.restrict(model, model.init_state(model.encode(src), cache=cfg.cache), per_sentence=1)
    alive = torch.arange(batch, device=device)
    tokens = torch.full((batch,), BOS_ID, dtype=torch.long, device=device)
    out = torch.zeros(batch, max(budgets) + 1, dtype=torch.long, device=device)  # EOS included
    length = torch.zeros(batch, dtype=torch.long, device=device)
    log_prob = torch.zeros(batch, dtype=torch.float64, device=device)  # summed as Python floats would be
    for step in itertools.count():
        log_probs, state = model.step(tokens, state)
        history = out[alive, :step] if cfg.no_repeat_ngram else None
        must_end = budget[alive] <= step if step >= next_budget else None
        prefix = start.prefixes.at(step, alive) if start.prefixes else None
        rows = vocab.row_vocab(alive) if vocab is not None else None
        best, tokens = constrain(log_probs, cfg, history, must_end, prefix, rows).max(dim=-1)
        if rows is not None:
            tokens = rows.ids_of(tokens)
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
    out_list, length_list = out.tolist(), length.tolist()
    return [hypothesis(t[:n], lp, cfg) for t, n, lp in zip(out_list, length_list, log_prob.tolist())]
