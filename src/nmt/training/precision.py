"""The timed probe behind ``trainer.precision=auto`` on a CPU whose bf16 is AVX-512 BF16 alone, where
bf16 is faster or slower than fp32 depending on the model, the threads and the CPU (nmt.devices)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from nmt.config import TrainConfig
from nmt.devices import autocast, machine_key, probe_bf16_speedup
from nmt.models import Seq2Seq
from nmt.special import PAD_ID
from nmt.training.distributed import Dist, broadcast_object
from nmt.training.loss import label_smoothed_nll

PROBE_CACHE = "precision_probe.json"  # in data.cache_dir, beside the prepared corpora
PROBE_LENGTH = 16  # subwords per side of the probe's sentence pairs, about a Multi30k sentence


def bf16_probe(
    cfg: TrainConfig, model: Seq2Seq, device: torch.device, dist: Dist
) -> Callable[[], tuple[float, str]]:
    """What resolve_precision calls to learn bf16's speed over fp32 (and where the figure comes from):
    forward and backward passes of ``model`` on a batch of ``trainer.max_tokens`` tokens, timed on rank
    0 (or read from its cache) and shared with every rank. The model's gradients and the random state
    are left as they were, so the run trains as it would have without the probe."""
    src_vocab, tgt_vocab = model.vocab_sizes["src"], model.vocab_sizes["tgt"]
    pairs = max(1, cfg.trainer.max_tokens // (2 * PROBE_LENGTH))
    key = {
        **machine_key(),
        "model": asdict(cfg.model),
        "vocab": [src_vocab, tgt_vocab],
        "max_tokens": cfg.trainer.max_tokens,
    }

    def update(precision: str) -> None:
        generator = torch.Generator().manual_seed(0)
        src = torch.randint(4, src_vocab, (pairs, PROBE_LENGTH), generator=generator).to(device)
        tgt = torch.randint(4, tgt_vocab, (pairs, PROBE_LENGTH + 1), generator=generator).to(device)
        keep = tgt[:, 1:].ne(PAD_ID)
        with autocast(device, precision):
            logits = model(src, tgt[:, :-1], keep)
            loss, _ = label_smoothed_nll(logits, tgt[:, 1:][keep], cfg.optim.label_smoothing)
        loss.backward()

    def speedup() -> tuple[float, str]:
        result = None
        if dist.is_main:
            with torch.random.fork_rng(devices=[]):
                result = probe_bf16_speedup(update, key, Path(cfg.data.cache_dir) / PROBE_CACHE)
            model.zero_grad(set_to_none=True)
        return broadcast_object(result, dist)

    return speedup
