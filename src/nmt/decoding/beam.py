"""Batched beam search in named steps, as in Sockeye and fairseq.

The k beams of every sentence are rows ``sentence * k + beam`` of one batch, which advances one token
per step. A step is:

1. the model's next-token log-probabilities for every beam, under the search's rules
   (:func:`~nmt.decoding.common.constrain`: specials, n-gram blocking, the length budget, the target
   prefix);
2. :func:`extend`: each beam's score plus each token's log-probability; every sentence keeps its 2k
   best (beam, token) candidates;
3. :meth:`Finished.ending` and :meth:`Finished.record`: the candidates among the top k that end in
   EOS are finished hypotheses, while the sentence has fewer than k;
4. :func:`choose_beams`: the first k candidates that do not end are the new beams (dummies scored
   -inf fill up when fewer are finite: a finished hypothesis never becomes a live beam);
5. :func:`advance`: a sentence is done when it has k finished hypotheses, reaches its length budget
   or has no live beam left; it leaves the batch, and the model's state follows the new beams.

The search owns the layout of the model's state (:func:`reorder`): what the beams of a sentence share
(a :class:`~nmt.models.base.PerSentence` part, e.g. the cross-attention keys and values) is kept
once per sentence and only selected when sentences leave. The host learns once per step which
sentences are done; finished hypotheses stay in tensors until the end.

A target prefix leaves each step one finite candidate per sentence, its next token (the other beams
are dummies): the search goes through the prefix as a single beam, at the model's log-probabilities,
then branches out as from the start.

With a vocabulary shortlist, the model scores the union of the candidates of each group of a few
sentences (:class:`~nmt.decoding.common.BatchVocab`), each beam over its sentence's own;
:func:`extend` maps the chosen positions back to target ids, which is what the beams hold.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.config import DecodingConfig
from nmt.decoding.common import Hypothesis, RowVocab, SearchStart, constrain, hypothesis
from nmt.decoding.shortlist import Shortlist
from nmt.models.base import Seq2Seq, State, select_sentences
from nmt.text.special import BOS_ID, EOS_ID


@dataclass
class Beams:
    """The k beams (rows ``i * k + beam``) of each of the n sentences still searched."""

    sentences: Tensor  # (n,) each one's row in the batch
    budgets: list[int]  # (n,) each one's length budget, on the host
    budget: Tensor  # (n,) the same, on the device
    scores: Tensor  # (n, k) each beam's log-probability; -inf for a dummy
    tokens: Tensor  # (n * k,) each beam's last token: the next step's input
    history: Tensor  # (n * k, step) each beam's tokens so far

    @classmethod
    def start(cls, budgets: list[int], k: int, device: torch.device) -> Beams:
        """k identical beams per sentence, of which only the first may extend at step 0."""
        batch = len(budgets)
        scores = torch.full((batch, k), -math.inf, device=device)
        scores[:, 0] = 0.0
        return cls(
            sentences=torch.arange(batch, device=device),
            budgets=budgets,
            budget=torch.tensor(budgets, device=device),
            scores=scores,
            tokens=torch.full((batch * k,), BOS_ID, dtype=torch.long, device=device),
            history=torch.full((batch * k, 0), BOS_ID, dtype=torch.long, device=device),
        )

    @property
    def k(self) -> int:
        return self.scores.size(1)

    def must_end(self, step: int) -> Tensor:
        """(n,) the sentences whose beams reached their length budget."""
        return self.budget <= step


@dataclass
class Candidates:
    """Each sentence's 2k best extensions (n, 2k), best first."""

    scores: Tensor  # the beam's score plus the token's log-probability
    beams: Tensor  # the beam (0..k-1) each extends
    tokens: Tensor


def extend(log_probs: Tensor, scores: Tensor, candidates: RowVocab | None = None) -> Candidates:
    """Every (beam, token) extension of a sentence's beams, scored; the 2k best of each sentence. With
    a shortlist, the columns of ``log_probs`` are those of each sentence's group (``candidates``)."""
    (n, k), vocab = scores.shape, log_probs.size(-1)
    total = log_probs.view(n, k, vocab).add_(scores[:, :, None]).view(n, k * vocab)  # no new buffer
    top_scores, top_ids = total.topk(min(2 * k, k * vocab), dim=1)
    tokens = top_ids % vocab
    if candidates is not None:
        tokens = candidates.ids_of(tokens)
    return Candidates(top_scores, top_ids // vocab, tokens)


@dataclass
class Chosen:
    """The new beams: k per sentence, in the layout of :class:`Beams`."""

    scores: Tensor  # (n, k)
    rows: Tensor  # (n * k,) the beam row each extends
    tokens: Tensor  # (n * k,)

    def keep(self, staying: Tensor) -> Chosen:
        """Only the sentences ``staying`` (positions among the n)."""
        n, k = self.scores.shape
        rows, tokens = self.rows.view(n, k)[staying].view(-1), self.tokens.view(n, k)[staying].view(-1)
        return Chosen(self.scores[staying], rows, tokens)


def choose_beams(candidates: Candidates, k: int) -> Chosen:
    """The first k finite candidates of each sentence that do not end; if there are fewer, dummies
    scored -inf, which can never finish (rather than extensions past an EOS)."""
    n, device = candidates.scores.size(0), candidates.scores.device
    live = candidates.tokens.ne(EOS_ID) & candidates.scores.isfinite()
    order = (~live).long() * (2 * k) + torch.arange(live.size(1), device=device)
    pick = order.topk(k, dim=1, largest=False).indices
    scores = candidates.scores.gather(1, pick).masked_fill(~live.gather(1, pick), -math.inf)
    rows = (torch.arange(n, device=device)[:, None] * k + candidates.beams.gather(1, pick)).view(-1)
    return Chosen(scores, rows, candidates.tokens.gather(1, pick).view(-1))


@dataclass
class Finished:
    """Finished hypotheses of every sentence of the batch, in tensors, in the order found (which
    breaks ties when sorting): k slots per sentence, plus a sink slot that takes the writes of the
    EOS candidates not kept."""

    count: Tensor  # (batch,) slots used, at most k
    tokens: Tensor  # (batch, k + 1, longest budget)
    length: Tensor  # (batch, k + 1)
    log_prob: Tensor  # (batch, k + 1)

    @classmethod
    def empty(cls, batch: int, k: int, longest: int, device: torch.device) -> Finished:
        return cls(
            count=torch.zeros(batch, dtype=torch.long, device=device),
            tokens=torch.zeros(batch, k + 1, longest, dtype=torch.long, device=device),
            length=torch.zeros(batch, k + 1, dtype=torch.long, device=device),
            log_prob=torch.zeros(batch, k + 1, device=device),
        )

    def ending(self, candidates: Candidates, sentences: Tensor) -> tuple[Tensor, Tensor]:
        """The candidates among each sentence's top k that end in EOS (n, k), and how many finished
        hypotheses each sentence has with them (n,), at most k."""
        k = self.length.size(1) - 1
        ends = candidates.tokens[:, :k].eq(EOS_ID) & candidates.scores[:, :k].isfinite()
        return ends, (self.count[sentences] + ends.sum(dim=1)).clamp_(max=k)

    def record(self, candidates: Candidates, ends: Tensor, count: Tensor, beams: Beams, step: int) -> None:
        """Write the ending candidates into their sentences' next free slots, those beyond k into the sink."""
        n, k = ends.shape
        slot = (self.count[beams.sentences][:, None] + ends.cumsum(dim=1) - 1).masked_fill_(~ends, k)
        slot.clamp_(max=k)
        sentence = beams.sentences[:, None].expand(n, k)
        self.log_prob[sentence, slot] = candidates.scores[:, :k]
        self.length[sentence, slot] = step
        prefixes = beams.history.view(n, k, step).gather(1, candidates.beams[:, :k, None].expand(n, k, step))
        self.tokens[sentence, slot, :step] = prefixes
        self.count[beams.sentences] = count

    def best(self, cfg: DecodingConfig) -> list[list[Hypothesis]]:
        """The ``cfg.nbest`` best hypotheses of every sentence, best first."""
        counts, lengths = self.count.tolist(), self.length.tolist()
        all_tokens, log_prob = self.tokens.tolist(), self.log_prob.tolist()
        results = []
        for s, count in enumerate(counts):
            hyps = [hypothesis(all_tokens[s][j][: lengths[s][j]], log_prob[s][j], cfg) for j in range(count)]
            results.append(sorted(hyps, key=lambda h: -h.score)[: cfg.nbest])
        return results


def reorder(model: Seq2Seq, state: State, beam_rows: Tensor, sentences: Tensor | None, k: int) -> State:
    """The model's state for the new beams: the per-sentence part keeps the rows ``sentences`` (when
    given), each shared by k beams, and ``model.reorder`` moves the beams. With k = 1 every row is a
    sentence of its own: ``model.reorder`` alone moves all of it."""
    if sentences is not None and k > 1:
        state = select_sentences(state, sentences, beams=k)
    return model.reorder(state, beam_rows)


def advance(
    model: Seq2Seq, state: State, beams: Beams, chosen: Chosen, done: list[bool], step: int
) -> tuple[Beams, State]:
    """The new beams of the sentences not ``done``, and the model's state reordered to them.

    Until step 0 the state has one row per beam (see :func:`beam_search`); its first reorder keeps, of
    what beams share, one row per sentence: its first beam's.
    """
    k, device = beams.k, beams.scores.device
    sentences, budgets, budget, staying = beams.sentences, beams.budgets, beams.budget, None
    if any(done):
        keep = [i for i, d in enumerate(done) if not d]
        staying = torch.tensor(keep, device=device)
        chosen = chosen.keep(staying)
        sentences, budgets, budget = sentences[staying], [budgets[i] for i in keep], budget[staying]
    history = torch.cat([beams.history[chosen.rows], chosen.tokens[:, None]], dim=1)
    if step == 0:
        shared = (staying if staying is not None else torch.arange(len(done), device=device)) * k
    else:
        shared = staying
    state = reorder(model, state, chosen.rows, shared, k)
    return Beams(sentences, budgets, budget, chosen.scores, chosen.tokens, history), state


@torch.inference_mode()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    cfg: DecodingConfig,
    limit: int,
    prefixes: Sequence[Sequence[int]] | None = None,
    shortlist: Shortlist | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``cfg.nbest`` best hypotheses per sentence, best first, each
    beginning with the sentence's target prefix when ``prefixes`` (one per row of ``src``) are given,
    made of the sentence's candidates of ``shortlist`` when one is given."""
    k, batch, device = cfg.beam_size, src.size(0), src.device
    start = SearchStart.of(src, cfg, limit, model.vocab_sizes["tgt"], prefixes, shortlist)
    vocab = start.vocab
    beams = Beams.start(start.budgets, k, device)
    finished = Finished.empty(batch, k, max(start.budgets), device)
    # k identical beams per sentence, as a batch of one hypothesis per row: the first step computes
    # exactly what it always did (a matrix product of other row counts may round differently), and
    # the first reorder keeps one row per sentence of what the beams share.
    rows = torch.arange(batch, device=device).repeat_interleave(k)
    state = model.init_state(model.reorder(model.encode(src), rows), cache=cfg.cache)
    state = start.restrict(model, state, per_sentence=k)
    for step in itertools.count():
        log_probs, state = model.step(beams.tokens, state)
        at_budget = beams.must_end(step)
        must_end = at_budget.repeat_interleave(k) if step >= min(beams.budgets) else None
        prefix = start.prefixes.at(step, beams.sentences, k) if start.prefixes else None
        rows = vocab.row_vocab(beams.sentences, k) if vocab is not None else None
        log_probs = constrain(log_probs, cfg, beams.history, must_end, prefix, rows)
        candidates = extend(log_probs, beams.scores, vocab.row_vocab(beams.sentences) if vocab else None)
        ends, count = finished.ending(candidates, beams.sentences)
        chosen = choose_beams(candidates, k)
        done = count.ge(k) | at_budget | ~chosen.scores.isfinite().any(dim=1)
        *done_list, any_end = torch.cat([done, ends.any()[None]]).tolist()  # the one transfer per step
        if any_end:
            finished.record(candidates, ends, count, beams, step)
        if all(done_list):
            break
        beams, state = advance(model, state, beams, chosen, done_list, step)
    return finished.best(cfg)
