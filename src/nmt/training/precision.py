"""The timed probe behind ``trainer.precision=auto`` on a CPU whose bf16 is AVX-512 BF16 alone, where
bf16 is faster or slower than fp32 depending on the model, the threads and the CPU (nmt.devices)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict
from itertools import islice
from pathlib import Path

import torch

from nmt.config import TrainConfig
from nmt.data import Batch, PreparedData, TokenBatchSampler, collate
from nmt.devices import autocast, machine_key, probe_bf16_speedup
from nmt.errors import NMTError
from nmt.models import Seq2Seq
from nmt.training.distributed import Dist, broadcast_object
from nmt.training.loss import batch_loss

PROBE_CACHE = "precision_probe.json"  # in data.cache_dir, beside the prepared corpora
PROBE_BATCHES = 8  # training batches the probe cycles through: their shapes vary as training's do


def bf16_probe(
    cfg: TrainConfig,
    model: Seq2Seq,
    data: PreparedData,
    sampler: TokenBatchSampler,
    device: torch.device,
    dist: Dist,
) -> Callable[[], tuple[float, str]]:
    """What resolve_precision calls to learn bf16's speed over fp32 (and where the figure comes from):
    forward and backward passes of ``model`` on the run's first training batches (drawn from a copy of
    its ``sampler``, which is not moved), timed on rank 0 (or read from its cache) and
    shared with every rank. Real batches, not one made-up shape: bf16's gain depends on the matrix
    sizes, which the corpus's sentence lengths and the token budget set. The model's gradients and the
    random state are left as they were, so the run trains as it would have without the probe."""
    key = {
        **machine_key(),
        "model": asdict(cfg.model),
        "vocab": [model.vocab_sizes["src"], model.vocab_sizes["tgt"]],
        "max_tokens": cfg.trainer.max_tokens,
        "data": data.root.name,  # the corpus whose batches are timed
    }
    batches: list[Batch] = []
    calls = [0]

    def update(precision: str) -> None:
        if not batches:
            batches.extend(probe_batches(sampler, data, cfg.model.max_positions, device))
            if not batches:
                raise NMTError(
                    f"trainer.precision=auto: the training split of {data.root} has no batch to time"
                )
        batch = batches[calls[0] // 2 % len(batches)]  # both precisions of a pair time the same batch
        calls[0] += 1
        with autocast(device, precision):
            loss, _ = batch_loss(model, batch, cfg.optim.label_smoothing)
        loss.backward()

    def speedup() -> tuple[float, str]:
        result = None
        if dist.is_main:
            with torch.random.fork_rng(devices=[]):
                result = probe_bf16_speedup(update, key, Path(cfg.data.cache_dir) / PROBE_CACHE)
            model.zero_grad(set_to_none=True)
        return broadcast_object(result, dist)

    return speedup


def probe_batches(
    sampler: TokenBatchSampler, data: PreparedData, max_positions: int, device: torch.device
) -> list[Batch]:
    """The first batches of the run's first epoch, from a copy of its (not yet restored) sampler."""
    first = islice(copy.deepcopy(sampler), PROBE_BATCHES)
    split = data.train_segmentations[0]  # epoch 0's segmentation
    return [collate(split, indices, max_positions).to(device) for indices in first]
