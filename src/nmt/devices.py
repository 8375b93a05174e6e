"""Device and numeric precision: chosen automatically, overridable by config."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from nmt.errors import NMTError


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NMTError(f"trainer.device={name} but no CUDA device is available")
    return device


def resolve_precision(name: str, device: torch.device) -> str:
    """``auto``: bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."""
    if name == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if name not in ("fp32", "bf16", "fp16"):
        raise NMTError(f"trainer.precision must be auto, fp32, bf16 or fp16, got {name!r}")
    if name == "fp16" and device.type != "cuda":
        raise NMTError("trainer.precision=fp16 needs a CUDA device (use bf16 on CPU)")
    return name


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
