"""RNNsearch: padding-invariant encoder, step-by-step decoding equal to teacher forcing, alignments."""

import pytest
import torch

from nmt.config import DecodingConfig, RNNSearchConfig
from nmt.decoding import beam_search, greedy_search
from nmt.models import build_model
from nmt.models.rnnsearch import RNNSearch

VOCAB = 24
SRC = torch.tensor([[5, 6, 7, 8, 9, 3], [10, 11, 12, 3, 0, 0], [13, 3, 0, 0, 0, 0]])
TGT_IN = torch.tensor([[2, 14, 15, 16, 17], [2, 18, 19, 0, 0], [2, 20, 21, 22, 0]])


def make(maxout: bool = True, seed: int = 0) -> RNNSearch:
    torch.manual_seed(seed)
    cfg = RNNSearchConfig(
        embed_dim=12, hidden_size=16, attention_dim=10, readout_dim=8, maxout=maxout, dropout=0.0
    )
    model = build_model(cfg, VOCAB, VOCAB, joint_vocab=True)
    # Attention starts uniform (v_a = 0, as in the paper); random v_a makes the tests see real alignments.
    torch.nn.init.normal_(model.attention.v_a, std=1.0)
    return model.eval()


@torch.no_grad()
def test_padding_does_not_change_the_encoding_of_real_tokens():
    model = make()
    alone = model.encode(SRC[1:2, :4])["annotations"]
    padded = model.encode(SRC)["annotations"]
    more_padding = model.encode(torch.cat([SRC, torch.zeros(3, 4, dtype=torch.long)], dim=1))["annotations"]
    torch.testing.assert_close(padded[1:2, :4], alone)
    torch.testing.assert_close(more_padding[:, :6], padded)
    assert (padded[1, 4:] == 0).all()


@pytest.mark.parametrize("maxout", [True, False])
@torch.no_grad()
def test_step_by_step_decoding_equals_teacher_forcing(maxout: bool):
    model = make(maxout)
    expected = torch.log_softmax(model(SRC, TGT_IN), dim=-1)
    keep = TGT_IN.ne(0)
    torch.testing.assert_close(torch.log_softmax(model(SRC, TGT_IN, keep), dim=-1), expected[keep])
    state = model.init_state(model.encode(SRC))
    for i in range(TGT_IN.size(1)):
        log_probs, state = model.step(TGT_IN[:, i], state)
        assert log_probs.dtype == torch.float32
        torch.testing.assert_close(log_probs[keep[:, i]], expected[keep[:, i], i], atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_cross_attention_is_an_alignment_over_real_source_tokens():
    model = make()
    weights = model.cross_attention(SRC, TGT_IN)
    assert weights.shape == (1, 3, 1, 5, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 3, 1, 5))
    assert (weights[0, 1, :, :, 4:] == 0).all() and (weights[0, 2, :, :, 2:] == 0).all()
    assert weights[0, 0].std() > 1e-3  # not uniform


@torch.no_grad()
def test_beam_of_one_equals_greedy_and_reorder_selects_rows():
    model = make(seed=3)
    cfg = DecodingConfig(beam_size=1, max_len_a=1.0, max_len_b=3)
    greedy = greedy_search(model, SRC, cfg, limit=30)
    beam = beam_search(model, SRC, cfg, limit=30)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    assert any(h.tokens for h in greedy)
    state = model.init_state(model.encode(SRC))
    picked = model.reorder(state, torch.tensor([2, 0]))
    torch.testing.assert_close(picked["s"], state["s"][[2, 0]])
    torch.testing.assert_close(picked["keys"], state["keys"][[2, 0]])


def test_training_step_reaches_every_parameter_and_shares_embeddings():
    torch.manual_seed(0)
    cfg = RNNSearchConfig(
        embed_dim=12, hidden_size=16, attention_dim=10, readout_dim=8, share_embeddings=True
    )
    model = build_model(cfg, VOCAB, VOCAB, joint_vocab=True).train()
    assert model.src_embed is model.tgt_embed
    assert model.vocab_sizes == {"src": VOCAB, "tgt": VOCAB}
    torch.nn.init.normal_(model.attention.v_a)
    keep = TGT_IN.ne(0)
    model(SRC, TGT_IN, keep).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    separate = build_model(cfg, VOCAB, VOCAB + 1, joint_vocab=False)
    assert separate.src_embed is not separate.tgt_embed
