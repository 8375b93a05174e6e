"""Rotary positions (model.positional=rope) and grouped-query / multi-query attention (model.kv_heads):
relative scores, offsets that follow the cache, kv_heads == heads being plain multi-head attention,
shared key/value heads, the size of the cache, and search on models built with them."""

from dataclasses import replace

import pytest
import torch
from copy_task import copy_sentences, train_to_copy

from nmt.config import DecodingConfig, TransformerConfig, to_container, to_train_config
from nmt.decoding import beam_search, greedy_search, pad_batch
from nmt.errors import NMTError
from nmt.models import Transformer, kv_cache_bytes
from nmt.models import attention as attention_module
from nmt.models.attention import AdditiveAttention, DotProductAttention, rotary
from nmt.special import BOS_ID, EOS_ID, PAD_ID

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


pytestmark = pytest.mark.usefixtures("one_thread")


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


# -------------------------------------------------------------------------------------------- RoPE
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
        cache = {"k": torch.randn(2, 2, shift, 4), "v": torch.randn(2, 2, shift, 4)}
        hidden = torch.cat([torch.ones(2, shift, dtype=torch.bool), torch.zeros(2, 5, dtype=torch.bool)], 1)
        shifted, _ = attn(x, x, x, causal=True, cache=cache, key_padding_mask=hidden)
        torch.testing.assert_close(shifted, alone, rtol=0, atol=1e-5)
        assert cache["k"].shape == (2, 2, shift + 5, 4)


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


# ----------------------------------------------------------------------------------------- GQA/MQA
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
    monkeypatch.setattr(attention_module, "SDPA_GQA", False)
    repeated, _ = attn(x, x, x, causal=True, key_padding_mask=pad if padded else None)
    torch.testing.assert_close(repeated, with_gqa)


def test_heads_must_be_a_multiple_of_kv_heads():
    for kv_heads in (3, 5, -1):
        with pytest.raises(NMTError, match=r"model\.heads=4 .*model\.kv_heads"):
            tiny(replace(TINY, kv_heads=kv_heads))


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
    caches = [{"self": own, "cross": shared} for own, shared in pairs]
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
