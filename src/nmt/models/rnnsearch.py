"""RNNsearch: "Neural Machine Translation by Jointly Learning to Align and Translate" (Bahdanau, Cho
and Bengio, 2014).

A bidirectional GRU reads the source into annotations h_j = [forward_j; backward_j]. A GRU decoder
emits one target word per step: from its previous state s_{i-1} it scores every annotation
(additive attention), takes their weighted mean as context c_i, and updates
s_i = GRU(s_{i-1}, [E y_{i-1}; c_i]). The word is predicted from t_i = maxout(U_o s_i + V_o E y_{i-1}
+ C_o c_i) (the "deep output"). Eq. 4 of the paper conditions the output on s_i, as here and in
GroundHog/dl4mt; its appendix writes s_{i-1}.

For search, the decoding state is the recurrent state plus the precomputed keys U_a h_j: there is
no other cache, so ``init_state(cache=False)`` decodes the same way. In beam search every hypothesis
keeps its own copy of its sentence's keys and annotations (the state has no
:class:`~nmt.models.base.PerSentence` part).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.config import RNNSearchConfig
from nmt.models.attention import additive_scores, softmax_combine
from nmt.models.base import Seq2Seq, State
from nmt.text.special import PAD_ID


class BahdanauAttention(nn.Module):
    """score(s, h_j) = v_a . tanh(W_a s + U_a h_j); the context is the weighted sum of the raw h_j.

    Not :class:`~nmt.models.attention.AdditiveAttention`: that module projects queries, keys and
    values from one ``d_model`` and projects the output again, while here the query (decoder state,
    ``hidden_size``) and the keys (annotations, ``2 * hidden_size``) differ in size and the paper
    has no value or output projection. The scoring math is shared (:func:`additive_scores`).
    """

    def __init__(self, query_dim: int, key_dim: int, attention_dim: int):
        super().__init__()
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)  # W_a
        self.key_proj = nn.Linear(key_dim, attention_dim)  # U_a (its bias stands for the paper's b_a)
        self.v_a = nn.Parameter(torch.zeros(1, attention_dim))  # zero: uniform attention at first

    def forward(self, state: Tensor, keys: Tensor, annotations: Tensor, pad: Tensor) -> tuple[Tensor, Tensor]:
        """state (batch, hidden), keys = U_a h (batch, src, attention_dim), annotations (batch, src, 2h),
        pad (batch, src) -> context (batch, 2h), weights (batch, src)."""
        q = self.query_proj(state)[:, None, None, :]  # (batch, heads=1, tgt=1, attention_dim)
        scores = additive_scores(q, keys[:, None], self.v_a, chunk=1)
        context, weights = softmax_combine(scores, annotations[:, None], ~pad[:, None, None, :], 0.0)
        return context[:, 0, 0], weights[:, 0, 0]


class RNNSearch(Seq2Seq):
    """Bidirectional GRU encoder, GRU decoder with additive attention, maxout (or tanh) readout."""

    def __init__(self, cfg: RNNSearchConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool):
        super().__init__()
        self.cfg, self.vocab_sizes = cfg, {"src": src_vocab, "tgt": tgt_vocab}
        hidden, annotation = cfg.hidden_size, 2 * cfg.hidden_size
        self.src_embed = nn.Embedding(src_vocab, cfg.embed_dim, padding_idx=PAD_ID)
        share = cfg.share_embeddings and joint_vocab
        self.tgt_embed = (
            self.src_embed if share else nn.Embedding(tgt_vocab, cfg.embed_dim, padding_idx=PAD_ID)
        )
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.GRU(cfg.embed_dim, hidden, batch_first=True, bidirectional=True)
        self.init_proj = nn.Linear(hidden, hidden)  # W_s: s_0 = tanh(W_s backward_1)
        self.attention = BahdanauAttention(hidden, annotation, cfg.attention_dim)
        self.cell = nn.GRUCell(cfg.embed_dim + annotation, hidden)
        # t~ = U_o s_i + V_o E y_{i-1} + C_o c_i as one linear map of the concatenation.
        readout_out = 2 * cfg.readout_dim if cfg.maxout else cfg.readout_dim
        self.readout = nn.Linear(hidden + cfg.embed_dim + annotation, readout_out)
        self.output = nn.Linear(cfg.readout_dim, tgt_vocab)
        self._init_weights()

    def _init_weights(self) -> None:
        """Orthogonal recurrent matrices (one per gate) and zero v_a and biases, as in the paper; Xavier
        for the other matrices. Embeddings are N(0, 1/embed_dim), zero at padding: the paper's
        N(0, 0.01^2) left small models on a plateau several times longer in our toy runs."""
        for name, p in self.named_parameters():
            if "weight_hh" in name:
                for gate in p.data.chunk(3, dim=0):
                    nn.init.orthogonal_(gate)
            elif "embed" in name:
                nn.init.normal_(p, std=self.cfg.embed_dim**-0.5)
                nn.init.zeros_(p.data[PAD_ID])
            elif p.dim() > 1 and name != "attention.v_a":
                nn.init.xavier_uniform_(p)
            elif "bias" in name:
                nn.init.zeros_(p)

    # ----------------------------------------------------------------------------------- training
    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        emb = self.dropout(self.tgt_embed(tgt_in))
        states, contexts, _ = self._teacher_force(self.encode(src), emb)
        if keep is not None:
            states, emb, contexts = states[keep], emb[keep], contexts[keep]
        return self.output(self._readout(states, emb, contexts))

    def _teacher_force(
        self, encoded: State, emb: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Run the decoder over the target embeddings E y_{i-1} (batch, tgt, embed): the loop holds only
        what depends on s_{i-1}; the readout of all positions happens afterwards, in one batch.
        Returns states s_i (batch, tgt, hidden), contexts c_i (batch, tgt, 2h) and, if asked, the
        attention weights (batch, tgt, src)."""
        state = self.init_state(encoded)
        states, contexts, weights = [], [], []
        for i in range(emb.size(1)):
            s, context, w = self._advance(emb[:, i], state)
            state["s"] = s
            states.append(s)
            contexts.append(context)
            weights.append(w)
        stacked_weights = torch.stack(weights, dim=1) if need_weights else None
        return torch.stack(states, dim=1), torch.stack(contexts, dim=1), stacked_weights

    def _advance(self, emb: Tensor, state: State) -> tuple[Tensor, Tensor, Tensor]:
        """One decoder step from s_{i-1} and E y_{i-1} (batch, embed): returns s_i, c_i, weights."""
        context, weights = self.attention(state["s"], state["keys"], state["annotations"], state["pad"])
        s = self.cell(torch.cat([emb, context], dim=-1), state["s"])
        return s, context, weights

    def _readout(self, s: Tensor, emb: Tensor, context: Tensor) -> Tensor:
        """Deep output: maxout over pairs of t~ (or tanh without maxout), dropout; ``self.output``
        projects it onto the vocabulary."""
        t = self.readout(torch.cat([s, emb, context], dim=-1))
        t = t.unflatten(-1, (-1, 2)).amax(dim=-1) if self.cfg.maxout else torch.tanh(t)
        return self.dropout(t)

    # ------------------------------------------------------------------------------------- search
    def encode(self, src: Tensor) -> State:
        """Annotations (batch, src, 2h) of the packed BiGRU, so padding never enters a real position."""
        pad = self.padding_mask(src)
        lengths = (~pad).sum(dim=1).cpu()  # pack_padded_sequence wants lengths on the CPU
        packed = pack_padded_sequence(self.dropout(self.src_embed(src)), lengths, True, enforce_sorted=False)
        annotations, _ = pad_packed_sequence(
            self.encoder(packed)[0], batch_first=True, total_length=src.size(1)
        )
        return {"annotations": annotations, "pad": pad}

    def init_state(self, encoded: State, cache: bool = True) -> State:
        """s_0 = tanh(W_s backward_1) and the keys U_a h_j, computed once per sentence. ``cache`` is
        ignored: the recurrent state already summarises the prefix."""
        annotations = encoded["annotations"]
        backward_first = annotations[:, 0, self.cfg.hidden_size :]
        return {
            "s": torch.tanh(self.init_proj(backward_first)),
            "keys": self.attention.key_proj(annotations),
            "annotations": annotations,
            "pad": encoded["pad"],
        }

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        emb = self.dropout(self.tgt_embed(tokens))
        s, context, _ = self._advance(emb, state)
        return self.output_log_probs(self._readout(s, emb, context), state), {**state, "s": s}

    def search_bytes(self, src_positions: int, tgt_positions: int, beams: int) -> int:
        """Per hypothesis: the annotations and their attention keys over the source, and the hidden state
        (which summarises the target prefix, whatever its length)."""
        cfg = self.cfg
        per_hypothesis = src_positions * (2 * cfg.hidden_size + cfg.attention_dim) + cfg.hidden_size
        return beams * per_hypothesis * self.dtype_bytes

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The alignment matrix as (layers=1, batch, heads=1, tgt_len, src_len)."""
        emb = self.dropout(self.tgt_embed(tgt_in))
        _, _, weights = self._teacher_force(self.encode(src), emb, need_weights=True)
        return weights[None, :, None]
