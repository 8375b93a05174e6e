"""torch.distributed set-up for ``torchrun``: one process per device, NCCL on GPU, gloo on CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> Dist:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); a no-op otherwise."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(values: torch.Tensor, ranks: Dist) -> torch.Tensor:
    if ranks.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_gather_object(obj, ranks: Dist) -> list:
    """Every rank's ``obj``, in rank order, on every rank (e.g. random states for the checkpoint)."""
    if not ranks.enabled:
        return [obj]
    out = [None] * ranks.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, ranks: Dist):
    """Rank 0's value of ``obj`` on every rank (stop decisions, validation results)."""
    if not ranks.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def cleanup(ranks: Dist) -> None:
    if ranks.enabled and dist.is_initialized():
        dist.destroy_process_group()
