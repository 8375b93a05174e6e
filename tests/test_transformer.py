"""Transformer: causal decoder, padding-invariant outputs, the norm/position variants, tied embeddings."""

from dataclasses import replace

import pytest
import torch

from nmt.config import TransformerConfig
from nmt.errors import NMTError
from nmt.models import Transformer, build_model, count_parameters
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID

VOCAB = 50
TINY = TransformerConfig(
    d_model=32, ff_dim=64, heads=4, encoder_layers=2, decoder_layers=2, dropout=0.1, max_positions=64
)
VARIANTS = {
    "pre-norm, sinusoidal": TINY,
    "post-norm": replace(TINY, norm_first=False),
    "learned positions": replace(TINY, positional="learned"),
}


def tiny(cfg: TransformerConfig = TINY, seed: int = 0, joint: bool = True) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, VOCAB, VOCAB, joint_vocab=joint).eval()


def random_ids(rows: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB, (rows, length), generator=g)


@pytest.mark.parametrize("cfg", VARIANTS.values(), ids=VARIANTS.keys())
def test_decoder_does_not_look_at_future_target_tokens(cfg):
    model = tiny(cfg)
    src, tgt = random_ids(2, 7, seed=1), random_ids(2, 9, seed=2)
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        reference = model(src, tgt)
        for t in range(tgt.size(1) - 1):
            changed = tgt.clone()
            changed[:, t + 1 :] = random_ids(2, tgt.size(1) - t - 1, seed=10 + t)
            out = model(src, changed)
            torch.testing.assert_close(out[:, : t + 1], reference[:, : t + 1], rtol=0, atol=1e-5)
            assert not torch.allclose(out[:, t + 1 :], reference[:, t + 1 :], atol=1e-3)  # later ones do


@pytest.mark.parametrize("cfg", VARIANTS.values(), ids=VARIANTS.keys())
def test_padding_does_not_change_the_outputs_of_real_tokens(cfg):
    model = tiny(cfg)
    lengths = [(5, 6), (8, 3), (2, 7)]  # (source, target) lengths, EOS/BOS included
    sources = [
        torch.cat([random_ids(1, s - 1, seed=i)[0], torch.tensor([EOS_ID])])
        for i, (s, _) in enumerate(lengths)
    ]
    targets = [
        torch.cat([torch.tensor([BOS_ID]), random_ids(1, t - 1, seed=20 + i)[0]])
        for i, (_, t) in enumerate(lengths)
    ]
    with torch.no_grad():
        alone = [model(s[None], t[None])[0] for s, t in zip(sources, targets)]
        for extra in (0, 4):  # padded to the longest, then with extra pad columns on both sides
            src = torch.full((3, 8 + extra), PAD_ID)
            tgt = torch.full((3, 7 + extra), PAD_ID)
            for i, (s, t) in enumerate(zip(sources, targets)):
                src[i, : len(s)], tgt[i, : len(t)] = s, t
            out = model(src, tgt)
            for i, t in enumerate(targets):
                torch.testing.assert_close(out[i, : len(t)], alone[i], rtol=0, atol=1e-5)


def test_keep_selects_the_same_logits_as_the_full_output():
    model = tiny()
    src, tgt = random_ids(2, 5, seed=3), random_ids(2, 6, seed=4)
    keep = torch.rand(2, 6, generator=torch.Generator().manual_seed(0)) > 0.5
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt, keep), model(src, tgt)[keep])


def test_post_norm_and_learned_positions_are_what_they_say():
    post = tiny(VARIANTS["post-norm"])
    assert isinstance(post.enc_norm, torch.nn.Identity) and isinstance(post.dec_norm, torch.nn.Identity)
    assert not post.encoder[0].res_attn.pre
    assert isinstance(tiny().enc_norm, torch.nn.LayerNorm) and tiny().encoder[0].res_attn.pre

    learned = tiny(VARIANTS["learned positions"])
    assert learned.src_embed.positions.weight.shape == (TINY.max_positions, TINY.d_model)
    src, tgt = random_ids(1, 4, seed=5), random_ids(1, 4, seed=6)
    with torch.no_grad():
        before = learned(src, tgt)
        table = learned.tgt_embed.positions.weight
        table.copy_(table.flip(0))  # the learned table is what gives positions
        assert not torch.allclose(learned(src, tgt), before, atol=1e-3)
    with pytest.raises(NMTError, match="positional"):
        tiny(replace(TINY, positional="rotary"))


def test_shared_embeddings_are_one_tensor_with_a_joint_vocabulary():
    model = tiny()
    weight = model.src_embed.tokens.weight
    assert model.tgt_embed.tokens.weight is weight and model.output.weight is weight
    assert model.state_dict()["output.weight"].data_ptr() == weight.data_ptr()
    names = [name for name, _ in model.named_parameters()]
    assert sum("tokens.weight" in n or n == "output.weight" for n in names) == 1  # listed once
    with torch.no_grad():
        weight[7].add_(1.0)
    assert torch.equal(model.output.weight[7], weight[7])


def test_separate_embeddings_without_sharing_or_without_a_joint_vocabulary():
    unshared = tiny(replace(TINY, share_embeddings=False))
    tensors = {unshared.src_embed.tokens.weight, unshared.tgt_embed.tokens.weight, unshared.output.weight}
    assert len({t.data_ptr() for t in tensors}) == 3

    separate_vocab = Transformer(replace(TINY), 40, 60, joint_vocab=False)
    assert separate_vocab.src_embed.tokens.weight.shape == (40, TINY.d_model)
    assert separate_vocab.src_embed.tokens.weight is not separate_vocab.tgt_embed.tokens.weight
    assert separate_vocab.output.weight is separate_vocab.tgt_embed.tokens.weight  # target side still tied
    out = separate_vocab(torch.randint(4, 40, (2, 5)), torch.randint(4, 60, (2, 3)))
    assert out.shape == (2, 3, 60)


def test_pad_embedding_starts_at_zero():
    model = tiny(replace(TINY, share_embeddings=False))
    assert not model.src_embed.tokens.weight[PAD_ID].any() and not model.tgt_embed.tokens.weight[PAD_ID].any()


def expected_parameters(vocab: int, d: int, ff: int, enc: int, dec: int) -> int:
    attention = 4 * (d * d + d)  # q, k, v, out projections with biases
    feed_forward = d * ff + ff + ff * d + d
    norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    embeddings = vocab * d  # source, target and output share one matrix
    return embeddings + enc * encoder_layer + dec * decoder_layer + 2 * norm  # + final pre-norm norms


def test_parameter_count_of_transformer_small(compose_train_cfg):
    cfg = compose_train_cfg("model=transformer_small")
    m = cfg.model
    model = build_model(m, 8000, 8000, joint_vocab=True)
    expected = expected_parameters(8000, m.d_model, m.ff_dim, m.encoder_layers, m.decoder_layers)
    assert (m.d_model, m.ff_dim, m.encoder_layers, m.decoder_layers) == (256, 1024, 3, 3)
    assert count_parameters(model) == expected == 7_578_624


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_drops_a_share_p_and_keeps_the_expectation(dtype):
    from nmt.models.transformer import Dropout

    torch.manual_seed(0)
    x = torch.ones(200, 500, dtype=dtype)
    drop = Dropout(0.3)
    y = drop.train()(x)
    assert y.dtype == dtype
    assert abs(float((y == 0).float().mean()) - 0.3) < 0.01
    kept = y[y != 0].float()
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.7), rtol=1e-4 if dtype == torch.float32 else 4e-3)
    assert abs(float(y.float().mean()) - 1.0) < 0.02
    assert torch.equal(drop.eval()(x), x) and torch.equal(Dropout(0.0).train()(x), x)
    assert not Dropout(1.0).train()(x).any()
    x.requires_grad_()
    y = drop.train()(x)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # the gradient goes through the same mask and scale


def test_attention_dropout_drops_weights_and_keeps_the_expectation():
    """In training the attention weights are dropped (outputs vary) without bias: the mean over many
    draws is the output without dropout."""
    from nmt.models.attention import DotProductAttention

    torch.manual_seed(0)
    attn = DotProductAttention(16, 4, dropout=0.5, cross=False)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = attn.eval()(x, x, x, causal=True)[0]
        draws = torch.stack([attn.train()(x, x, x, causal=True)[0] for _ in range(4000)])
    assert not torch.allclose(draws[0], expected, atol=1e-3)
    assert torch.allclose(draws.mean(0), expected, atol=0.05)
