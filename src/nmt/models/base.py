"""The interface every translation model offers to training and to search.

Training calls ``model(src, tgt_in, keep)``. Greedy and beam search use only ``encode``,
``init_state``, ``step`` and ``reorder``, so a Transformer (key/value cache in the state) and
RNNsearch (hidden state in the state) share one search implementation; scoring given translations
uses ``teacher_forced_log_probs``. With a vocabulary shortlist the search also calls
``restrict_output``: from then on ``step`` scores only the target ids of an :class:`OutputVocab`.

The decoding state is a nest of dicts/lists of tensors whose first dimension is the hypothesis.
What the hypotheses of one sentence share because it depends on the source alone (the encoder
output, the cross-attention keys/values) a model may put into a :class:`PerSentence` part of its
state, so that beam search keeps it once per sentence instead of once per beam. The model only says
which part that is; the search owns the layout (how many hypotheses each row serves, which
sentences stay: :func:`select_sentences`), and ``reorder(state, beam_indices)`` moves hypotheses.
A tensor that a step copies anyway (a key/value cache it appends to) may sit in the state as
:class:`LazyRows`: ``reorder`` then only records which rows to take, and the step takes them in the
copy it makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from nmt.text.special import PAD_ID

State = dict[str, Any]


class PerSentence(dict):
    """The part of a decoding state that holds one row per sentence, shared by ``beams`` consecutive
    hypothesis rows of the rest of the state.

    A model creates it with ``beams=1`` (a row per hypothesis): it then moves with the hypotheses like
    everything else, which is all that greedy search needs. Beam search regroups it with
    :func:`select_sentences`; from then on ``reorder`` leaves it alone (beams move within their
    sentences) and the model sees more query rows than rows here (``beams`` per row).
    """

    def __init__(self, parts: dict[str, Any], beams: int = 1):
        super().__init__(parts)
        self.beams = beams

    def with_parts(self, **parts: Any) -> PerSentence:
        """A copy with some parts replaced (the same layout)."""
        return PerSentence({**self, **parts}, self.beams)


@dataclass(frozen=True, eq=False)
class LazyRows:
    """``tensor.index_select(0, rows)``, not taken yet: what ``reorder`` makes of it, so that the rows
    of a tensor that the next step copies anyway are taken in that copy (a key/value cache gathers the
    new beams' rows and appends the step's keys in one copy instead of two:
    :func:`~nmt.models.kernels.gather_append`). ``rows`` None: all of them, in order."""

    tensor: Tensor
    rows: Tensor | None = None

    def select(self, indices: Tensor) -> LazyRows:
        """These rows' ``indices``: one selection, however many reorders come before the next copy."""
        return LazyRows(self.tensor, indices if self.rows is None else self.rows.index_select(0, indices))

    def take(self) -> Tensor:
        """The selected rows, as a tensor."""
        return self.tensor if self.rows is None else self.tensor.index_select(0, self.rows)

    def size(self, dim: int) -> int:
        return self.tensor.size(dim) if dim != 0 or self.rows is None else self.rows.size(0)


@dataclass(frozen=True, eq=False)
class OutputVocab:
    """The target ids a search scores when not all of them (a vocabulary shortlist's candidates), in
    groups of hypotheses scored together.

    ``step`` then returns log-probabilities over the ids of each hypothesis' group (column i of a row
    of group g is target id ``ids[g, i]``), each hypothesis row normalised over its own candidates
    (``allowed``) and -inf elsewhere, so that a sentence gets the same numbers whichever sentences
    share its batch or its group.
    """

    ids: Tensor  # (groups, n) target ids; the special ids 0..3 are in, at positions 0..3
    allowed: Tensor | None  # (hypotheses, n) bool: each row's own candidates; None = all n for every row
    group: Tensor  # (hypotheses,) each row's group; rows of a group are consecutive, groups ascending


@dataclass(frozen=True, eq=False)
class OutputRows:
    """The output layer's rows of an :class:`OutputVocab`'s groups, taken once: the same for every
    hypothesis of a group, so not a tensor of the state that ``reorder`` would index (it passes
    through as it is)."""

    weight: Tensor  # (groups, n, hidden)
    bias: Tensor | None  # (groups, n)


class Seq2Seq(nn.Module):
    """Base class of the encoder-decoder models."""

    vocab_sizes: dict[str, int]  # {"src": ..., "tgt": ...}, checked when loading checkpoints
    output: nn.Linear  # the projection onto the target vocabulary (rows = target ids)

    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (batch, tgt_len, vocab); only at positions ``keep`` (N, vocab) when given."""
        raise NotImplementedError

    def teacher_forced_log_probs(
        self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None, outside: Tensor | None = None
    ) -> Tensor:
        """fp32 log-probabilities of the next target token under teacher forcing, shaped as ``forward``'s
        logits: what ``step`` gives along ``tgt_in``, in one pass (scoring given translations). With
        ``outside`` (bool, the logits' shape), normalised over the other ids only, as ``step`` is after
        ``restrict_output``."""
        logits = self(src, tgt_in, keep)
        if outside is not None:
            logits.masked_fill_(outside, -math.inf)  # a fresh tensor: no second copy
        return log_softmax_fp32(logits)

    def encode(self, src: Tensor) -> State:
        """Encode (batch, src_len) ids; the result holds whatever ``init_state`` needs."""
        raise NotImplementedError

    def init_state(self, encoded: State, cache: bool = True) -> State:
        """Decoder state before the first target token. ``cache=False`` recomputes the prefix each step."""
        raise NotImplementedError

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Feed the last target token (batch,) and return log-probabilities (batch, vocab) in fp32."""
        raise NotImplementedError

    def restrict_output(self, state: State, vocab: OutputVocab) -> State:
        """The decoding state whose ``step`` scores only the ids of ``vocab`` (see :class:`OutputVocab`):
        the output layer's rows of each group's ids, and each hypothesis' own candidates and group,
        which ``reorder`` moves with it. Called once, after ``init_state``."""
        bias = self.output.bias
        rows = OutputRows(self.output.weight[vocab.ids], None if bias is None else bias[vocab.ids])
        outside = None if vocab.allowed is None else ~vocab.allowed
        return {**state, "output": {"rows": rows, "outside": outside, "group": vocab.group}}

    def output_log_probs(self, hidden: Tensor, state: State) -> Tensor:
        """fp32 log-probabilities of the next token from the decoder's output ``hidden`` (rows, dim): over
        the whole target vocabulary, or over the ids of ``restrict_output``: one product per group
        (whose row counts the host reads: on a GPU, one more synchronisation per step)."""
        if "output" not in state:
            return log_softmax_fp32(self.output(hidden))
        restricted = state["output"]
        weight, bias = restricted["rows"].weight, restricted["rows"].bias
        counts = torch.bincount(restricted["group"], minlength=weight.size(0)).tolist()
        parts = [
            nn.functional.linear(rows, weight[g], None if bias is None else bias[g])
            for g, rows in enumerate(hidden.split(counts))
            if counts[g]
        ]
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        if restricted["outside"] is not None:
            logits.masked_fill_(restricted["outside"], -math.inf)
        return log_softmax_fp32(logits)

    def search_bytes(self, src_positions: int, tgt_positions: int, beams: int) -> int:
        """Bytes of the decoding state that the search of one sentence keeps (``src_positions`` source
        positions, EOS included, searched with ``beams`` hypotheses up to ``tgt_positions`` target
        positions): what bounds a search's memory, so that a service can cut its batches to fit."""
        raise NotImplementedError

    def reorder(self, state: State, beam_indices: Tensor) -> State:
        """The state of the hypotheses ``beam_indices`` (rows of the current state, in their new order):
        beam search's new beams, or the sentences that stay when others finish.

        A :class:`PerSentence` part follows only while it has one hypothesis per row; once the search
        has made it serve several, the beams move within their sentences and it stays as it is.
        """
        return reorder_state(state, beam_indices)

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Cross-attention weights (layers, batch, heads, tgt_len, src_len) under teacher forcing."""
        raise NotImplementedError

    @property
    def dtype_bytes(self) -> int:
        """Bytes per number of the weights, and so of the decoding state computed from them."""
        return next(self.parameters()).element_size()

    @staticmethod
    def padding_mask(src: Tensor) -> Tensor:
        """True where ``src`` is padding."""
        return src.eq(PAD_ID)


def reorder_state(state: Any, indices: Tensor) -> Any:
    """Index the first dimension of every tensor in a nest of dicts/lists (of a :class:`LazyRows`, only
    record it); other values pass through, and so does a :class:`PerSentence` part that serves several
    hypotheses per row."""
    if isinstance(state, Tensor):
        return state.index_select(0, indices) if state.dim() > 0 else state
    if isinstance(state, LazyRows):
        return state.select(indices)
    if isinstance(state, PerSentence):
        return state if state.beams > 1 else PerSentence(reorder_state(dict(state), indices))
    if isinstance(state, dict):
        return {key: reorder_state(value, indices) for key, value in state.items()}
    if isinstance(state, list):
        return [reorder_state(value, indices) for value in state]
    return state


def select_sentences(state: Any, sentences: Tensor, beams: int) -> Any:
    """Keep the rows ``sentences`` (in that order) of every :class:`PerSentence` part in a nest, each to
    serve ``beams`` hypotheses from now on; the hypothesis rows are left to ``reorder``."""
    if isinstance(state, PerSentence):
        return PerSentence(reorder_state(dict(state), sentences), beams)
    if isinstance(state, dict):
        return {key: select_sentences(value, sentences, beams) for key, value in state.items()}
    if isinstance(state, list):
        return [select_sentences(value, sentences, beams) for value in state]
    return state


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (tied embeddings count once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def log_softmax_fp32(logits: Tensor) -> Tensor:
    return torch.log_softmax(logits.float(), dim=-1)
