"""Additive (Bahdanau) attention: the math against a slow reference, masks, chunking, the KV cache,
and a Transformer built with it (training step, incremental decoding, search)."""

import math

import pytest
import torch
from tiny_models import tiny_transformer

from nmt.config import DecodingConfig
from nmt.decoding import beam_search, greedy_search
from nmt.errors import NMTError
from nmt.models import Transformer
from nmt.models.attention import AdditiveAttention, DotProductAttention, build_attention

D_MODEL, HEADS, SCORE_DIM = 8, 2, 5


def make(cross: bool = False, chunk: int = 64, seed: int = 0) -> AdditiveAttention:
    torch.manual_seed(seed)
    return AdditiveAttention(
        D_MODEL, HEADS, dropout=0.0, cross=cross, score_dim=SCORE_DIM, chunk=chunk
    ).eval()


def inputs(batch: int = 2, tgt: int = 3, src: int = 4, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, tgt, D_MODEL, generator=g)
    memory = torch.randn(batch, src, D_MODEL, generator=g)
    pad = torch.zeros(batch, src, dtype=torch.bool)
    pad[1, -2:] = True
    return query, memory, pad


def reference(attn: AdditiveAttention, query, key, value, pad, causal: bool):
    """Explicit loops over batch, head, query and key: v_a[h] . tanh(W_q q + W_k k), then softmax."""
    q, k, v = attn.q_proj(query), attn.k_proj(key), attn.v_proj(value)
    batch, tgt_len, src_len, head_dim = query.size(0), query.size(1), key.size(1), D_MODEL // HEADS
    out = torch.zeros(batch, tgt_len, D_MODEL)
    weights = torch.zeros(batch, HEADS, tgt_len, src_len)
    for b in range(batch):
        for h in range(HEADS):
            qs, vs = slice(h * SCORE_DIM, (h + 1) * SCORE_DIM), slice(h * head_dim, (h + 1) * head_dim)
            for i in range(tgt_len):
                scores = []
                for j in range(src_len):
                    hidden = torch.tanh(q[b, i, qs] + k[b, j, qs])
                    allowed = not pad[b, j] and (not causal or j <= i)
                    scores.append(float(attn.v_a[h] @ hidden) if allowed else -math.inf)
                w = torch.softmax(torch.tensor(scores), dim=0)
                weights[b, h, i] = w
                out[b, i, vs] = sum(w[j] * v[b, j, vs] for j in range(src_len))
    return attn.out_proj(out), weights


@torch.no_grad()
def test_weights_are_distributions_with_masked_positions_exactly_zero():
    attn = make()
    x, _, pad = inputs(tgt=4, src=4)
    _, weights = attn(x, x, x, key_padding_mask=pad, causal=True, need_weights=True)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, HEADS, 4))
    assert (weights[1, :, :, -2:] == 0).all()  # padding
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    assert (weights[:, :, future] == 0).all()  # causal
    assert (weights[0, :, ~future] > 0).all()  # everything else is looked at


@pytest.mark.parametrize("causal", [False, True])
@torch.no_grad()
def test_matches_slow_reference(causal: bool):
    attn = make()
    query, memory, pad = inputs(tgt=4, src=4)
    out, weights = attn(query, memory, memory, key_padding_mask=pad, causal=causal, need_weights=True)
    ref_out, ref_weights = reference(attn, query, memory, memory, pad, causal)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(out, ref_out)


def test_chunking_changes_neither_output_nor_gradients():
    query, memory, pad = inputs(tgt=7, src=5)
    results = []
    for chunk in (1, 3, 100):
        attn = make(cross=True, chunk=chunk)
        q = query.clone().requires_grad_()
        out, _ = attn(q, memory, memory, key_padding_mask=pad)
        out.square().sum().backward()
        results.append((out.detach(), q.grad, attn.v_a.grad, attn.k_proj.weight.grad))
    for other in results[:2]:
        for a, b in zip(other, results[2]):
            torch.testing.assert_close(a, b)


@torch.no_grad()
def test_additive_differs_from_dot_product_with_the_same_projections():
    additive = make()
    torch.manual_seed(0)
    dot = DotProductAttention(D_MODEL, HEADS, 0.0, False, score_dim=SCORE_DIM).eval()
    dot.load_state_dict({k: v for k, v in additive.state_dict().items() if k != "v_a"})
    query, memory, pad = inputs()
    out_add, w_add = additive(query, memory, memory, key_padding_mask=pad, need_weights=True)
    out_dot, w_dot = dot(query, memory, memory, key_padding_mask=pad, need_weights=True)
    assert (w_add - w_dot).abs().max() > 1e-2
    assert (out_add - out_dot).abs().max() > 1e-3


@torch.no_grad()
def test_cached_incremental_self_attention_equals_full_causal():
    attn = make(chunk=2)
    x, _, _ = inputs(tgt=5, src=5)
    full, _ = attn(x, x, x, causal=True)
    cache: dict = {}
    steps = [
        attn(x[:, i : i + 1], x[:, i : i + 1], x[:, i : i + 1], causal=True, cache=cache)[0] for i in range(5)
    ]
    assert cache["k"].shape[2] == 5
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@torch.no_grad()
def test_cross_attention_cache_keeps_projected_keys():
    attn = make(cross=True)
    query, memory, pad = inputs(tgt=3, src=4)
    full, _ = attn(query, memory, memory, key_padding_mask=pad)
    cache: dict = {}
    steps = [
        attn(query[:, i : i + 1], memory, memory, key_padding_mask=pad, cache=cache)[0] for i in range(3)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    torch.testing.assert_close(cache["k"], attn._split(attn.k_proj(memory)))


def test_registry_and_bad_chunk():
    assert isinstance(build_attention("additive", D_MODEL, HEADS, 0.0, True, score_dim=3), AdditiveAttention)
    with pytest.raises(NMTError, match="additive_chunk"):
        AdditiveAttention(D_MODEL, HEADS, 0.0, True, chunk=0)


# ---------------------------------------------------------------------------------- in a Transformer
def additive_transformer() -> Transformer:
    return tiny_transformer(
        20,
        seed=0,
        encoder_layers=2,
        decoder_layers=2,
        self_attention="additive",
        cross_attention="additive",
        additive_dim=6,
        additive_chunk=2,
    )


SRC = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
TGT_IN = torch.tensor([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]])


def test_transformer_trains_with_additive_attention():
    model = additive_transformer().train()
    keep = TGT_IN.ne(0)
    logits = model(SRC, TGT_IN, keep)
    assert logits.shape == (int(keep.sum()), 20)
    logits.logsumexp(-1).sum().backward()
    grads = [model.decoder[0].cross_attn.v_a.grad, model.encoder[0].attn.v_a.grad]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("cache", [True, False])
@torch.no_grad()
def test_transformer_incremental_decoding_equals_teacher_forcing(cache: bool):
    model = additive_transformer()
    expected = torch.log_softmax(model(SRC, TGT_IN), dim=-1)
    state = model.init_state(model.encode(SRC), cache=cache)
    for i in range(TGT_IN.size(1)):
        log_probs, state = model.step(TGT_IN[:, i], state)
        torch.testing.assert_close(log_probs[0], expected[0, i], atol=1e-5, rtol=1e-4)
        if TGT_IN[1, i] != 0:  # row 2's later inputs are padding
            torch.testing.assert_close(log_probs[1], expected[1, i], atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_transformer_search_with_additive_attention():
    model = additive_transformer()
    cfg = DecodingConfig(beam_size=1, max_len_a=0.0, max_len_b=6)
    greedy = greedy_search(model, SRC, cfg, limit=30)
    uncached = greedy_search(
        model, SRC, DecodingConfig(beam_size=1, max_len_a=0.0, max_len_b=6, cache=False), 30
    )
    beam1 = beam_search(model, SRC, cfg, limit=30)
    assert [h.tokens for h in greedy] == [h.tokens for h in uncached] == [b[0].tokens for b in beam1]
    beam4 = beam_search(model, SRC, DecodingConfig(beam_size=4, nbest=4, max_len_a=0.0, max_len_b=6), 30)
    assert all(len(hyps) == 4 for hyps in beam4)
