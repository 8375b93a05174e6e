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
from nmt.models.base import Seq2Seq, State


class Ensemble(Seq2Seq):
    def __init__(self, models: list[Seq2Seq]):
        super().__init__()
        if not models:
            raise NMTError("an ensemble needs at least one model")
        self.models = nn.ModuleList(models)
        self.vocab_sizes = dict(models[0].vocab_sizes)

    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        raise NMTError("an ensemble decodes; train its models one by one")

    def encode(self, src: Tensor) -> State:
        return {"members": [m.encode(src) for m in self.models]}

    def init_state(self, encoded: State, cache: bool = True) -> State:
        return {"members": [m.init_state(e, cache) for m, e in zip(self.models, encoded["members"])]}

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        steps = [m.step(tokens, s) for m, s in zip(self.models, state["members"])]
        members = [s for _, s in steps]
        if len(steps) == 1:  # exactly the model's own numbers
            return steps[0][0], {"members": members}
        log_probs = torch.stack([lp for lp, _ in steps]).logsumexp(dim=0) - math.log(len(steps))
        return log_probs, {"members": members}

    def reorder(self, state: State, indices: Tensor, sentences: Tensor | None = None) -> State:
        members = zip(self.models, state["members"])
        return {"members": [m.reorder(s, indices, sentences) for m, s in members]}

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The first model's: the models' layers and heads need not correspond."""
        return self.models[0].cross_attention(src, tgt_in)
