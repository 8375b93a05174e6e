"""Label-smoothed cross entropy: the same numbers as PyTorch's, plus the plain NLL for perplexity."""

import pytest
import torch
import torch.nn.functional as F

from nmt.training.loss import label_smoothed_nll


@pytest.fixture
def logits_and_target() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(37, 50, generator=g) * 3, torch.randint(0, 50, (37,), generator=g)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_equals_torch_cross_entropy_with_label_smoothing(logits_and_target, eps):
    logits, target = logits_and_target
    loss, nll = label_smoothed_nll(logits, target, eps)
    expected = F.cross_entropy(logits, target, label_smoothing=eps, reduction="sum")
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"), rtol=1e-5, atol=1e-4)


def test_nll_is_the_loss_without_smoothing(logits_and_target):
    logits, target = logits_and_target
    loss, nll = label_smoothed_nll(logits, target, 0.0)
    torch.testing.assert_close(loss, nll)
    smoothed, nll_smoothed = label_smoothed_nll(logits, target, 0.1)
    torch.testing.assert_close(nll_smoothed, nll)  # the NLL does not depend on epsilon
    assert not torch.allclose(smoothed, nll)


def test_a_target_far_below_the_softmax_floor_keeps_its_exact_loss_and_gradient():
    """Targets whose probability underflows fp32's softmax (log-probabilities of -100 to -2000) still get
    log_softmax's loss, finite, and the same gradient."""
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(16, 50, generator=g) * 300).requires_grad_()
    target = logits.detach().argmin(dim=-1)  # each row's least likely token
    assert (torch.log_softmax(logits.detach(), -1).gather(-1, target[:, None]) < -100).all()
    loss, nll = label_smoothed_nll(logits, target, 0.1)
    (loss + nll).backward()
    expected = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    expected_nll = F.cross_entropy(logits, target, reduction="sum")
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(nll, expected_nll, rtol=1e-5, atol=1e-3)
    ours, logits.grad = logits.grad, None
    (expected + expected_nll).backward()
    torch.testing.assert_close(ours, logits.grad)


def test_low_precision_logits_are_scored_in_fp32(logits_and_target):
    logits, target = logits_and_target
    loss, nll = label_smoothed_nll(logits.bfloat16(), target, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    expected = F.cross_entropy(logits.bfloat16().float(), target, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)


def test_gradient_matches_torch(logits_and_target):
    logits, target = logits_and_target
    ours = logits.clone().requires_grad_()
    label_smoothed_nll(ours, target, 0.1)[0].backward()
    theirs = logits.clone().requires_grad_()
    F.cross_entropy(theirs, target, label_smoothing=0.1, reduction="sum").backward()
    torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradient_of_loss_and_nll_together_matches_autograd(logits_and_target, eps):
    """Both outputs in the graph (e.g. a loss that adds the NLL): the written-out gradient still holds."""
    logits, target = logits_and_target
    ours = logits.clone().requires_grad_()
    loss, nll = label_smoothed_nll(ours, target, eps)
    (2.0 * loss + 0.5 * nll).backward()
    theirs = logits.clone().requires_grad_()
    log_probs = torch.log_softmax(theirs, dim=-1)
    plain = -log_probs.gather(-1, target[:, None]).sum()
    smoothed = (1 - eps) * plain - eps * log_probs.mean(dim=-1).sum()
    (2.0 * smoothed + 0.5 * plain).backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
    bf16 = logits.bfloat16().requires_grad_()
    label_smoothed_nll(bf16, target, eps)[0].backward()
    assert bf16.grad.dtype == torch.bfloat16


class TwoPasses(torch.nn.Module):
    """A stand-in model whose output differs between the two copies of a doubled batch (as two dropout
    masks make it differ): logits from a table, plus a shift on the rows of the second half."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)))

    def forward(self, src, tgt_in, target_mask):
        logits = self.table[tgt_in]  # (batch, len, vocab)
        if src.size(0) % 2 == 0:
            half = src.size(0) // 2
            logits = torch.cat([logits[:half], logits[half:] + torch.linspace(0, 2, logits.size(-1))])
        return logits[target_mask]


def test_rdrop_is_the_mean_loss_plus_alpha_times_the_symmetric_kl_of_the_two_passes():
    from nmt.data import Batch
    from nmt.training.loss import batch_loss

    tgt_in = torch.tensor([[2, 5, 6, 7], [2, 8, 9, 0]])
    tgt_out = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    batch = Batch(torch.tensor([[4, 3], [5, 3]]), tgt_in, tgt_out, 4, 7)
    model, mask = TwoPasses(), tgt_out.ne(0)
    loss, nll = batch_loss(model, batch, 0.1, rdrop_alpha=0.7)

    logits = model(torch.cat([batch.src] * 2), torch.cat([tgt_in] * 2), torch.cat([mask] * 2))
    first, second = logits.chunk(2)
    target = tgt_out[mask]
    smoothed = [
        F.cross_entropy(part, target, label_smoothing=0.1, reduction="sum") for part in (first, second)
    ]
    p, q = F.log_softmax(first, -1), F.log_softmax(second, -1)
    kl = F.kl_div(q, p, log_target=True, reduction="sum") + F.kl_div(p, q, log_target=True, reduction="sum")
    assert torch.allclose(loss, (smoothed[0] + smoothed[1]) / 2 + 0.7 * kl / 2, atol=1e-5)
    plain = [F.cross_entropy(part, target, reduction="sum") for part in (first, second)]
    assert torch.allclose(nll, (plain[0] + plain[1]) / 2, atol=1e-5) and kl > 0.1
