"""Device and numeric precision: chosen for the hardware found, overridable by config.

bf16 pays off on a CPU only where the CPU computes it natively (AVX-512 BF16 or AMX): elsewhere
PyTorch emulates it, and a bf16 matmul runs hundreds of times slower than fp32. ``auto`` therefore
asks the CPU, never assumes.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

import torch

from nmt.config import PRECISIONS
from nmt.errors import NMTError

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NMTError(f"trainer.device={name} but no CUDA device is available")
    return device


def cpu_has_native_bf16() -> bool:
    """True where the CPU has bf16 instructions (AVX-512 BF16 or AMX tiles) and PyTorch uses its AVX-512
    kernels (not capped with ``ATEN_CPU_CAPABILITY=avx2``, which also emulates bf16)."""
    return cpu_bf16_instructions() and torch.backends.cpu.get_cpu_capability() == "AVX512"


def cpu_bf16_instructions() -> bool:
    """AVX-512 BF16 or AMX tiles: torch's own probes (torch >= 2.5), else the flags of /proc/cpuinfo."""
    probes = [
        getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    if all(probes):
        return any(probe() for probe in probes)
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_tile"} & set(flags))


def resolve_precision(name: str, device: torch.device) -> tuple[str, str]:
    """The precision to train and decode in, and why (for the log).

    ``auto``: bf16 on GPUs that support it, else fp16; on a CPU bf16 only where it is native, else fp32.
    """
    if name not in PRECISIONS:
        raise NMTError(f"trainer.precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    if name == "fp16" and device.type != "cuda":
        raise NMTError("trainer.precision=fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    if name != "auto":
        if name == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
            warn_slow_cpu_bf16()
        return name, "set by trainer.precision"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "auto: the GPU supports bf16"
        return "fp16", "auto: the GPU has no bf16, fp16 with loss scaling"
    if cpu_has_native_bf16():
        return "bf16", "auto: the CPU computes bf16 natively (avx512_bf16/AMX)"
    return "fp32", "auto: no native bf16 here (avx512_bf16 or AMX, with AVX-512 kernels): it would be slow"


def warn_slow_cpu_bf16(size: int = 128, repeats: int = 3) -> float:
    """Warn, with a measured slowdown, that bf16 on this CPU is emulated; returns the slowdown."""
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(size, size, dtype=dtype)
        a @ a  # first call pays for allocation and dispatch
        start = time.perf_counter()
        for _ in range(repeats):
            a @ a
        seconds[dtype] = time.perf_counter() - start
    slowdown = seconds[torch.bfloat16] / max(seconds[torch.float32], 1e-9)
    log.warning(
        "trainer.precision=bf16 on a CPU without native bf16 (no avx512_bf16/AMX): a bf16 matmul is "
        "%.0fx slower than fp32 here; use trainer.precision=fp32 (or auto)",
        slowdown,
    )
    return slowdown


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])
