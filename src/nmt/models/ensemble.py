"""Several trained models decoding as one (``checkpoint=[a.pt,b.pt]``): at every step the ensemble's
distribution is the mean of the models' probabilities, log(1/n sum_i p_i), as in fairseq, Marian and
OpenNMT-py. It offers the search interface (``encode``/``init_state``/``step``/``reorder``) over the
models' own states, so greedy and beam search run unchanged, and any models that share the target
vocabulary can be combined (Transformer variants and RNNsearch alike).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt.errors import NMTError
from nmt.models.base import OutputVocab, Seq2Seq, State


def mean_of_probabilities(log_probs: list[Tensor]) -> Tensor:
    """log(1/n sum_i p_i) of n models' log-probabilities; one model's exactly as they are."""
    if len(log_probs) == 1:
        return log_probs[0]
    return torch.stack(log_probs).logsumexp(dim=0) - math.log(len(log_probs))


class Ensemble(Seq2Seq):
    def __init__(self, models: list[Seq2Seq]):
        super().__init__()
        if not models:
            raise NMTError("an ensemble needs at least one model")
        self.models = nn.ModuleList(models)
        self.vocab_sizes = dict(models[0].vocab_sizes)

    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        raise NMTError("an ensemble decodes; train its models one by one")

    def teacher_forced_log_probs(
        self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None, outside: Tensor | None = None
    ) -> Tensor:
        members = [m.teacher_forced_log_probs(src, tgt_in, keep, outside) for m in self.models]
        return mean_of_probabilities(members)

    def encode(self, src: Tensor) -> State:
        return {"members": [m.encode(src) for m in self.models]}

    def init_state(self, encoded: State, cache: bool = True) -> State:
        return {"members": [m.init_state(e, cache) for m, e in zip(self.models, encoded["members"])]}

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        steps = [m.step(tokens, s) for m, s in zip(self.models, state["members"])]
        return mean_of_probabilities([lp for lp, _ in steps]), {"members": [s for _, s in steps]}

    def restrict_output(self, state: State, vocab: OutputVocab) -> State:
        members = zip(self.models, state["members"])
        return {"members": [m.restrict_output(s, vocab) for m, s in members]}

    def reorder(self, state: State, beam_indices: Tensor) -> State:
        members = zip(self.models, state["members"])
        return {"members": [m.reorder(s, beam_indices) for m, s in members]}

    def search_bytes(self, src_positions: int, tgt_positions: int, beams: int) -> int:
        """Every model keeps its own state."""
        return sum(m.search_bytes(src_positions, tgt_positions, beams) for m in self.models)

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The first model's: the models' layers and heads need not correspond."""
        return self.models[0].cross_attention(src, tgt_in)
