"""The attention module (``nmt.models.attention``): one interface, several kinds.

Additive (Bahdanau) scores against a slow reference, masks, chunking and the KV cache; rotary positions
(``model.positional=rope``: relative scores, offsets that follow the cache); grouped-query and
multi-query attention (``model.kv_heads``: multi-head attention with shared key/value heads, with and
without SDPA's head sharing); fused training projections; the kernels against the formulas (outputs and
gradients, every kind, with RoPE, GQA and a cache). Then each kind inside a Transformer: training,
incremental decoding equal to teacher forcing, the size of the cache, search, config checks and the
presets that select them.
"""

import copy
import math
from dataclasses import replace

import pytest
import torch
from helpers import copy_sentences, tiny_transformer, train_to_copy

from nmt.config import DecodingConfig, TransformerConfig, check_model, to_container, to_train_config
from nmt.decoding import beam_search, greedy_search, pad_batch
from nmt.errors import NMTError
from nmt.models import Transformer, kernels, kv_cache_bytes
from nmt.models.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    build_attention,
    gather_append,
    rotary,
)
from nmt.models.base import LazyRows, reorder_state
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------- additive attention
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
    assert cache["k"].size(2) == 5
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_a_reordered_cache_takes_its_rows_when_the_next_step_appends():
    """``reorder`` only records the rows (two reorders compose into one selection); the next step's
    keys are appended to exactly those rows, in the order given, repeats included."""
    g = torch.Generator().manual_seed(0)
    keys, new = torch.randn(4, 2, 3, 5, generator=g), torch.randn(3, 2, 1, 5, generator=g)
    first, then = torch.tensor([3, 3, 0, 1]), torch.tensor([2, 0, 1])
    cached = reorder_state({"k": LazyRows(keys)}, first)
    cached = reorder_state(cached, then)["k"]
    assert cached.tensor is keys and cached.size(0) == 3 and cached.size(2) == 3  # nothing copied yet
    expected = torch.cat([keys[first][then], new], dim=2)
    assert torch.equal(gather_append(cached, new), expected)
    assert torch.equal(gather_append(LazyRows(keys[first][then]), new), expected)  # nothing to select


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
    with pytest.raises(NMTError, match=r"^model\.additive_chunk=0: must be > 0"):
        check_model(TransformerConfig(self_attention="additive", additive_chunk=0))


# --------------------------------------------------------------------------------- rotary positions
def test_rotary_scores_depend_only_on_relative_positions():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 6, 16, generator=g), torch.randn(2, 3, 6, 16, generator=g)
    positions = torch.tensor([0, 1, 2, 5, 9, 10])

    def scores(shift: int) -> torch.Tensor:
        return rotary(q, positions + shift, 10000.0) @ rotary(k, positions + shift, 10000.0).transpose(-1, -2)

    for shift in (1, 7, 300):
        torch.testing.assert_close(scores(shift), scores(0), rtol=0, atol=1e-4)
    torch.testing.assert_close(rotary(q, positions, 10.0).norm(dim=-1), q.norm(dim=-1))  # a rotation
    moved = rotary(q, positions, 10000.0) @ rotary(k, positions + 3, 10000.0).transpose(-1, -2)
    assert not torch.allclose(moved, scores(0), atol=1e-2)  # other offsets, other scores


@torch.no_grad()
def test_rope_self_attention_rotates_by_the_positions_after_the_cache():
    """Queries and keys after ``shift`` cached (and masked) positions: the same outputs as at position 0."""
    torch.manual_seed(0)
    attn = DotProductAttention(16, 4, dropout=0.0, cross=False, kv_heads=2, rope_base=10000.0).eval()
    x = torch.randn(2, 5, 16)
    alone, _ = attn(x, x, x, causal=True)
    for shift in (1, 4):
        cache = {"k": LazyRows(torch.randn(2, 2, shift, 4)), "v": LazyRows(torch.randn(2, 2, shift, 4))}
        hidden = torch.cat([torch.ones(2, shift, dtype=torch.bool), torch.zeros(2, 5, dtype=torch.bool)], 1)
        shifted, _ = attn(x, x, x, causal=True, cache=cache, key_padding_mask=hidden)
        torch.testing.assert_close(shifted, alone, rtol=0, atol=1e-5)
        assert cache["k"].take().shape == (2, 2, shift + 5, 4)


def test_rope_angles_are_tabled_once_and_positions_past_the_table_still_rotate():
    attn = DotProductAttention(16, 4, dropout=0.0, cross=False, rope_base=10000.0, rope_positions=8)
    assert attn.rope_cos.shape == (8, 2) and "rope_cos" not in attn.state_dict()  # not in checkpoints
    x = torch.randn(2, 4, 3, 4, generator=torch.Generator().manual_seed(0))
    for offset in (0, 5, 6, 20):  # inside the table, ending at its end, crossing it, past it
        expected = rotary(x, torch.arange(offset, offset + 3), 10000.0)
        torch.testing.assert_close(attn.rotate(x, offset), expected, rtol=0, atol=1e-6)


# ---------------------------------------------------------- grouped-query and multi-query attention
@pytest.mark.parametrize("kind", [DotProductAttention, AdditiveAttention])
@pytest.mark.parametrize("need_weights", [False, True])  # fused SDPA or the explicit softmax
@torch.no_grad()
def test_grouped_heads_are_multi_head_attention_with_shared_key_value_heads(kind, need_weights):
    torch.manual_seed(0)
    gqa = kind(16, 4, dropout=0.0, cross=True, kv_heads=2).eval()
    mha = kind(16, 4, dropout=0.0, cross=True).eval()
    state = gqa.state_dict()
    for name in ("k_proj", "v_proj"):  # each of the 2 key/value heads copied for its 2 query heads
        weight, bias = state.pop(f"{name}.weight"), state.pop(f"{name}.bias")
        state[f"{name}.weight"] = weight.view(2, -1, 16).repeat_interleave(2, dim=0).reshape(-1, 16)
        state[f"{name}.bias"] = bias.view(2, -1).repeat_interleave(2, dim=0).reshape(-1)
    mha.load_state_dict(state)
    query, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    out, weights = gqa(query, memory, memory, key_padding_mask=pad, need_weights=need_weights)
    ref, ref_weights = mha(query, memory, memory, key_padding_mask=pad, need_weights=need_weights)
    torch.testing.assert_close(out, ref)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights)


@pytest.mark.parametrize("padded", [False, True])
@torch.no_grad()
def test_attention_without_sdpa_head_sharing_is_the_same(monkeypatch, padded):
    """torch < 2.5 has no enable_gqa (and CUDA would run it with a mask slowly): the heads are then
    repeated at attention time, with the same result."""
    torch.manual_seed(0)
    attn = DotProductAttention(16, 4, dropout=0.0, cross=False, kv_heads=1).eval()
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = padded
    with_gqa, _ = attn(x, x, x, causal=True, key_padding_mask=pad if padded else None)
    monkeypatch.setattr(kernels, "SDPA_GQA", False)
    repeated, _ = attn(x, x, x, causal=True, key_padding_mask=pad if padded else None)
    torch.testing.assert_close(repeated, with_gqa)


# -------------------------------------------------------------------------------- fused projections
@pytest.mark.parametrize("kv_heads", [0, 2])
def test_fused_training_projections_equal_the_separate_inference_ones(kv_heads):
    torch.manual_seed(0)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    for cross, (key, value) in ((False, (x, x)), (True, (memory, memory))):
        attn = DotProductAttention(16, 4, dropout=0.0, cross=cross, kv_heads=kv_heads).eval()
        fused = attn(x, key, value)[0]  # autograd on: one product for what shares an input
        with torch.no_grad():
            separate = attn(x, key, value)[0]
        torch.testing.assert_close(fused, separate)


# ------------------------------------------------------------------- the kernels against the formulas
KINDS = {"dot_product": DotProductAttention, "additive": AdditiveAttention}
SETTINGS = {  # the self-attention's; the cross-attention is never rotated
    "multi-head": {},
    "grouped-query": {"kv_heads": 2},
    "rope": {"rope_base": 10000.0, "rope_positions": 6},  # later positions: rotated without the table
    "rope, multi-query": {"rope_base": 10000.0, "rope_positions": 6, "kv_heads": 1},
}


def fast_and_textbook(kind: str, cross: bool, setting: str) -> tuple[Attention, Attention]:
    """One module twice: with the kernels, and every step as its formula (``fast = False``)."""
    torch.manual_seed(0)
    options = {key: value for key, value in SETTINGS[setting].items() if not cross or key == "kv_heads"}
    fast = KINDS[kind](16, 4, dropout=0.0, cross=cross, **options).train()
    textbook = copy.deepcopy(fast)
    textbook.fast = False
    return fast, textbook


def outputs_and_gradients(attn: Attention, inputs: list[torch.Tensor], call) -> list[torch.Tensor]:
    """``call``'s output, then the gradients of its squares' sum for the inputs and every parameter."""
    inputs = [x.clone().requires_grad_() for x in inputs]
    out = call(attn, *inputs)
    out.square().sum().backward()
    return [out.detach(), *(x.grad for x in inputs), *(p.grad for p in attn.parameters())]


def padding(rows: int, length: int, padded: dict[int, int]) -> torch.Tensor:
    mask = torch.zeros(rows, length, dtype=torch.bool)
    for row, start in padded.items():
        mask[row, start:] = True
    return mask


SELF_PAD, CROSS_PAD = padding(3, 9, {1: 6, 2: 4}), padding(3, 7, {0: 5, 2: 2})
TRAINING_CALLS = {  # the projections and the attention of a training step: fused, through SDPA
    "self, causal": (False, lambda a, x, m: a(x, x, x, causal=True)[0]),
    "self, causal, padded": (False, lambda a, x, m: a(x, x, x, causal=True, key_padding_mask=SELF_PAD)[0]),
    "self, padded": (False, lambda a, x, m: a(x, x, x, key_padding_mask=SELF_PAD)[0]),
    "cross": (True, lambda a, x, m: a(x, m, m)[0]),
    "cross, padded": (True, lambda a, x, m: a(x, m, m, key_padding_mask=CROSS_PAD)[0]),
}


@pytest.mark.parametrize("call", TRAINING_CALLS)
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_kernels_give_the_outputs_and_gradients_of_the_formulas(kind, setting, call):
    cross, run = TRAINING_CALLS[call]
    fast, textbook = fast_and_textbook(kind, cross, setting)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(3, 9, 16, generator=g), torch.randn(3, 7, 16, generator=g)]
    expected = outputs_and_gradients(textbook, inputs, run)
    for got, want in zip(outputs_and_gradients(fast, inputs, run), expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_kernels_give_the_outputs_and_gradients_of_the_formulas_after_a_cache(kind, setting):
    """Queries after cached keys the search reordered (rows taken, repeated): the causal mask of later
    positions, the cache's gather and append; with autograd on, and in decoding (one copy)."""
    fast, textbook = fast_and_textbook(kind, False, setting)
    g = torch.Generator().manual_seed(2)
    kv_heads, dims = fast.kv_heads, (fast.score_dim, fast.head_dim)
    past = [torch.randn(4, kv_heads, 3, dim, generator=g) for dim in dims]
    rows = torch.tensor([2, 2, 0])

    def call(attn, x, past_k, past_v):
        cache = reorder_state({"k": LazyRows(past_k), "v": LazyRows(past_v)}, rows)
        return attn(x, x, x, causal=True, cache=cache, key_padding_mask=padding(3, 5, {1: 1}))[0]

    inputs = [torch.randn(3, 2, 16, generator=g), *past]
    expected = outputs_and_gradients(textbook, inputs, call)
    for got, want in zip(outputs_and_gradients(fast, inputs, call), expected, strict=True):
        torch.testing.assert_close(got, want)
    with torch.no_grad():
        torch.testing.assert_close(call(fast.eval(), *inputs), call(textbook.eval(), *inputs))


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_kernels_decode_as_the_formulas_do(kind, setting):
    """Incremental decoding of a sentence's 3 beams: self-attention over a cache that the search
    reorders between steps, cross-attention of the beams over their sentence's keys and values (kept
    once per sentence) with and without the weights."""
    (fast_self, textbook_self), (fast_cross, textbook_cross) = (
        fast_and_textbook(kind, cross, setting) for cross in (False, True)
    )
    g = torch.Generator().manual_seed(3)
    memory, pad = torch.randn(2, 7, 16, generator=g), padding(2, 7, {1: 4})
    caches = {"fast": ({}, {}), "textbook": ({}, {})}
    for step in range(8):  # past the rotary table's 6 positions
        x = torch.randn(6, 1, 16, generator=g)
        results = {}
        for name, self_attn, cross_attn in (
            ("fast", fast_self.eval(), fast_cross.eval()),
            ("textbook", textbook_self.eval(), textbook_cross.eval()),
        ):
            own, shared = caches[name]
            h = self_attn(x, x, x, causal=True, cache=own)[0]
            out, weights = cross_attn(
                h, memory, memory, key_padding_mask=pad, cache=shared, need_weights=step == 1
            )
            results[name] = (h, out) if weights is None else (h, out, weights)
            caches[name] = (reorder_state(own, torch.tensor([1, 1, 0, 5, 3, 3])), shared)
        for got, want in zip(results["fast"], results["textbook"], strict=True):
            torch.testing.assert_close(got, want)
    for role in (0, 1):
        for key in ("k", "v"):
            got, want = caches["fast"][role][key], caches["textbook"][role][key]
            if role == 0:
                got, want = got.take(), want.take()
            torch.testing.assert_close(got, want)


# -------------------------------------------------------------- additive attention in a Transformer
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


# ---------------------------------------------------------------- RoPE and GQA/MQA in a Transformer
VOCAB = 24
TINY = TransformerConfig(
    d_model=32, ff_dim=64, heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64
)
VARIANTS = {
    "rope": replace(TINY, positional="rope"),
    "gqa": replace(TINY, kv_heads=2),
    "mqa": replace(TINY, kv_heads=1),
    "rope+mqa": replace(TINY, positional="rope", kv_heads=1),
    "gqa, additive cross": replace(TINY, kv_heads=2, cross_attention="additive", additive_dim=6),
}


def tiny(cfg: TransformerConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, VOCAB, VOCAB, joint_vocab=True).eval()


def random_ids(rows: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB, (rows, length), generator=g)


def padded_sources() -> torch.Tensor:
    src = random_ids(3, 7, seed=1)
    src[:, -1] = EOS_ID
    src[1, 4], src[1, 5:] = EOS_ID, PAD_ID
    return src


def test_rope_adds_no_positions_to_the_embeddings_but_the_model_sees_word_order():
    rope, sinusoidal = tiny(VARIANTS["rope"]), tiny(TINY)
    ids = random_ids(2, 5, seed=3)
    torch.testing.assert_close(rope.src_embed(ids), rope.src_embed.tokens(ids) * TINY.d_model**0.5)
    assert rope.state_dict().keys() == sinusoidal.state_dict().keys()  # rope has no parameters
    src, tgt = random_ids(1, 6, seed=4), random_ids(1, 4, seed=5)
    with torch.no_grad():
        swapped = src[:, [1, 0, 2, 3, 4, 5]]
        assert not torch.allclose(rope(src, tgt), rope(swapped, tgt), atol=1e-4)


def test_rope_needs_dot_product_self_attention():
    with pytest.raises(NMTError, match=r"model\.positional=rope.*model\.self_attention=dot_product"):
        tiny(replace(VARIANTS["rope"], self_attention="additive"))
    tiny(replace(VARIANTS["rope"], cross_attention="additive"))  # cross-attention is never rotated
    with pytest.raises(NMTError, match="model.rope_base"):
        tiny(replace(VARIANTS["rope"], rope_base=0.0))
    with pytest.raises(NMTError, match="model.positional"):
        tiny(replace(TINY, positional="rotary"))


def test_kv_heads_equal_to_heads_is_todays_multi_head_attention():
    """A config without the key (an old checkpoint's), kv_heads=0 and kv_heads=heads: one model."""
    old = to_container(to_train_config({"data": {"source": "toy"}, "model": {"arch": "transformer"}}))
    del old["model"]["kv_heads"], old["model"]["rope_base"]
    assert to_train_config(old).model.kv_heads == 0
    default, explicit = tiny(TINY), tiny(replace(TINY, kv_heads=TINY.heads))
    shapes = {name: t.shape for name, t in default.state_dict().items()}
    assert shapes == {name: t.shape for name, t in explicit.state_dict().items()}
    assert shapes["decoder.0.self_attn.k_proj.weight"] == (TINY.d_model, TINY.d_model)
    explicit.load_state_dict(tiny(TINY, seed=7).state_dict())
    default.load_state_dict(tiny(TINY, seed=7).state_dict())
    src, tgt = padded_sources(), random_ids(3, 5, seed=2)
    with torch.no_grad():
        assert torch.equal(default(src, tgt), explicit(src, tgt))


def test_heads_must_be_a_multiple_of_kv_heads():
    for kv_heads in (3, 5):
        with pytest.raises(NMTError, match=r"model\.heads=4 .*model\.kv_heads"):
            tiny(replace(TINY, kv_heads=kv_heads))
    with pytest.raises(NMTError, match=r"^model\.kv_heads=-1: must be >= 0"):
        tiny(replace(TINY, kv_heads=-1))


@pytest.mark.parametrize("cfg", VARIANTS.values(), ids=VARIANTS.keys())
@torch.no_grad()
def test_the_cache_holds_kv_heads_and_is_as_large_as_kv_cache_bytes_says(cfg):
    model = tiny(cfg)
    src = padded_sources()
    state = model.init_state(model.encode(src))
    steps = 4
    for t in range(steps):
        _, state = model.step(torch.full((3,), BOS_ID if t == 0 else 5), state)
    kv_heads = cfg.kv_heads or cfg.heads
    # per layer: the hypotheses' self-attention cache and the sentences' cross-attention cache
    pairs = zip(state["self"], state["sentence"]["cross"])
    caches = [{"self": {name: t.take() for name, t in own.items()}, "cross": shared} for own, shared in pairs]
    for layer in caches:
        for role, length in (("self", steps), ("cross", src.size(1))):
            assert layer[role]["k"].shape[:3] == (3, kv_heads, length)
            assert layer[role]["v"].shape == (3, kv_heads, length, cfg.d_model // cfg.heads)
    stored = sum(t.nbytes for layer in caches for c in layer.values() for t in c.values())
    assert stored == 3 * kv_cache_bytes(cfg, steps, src.size(1), dtype_bytes=4)


def test_kv_cache_bytes_shrinks_with_kv_heads():
    full = kv_cache_bytes(TINY, 10, 12, 2)
    assert full == 2 * TINY.decoder_layers * (10 + 12) * TINY.d_model * 2
    assert kv_cache_bytes(replace(TINY, kv_heads=2), 10, 12, 2) == full // 2
    assert kv_cache_bytes(replace(TINY, kv_heads=1), 10, 12, 2) == full // 4


# -------------------------------------------------------------------------- decoding with the cache
@pytest.mark.parametrize("cfg", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("cache", [True, False])
@torch.no_grad()
def test_step_by_step_log_probs_equal_teacher_forcing(cfg, cache):
    model = tiny(cfg)
    src = padded_sources()
    tgt_in = random_ids(3, 6, seed=2)
    tgt_in[:, 0] = BOS_ID
    forced = torch.log_softmax(model(src, tgt_in).float(), dim=-1)
    state = model.init_state(model.encode(src), cache=cache)
    for t in range(tgt_in.size(1)):
        log_probs, state = model.step(tgt_in[:, t], state)
        torch.testing.assert_close(log_probs, forced[:, t], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def copier() -> Transformer:
    """RoPE and multi-query attention, trained to copy for 60 steps: outputs of varied length and content."""
    torch.manual_seed(0)
    return train_to_copy(Transformer(VARIANTS["rope+mqa"], VOCAB, VOCAB, joint_vocab=True), VOCAB, steps=60)


def test_search_with_rope_and_mqa(copier):
    src = pad_batch(copy_sentences(24, VOCAB, seed=1000), "cpu")
    limit = TINY.max_positions - 1
    greedy = greedy_search(copier, src, DecodingConfig(beam_size=1, alpha=0.0), limit)
    beam1 = beam_search(copier, src, DecodingConfig(beam_size=1, alpha=0.0), limit)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam1]
    for beam_size in (1, 4):
        decoding = DecodingConfig(beam_size=beam_size, alpha=0.0)
        cached = beam_search(copier, src, decoding, limit)
        uncached = beam_search(copier, src, replace(decoding, cache=False), limit)
        assert [b[0].tokens for b in cached] == [b[0].tokens for b in uncached]
    assert len({len(h.tokens) for h in greedy}) > 3  # outputs vary: the comparisons above compare something


def textbook_copy(model: Transformer) -> Transformer:
    """The model with every attention step as its formula (``Attention.fast = False``)."""
    textbook = copy.deepcopy(model)
    for module in textbook.modules():
        if isinstance(module, Attention):
            module.fast = False
    return textbook


@pytest.mark.parametrize("name", ["rope+mqa, trained", "additive"])
def test_a_model_with_the_kernels_trains_and_searches_as_the_formulas_do(copier, name):
    """Training (loss, gradients) and beam search, the kernels against the formulas."""
    if name == "additive":
        model, src = additive_transformer(), SRC
    else:
        model, src = copy.deepcopy(copier), pad_batch(copy_sentences(12, VOCAB, seed=2000), "cpu")
    textbook = textbook_copy(model)
    tgt_in = torch.cat([torch.full((src.size(0), 1), BOS_ID), src[:, :-1]], dim=1)
    results = []
    for searched in (model, textbook):
        loss = torch.log_softmax(searched.train()(src, tgt_in), dim=-1).logsumexp(-1).mean()
        loss.backward()
        results.append([loss.detach(), *(p.grad for p in searched.parameters())])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)
    decoding = DecodingConfig(beam_size=4, nbest=2, alpha=0.6)
    with torch.no_grad():
        hyps, expected = (beam_search(m.eval(), src, decoding, 30) for m in (model, textbook))
    assert [[h.tokens for h in nbest] for nbest in hyps] == [[h.tokens for h in nbest] for nbest in expected]
    scores = [torch.tensor([[h.score for h in nbest] for nbest in found]) for found in (hyps, expected)]
    torch.testing.assert_close(*scores)  # fp32 scores: equal up to fp32 rounding


# ------------------------------------------------------------------------------------------ presets
PRESETS = {
    "multi30k_rope_cpu": {"positional": "rope"},
    "multi30k_gqa_cpu": {"kv_heads": 2},
    "multi30k_mqa_cpu": {"kv_heads": 1},
    "multi30k_rope_gqa_cpu": {"positional": "rope", "kv_heads": 2},
}


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_change_only_their_model_keys(compose_train_cfg, preset):
    base = to_container(compose_train_cfg("experiment=multi30k_small_cpu"))
    cfg = compose_train_cfg(f"experiment={preset}")
    variant = to_container(cfg)
    assert variant["model"] == {**base["model"], **PRESETS[preset]}
    del variant["model"], base["model"]
    assert variant == base
    Transformer(cfg.model, 100, 100, joint_vocab=True)  # builds: heads are a multiple of kv_heads
