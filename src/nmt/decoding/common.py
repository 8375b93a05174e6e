"""What greedy search, beam search and scoring share: hypotheses and their ranking score, length
budgets, the rules applied to the model's next-token log-probabilities (target prefixes among them),
the target ids a batch is scored over with a vocabulary shortlist, the set-up of a batch's search
(:class:`SearchStart`), batches."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from nmt.config import DecodingConfig
from nmt.decoding.shortlist import SPECIALS, Shortlist
from nmt.errors import NMTError, count_mismatch
from nmt.models.base import OutputVocab, Seq2Seq, State
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID


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
    """Output tokens allowed before EOS: a * src_len + b (src_len counts EOS), within ``limit``. Any
    finite a and b >= 0 are computable: a huge one (1e308, 10**400) is the limit, never an overflow."""
    if b >= limit:
        return max(1, limit)
    total = a * src_len + b  # b < limit: a float; inf when a * src_len overflows
    return max(1, limit if not total < limit else int(total))


def budget_for_source(source_len: int, cfg: DecodingConfig, limit: int) -> int:
    """The output budget of a source of ``source_len`` subwords (its EOS counted here): the longest
    output its search produces, so the longest target prefix it can be forced to start with."""
    return length_budget(source_len + 1, cfg.max_len_a, cfg.max_len_b, limit)


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


def only_eos(log_probs: Tensor, rows: Tensor) -> None:
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


@dataclass
class PrefixStep:
    """The rows of a step that are inside their target prefix, and the token each must take."""

    rows: Tensor  # (rows,) bool
    tokens: Tensor  # (rows,) the prefix token at this step (PAD where no prefix is left)


def constrain(
    log_probs: Tensor,
    cfg: DecodingConfig,
    history: Tensor | None,
    must_end: Tensor | None,
    prefix: PrefixStep | None,
    vocab: RowVocab | None = None,
) -> Tensor:
    """The search's rules on the model's next-token log-probabilities (rows, vocab), in place: PAD and
    BOS (UNK with no_unk) are banned, so are repeated n-grams of ``history`` (rows, step; only needed
    with ``cfg.no_repeat_ngram``), rows at their length budget (``must_end``, bool) may only end, and
    rows inside their target prefix only take its token, at the model's log-probability of it (so that
    any token can be forced, UNK with no_unk included).

    With a shortlist, the columns are the positions of ``vocab.ids``; ``history`` and the prefix
    tokens are target ids (every one among its row's candidates), and the special ids are at their
    own positions."""
    if vocab is not None:
        history = vocab.positions_of(history) if history is not None else None
        prefix = PrefixStep(prefix.rows, vocab.positions_of(prefix.tokens)) if prefix is not None else None
    if prefix is not None:
        model_log_prob = log_probs.gather(1, prefix.tokens[:, None])
    log_probs = mask_logits(log_probs, cfg.no_unk)
    if cfg.no_repeat_ngram:
        block_repeated_ngrams(log_probs, history, cfg.no_repeat_ngram)
    if must_end is not None:
        only_eos(log_probs, must_end)
    if prefix is not None:
        rows = prefix.rows[:, None]
        value = torch.where(rows, model_log_prob, log_probs.gather(1, prefix.tokens[:, None]))
        log_probs.masked_fill_(rows, -math.inf).scatter_(1, prefix.tokens[:, None], value)
    return log_probs


@dataclass
class BatchVocab:
    """The target ids a batch is scored over with a vocabulary shortlist (:mod:`nmt.decoding.shortlist`): for
    each group of ``group_size`` consecutive sentences, the sorted union of their candidates, and
    which of them are each sentence's own.

    A sentence's candidates are the shortlist's for its source subwords (the frequent target subwords
    and the special ids among them), the special ids again and its target prefix's tokens. The model
    scores each group's union once for the group's hypotheses (one matrix product per group), but
    each hypothesis only over its sentence's own candidates (:class:`~nmt.models.base.OutputVocab`),
    so batching never changes a translation. Groups keep the products narrow: the union of a whole
    batch of a hundred sentences is several times wider than that of four. The special ids 0..3 are
    always in, so sorted they keep their positions; a group's union shorter than the widest is
    padded with PAD (banned anyway). Tokens stay target ids in the search: the model's
    log-probabilities come in positions of ``ids[group]``, which ``ids`` maps back and ``position``
    maps to.
    """

    ids: Tensor  # (groups, n) each group's ascending target ids, padded with PAD
    allowed: Tensor | None  # (sentences, n) bool: each sentence's own; None when every one's are all n
    group: Tensor  # (sentences,) the group of each sentence of the batch
    found: tuple[Tensor, Tensor]  # every (group, id) pair, and the id's column in its group
    vocab_size: int

    @cached_property
    def position(self) -> Tensor:
        """(groups, target vocabulary) each id's column in its group's ids (0, PAD's, if not in): only
        built when the search maps target ids to columns (n-gram blocking, target prefixes)."""
        pairs, column = self.found
        position = torch.zeros(self.ids.size(0), self.vocab_size, dtype=torch.long, device=self.ids.device)
        position[pairs[:, 0], pairs[:, 1]] = column
        return position

    @classmethod
    def of(
        cls,
        shortlist: Shortlist,
        src: Tensor,
        prefixes: Sequence[Sequence[int]] | None,
        vocab_size: int,
        group_size: int,
    ) -> BatchVocab:
        """The candidates of the sentences of ``src`` (a padded batch) and their ``prefixes``, found
        on the batch's device: a sentence's row of a (sentences, vocabulary) membership table."""
        device, sentences = src.device, src.size(0)
        member = torch.zeros(sentences, vocab_size, dtype=torch.bool, device=device)
        member.scatter_(1, shortlist.table.to(device)[src].flatten(1), True)  # PAD's row: PAD alone
        member[:, torch.tensor([*SPECIALS, *shortlist.always], device=device)] = True
        for i, prefix in enumerate(prefixes or ()):
            member[i, torch.tensor(list(prefix), dtype=torch.long, device=device)] = True
        group_size = min(group_size, sentences)
        group = torch.arange(sentences, device=device) // group_size
        groups = (sentences + group_size - 1) // group_size
        filler = member.new_zeros(groups * group_size - sentences, vocab_size)  # the last group's
        in_group = torch.cat([member, filler]).view(groups, group_size, vocab_size).any(dim=1)
        found = in_group.nonzero()  # (group, id) pairs, each group's ids ascending
        counts = in_group.sum(dim=1)
        column = torch.arange(found.size(0), device=device) - (counts.cumsum(0) - counts)[found[:, 0]]
        width = int(counts.max())
        ids = torch.full((groups, width), PAD_ID, dtype=torch.long, device=device)
        ids[found[:, 0], column] = found[:, 1]
        padding = torch.arange(width, device=device) >= counts[:, None]  # PAD's id, no candidate
        allowed = member.gather(1, ids[group]) & ~padding[group]
        return cls(ids, None if bool(allowed.all()) else allowed, group, (found, column), vocab_size)

    def output_vocab(self, per_sentence: int) -> OutputVocab:
        """What the model scores for a state of ``per_sentence`` consecutive rows per sentence."""
        allowed, group = self.allowed, self.group
        if per_sentence > 1:
            group = group.repeat_interleave(per_sentence)
            allowed = allowed.repeat_interleave(per_sentence, dim=0) if allowed is not None else None
        return OutputVocab(self.ids, allowed, group)

    def row_vocab(self, sentences: Tensor, per_sentence: int = 1) -> RowVocab:
        """The ids and positions of hypothesis rows of ``sentences`` (rows of the batch), each sentence
        ``per_sentence`` consecutive rows."""
        group = self.group[sentences]
        if per_sentence > 1:
            group = group.repeat_interleave(per_sentence)
        return RowVocab(self, group)


@dataclass
class RowVocab:
    """A batch's candidates as seen from some of its hypothesis rows: each row's group."""

    vocab: BatchVocab
    group: Tensor  # (rows,)

    def positions_of(self, tokens: Tensor) -> Tensor:
        """The columns of target ids ``tokens`` (rows, ...) in each row's group."""
        group = self.group.view(-1, *([1] * (tokens.dim() - 1)))
        return self.vocab.position[group, tokens]

    def ids_of(self, columns: Tensor) -> Tensor:
        """The target ids of columns ``columns`` (rows, ...) of each row's group."""
        group = self.group.view(-1, *([1] * (columns.dim() - 1)))
        return self.vocab.ids[group, columns]


def check_shortlist(shortlist: Shortlist, vocab_sizes: dict[str, int]) -> None:
    """One line when the shortlist was built for vocabularies of other sizes than the model's."""
    sizes = {"src": len(shortlist.candidates), "tgt": shortlist.tgt_vocab_size}
    if sizes != vocab_sizes:
        raise NMTError(
            f"the shortlist is for vocabularies of {sizes['src']}/{sizes['tgt']} source/target subwords, "
            f"the model has {vocab_sizes['src']}/{vocab_sizes['tgt']}: build it for this model's tokenizer"
        )


class Prefixes:
    """Target prefixes of a batch (lists of token ids, possibly empty) that the search is forced through
    before it continues freely: padded into (batch, longest) on the device."""

    def __init__(self, prefixes: Sequence[Sequence[int]], device: torch.device | str):
        self.longest = max(len(p) for p in prefixes)
        self.lengths = torch.tensor([len(p) for p in prefixes], device=device)
        self.tokens = torch.full((len(prefixes), self.longest), PAD_ID, dtype=torch.long)
        for i, p in enumerate(prefixes):
            self.tokens[i, : len(p)] = torch.tensor(list(p), dtype=torch.long)
        self.tokens = self.tokens.to(device)

    @classmethod
    def of(
        cls,
        prefixes: Sequence[Sequence[int]] | None,
        budgets: list[int],
        vocab: int,
        device: torch.device | str,
    ) -> Prefixes | None:
        """The batch's prefixes, checked (:func:`check_prefixes`); None when there are none to force."""
        if prefixes is None:
            return None
        check_prefixes(prefixes, budgets, vocab, range(len(budgets)))
        return cls(prefixes, device) if any(prefixes) else None

    def at(self, step: int, sentences: Tensor, rows_per_sentence: int = 1) -> PrefixStep | None:
        """What is forced at ``step`` for hypothesis rows of ``sentences`` (rows of the batch), each
        sentence ``rows_per_sentence`` consecutive rows; None once every prefix is over."""
        if step >= self.longest:
            return None
        inside, tokens = self.lengths[sentences] > step, self.tokens[sentences, step]
        if rows_per_sentence > 1:
            inside = inside.repeat_interleave(rows_per_sentence)
            tokens = tokens.repeat_interleave(rows_per_sentence)
        return PrefixStep(inside, tokens)


def check_prefixes(
    prefixes: Sequence[Sequence[int]], budgets: Sequence[int], vocab: int, sentences: Sequence[int]
) -> None:
    """One line naming the sentence (``sentences[i]`` for the i-th prefix) whose prefix cannot be
    forced: a special id or one outside the target vocabulary, or more tokens than its length budget."""
    if mismatch := count_mismatch(len(prefixes), len(budgets), "target prefixes", "sentence"):
        raise NMTError(mismatch)
    for prefix, budget, sentence in zip(prefixes, budgets, sentences):
        bad = [t for t in prefix if not UNK_ID <= t < vocab or t in (BOS_ID, EOS_ID)]
        if bad:
            raise NMTError(
                f"target prefix of sentence {sentence}: token id {bad[0]} is not an output token "
                f"(ids {UNK_ID} and {EOS_ID + 1}..{vocab - 1})"
            )
        if len(prefix) > budget:
            raise NMTError(
                f"target prefix of sentence {sentence} has {len(prefix)} tokens, more than its output "
                f"length budget of {budget} (decoding.max_len_a * source length + decoding.max_len_b, "
                "within the model's positions)"
            )


@dataclass
class SearchStart:
    """What greedy and beam search set up alike before their first step: each sentence's length
    budget, the target prefixes to force (None when there are none) and, with a shortlist, the
    batch's candidates (None without)."""

    budgets: list[int]
    prefixes: Prefixes | None
    vocab: BatchVocab | None

    @classmethod
    def of(
        cls,
        src: Tensor,
        cfg: DecodingConfig,
        limit: int,
        vocab_size: int,
        prefixes: Sequence[Sequence[int]] | None,
        shortlist: Shortlist | None,
    ) -> SearchStart:
        """The set-up for ``src`` (a padded batch) and its ``prefixes`` (checked:
        :func:`check_prefixes`), within ``limit`` positions and ``vocab_size`` target ids."""
        budgets = max_lengths(src, cfg.max_len_a, cfg.max_len_b, limit)
        padded = Prefixes.of(prefixes, budgets, vocab_size, src.device)
        vocab = None
        if shortlist is not None:
            vocab = BatchVocab.of(shortlist, src, prefixes, vocab_size, cfg.shortlist_group)
        return cls(budgets, padded, vocab)

    def restrict(self, model: Seq2Seq, state: State, per_sentence: int) -> State:
        """The model's initial ``state`` (``per_sentence`` consecutive rows per sentence) scoring only
        the batch's candidates; unchanged without a shortlist."""
        if self.vocab is None:
            return state
        return model.restrict_output(state, self.vocab.output_vocab(per_sentence))


def batch_source_tokens(cfg: DecodingConfig) -> int:
    """Source tokens per decoding batch: ``decoding.max_tokens`` counts them times the beam size."""
    return max(1, cfg.max_tokens // max(cfg.beam_size, 1))


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
