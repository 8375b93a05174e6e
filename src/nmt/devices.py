"""Device and numeric precision: chosen for the hardware found, overridable by config.

bf16 pays off on a CPU only where the CPU computes it natively, and even there not always. Without
bf16 instructions PyTorch emulates it, and a bf16 matmul runs hundreds of times slower than fp32. With
AVX-512 BF16 (dot-product instructions, e.g. AMD Zen 4) bf16 matmuls run about twice as fast, with AMX
tiles several times; but a small model's update is not all matmuls and bf16 adds casts, so the gain
depends on the model, the threads and the CPU. The multi30k_cpu model's updates ran 1.16-1.34x as
fast in bf16 on one Zen 4, and 0.83-0.86x on a Xeon with AMX, whose bf16 matmuls ran 6x fp32's rate.
``auto`` therefore asks the CPU and, where it has native bf16, times both (:func:`probe_bf16_speedup`).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from nmt.cache import atomic_write_text
from nmt.config import TrainerConfig, keyed_by_choices
from nmt.errors import NMTError

log = logging.getLogger(__name__)

# The trainer.precision choices but auto, which resolve_precision turns into one of them.
DTYPES = keyed_by_choices(
    TrainerConfig,
    "precision",
    {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16},
    besides=("auto",),
)
# What the CPU's bf16 is, for PyTorch: AMX tiles, AVX-512 BF16 dot products only, or emulated ("").
AMX, AVX512_BF16 = "amx", "avx512_bf16"


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NMTError(f"trainer.device={name} but no CUDA device is available")
    return device


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Have glibc's malloc reuse freed memory instead of giving it back to the kernel, as jemalloc and
    tcmalloc do (PyTorch's CPU performance guide recommends them; they are not pip packages).

    A CPU training step allocates and frees the same large tensors every step: the main job's
    (tokens, vocabulary) logits and probabilities are 46 MB each. glibc serves any allocation above its
    mmap threshold (at most 32 MB) with fresh pages, which the kernel zeroes on first touch, one page
    fault per 4 KiB, so the output layer's product ran at half the matmul rate and the loss's softmax
    at a third of its own (docs/speed.md). Without mmap (M_MMAP_MAX 0) large blocks come from the heap,
    and up to 1 GiB freed at its top stays there (M_TRIM_THRESHOLD). Process-wide, meant for the
    training process; returns False where the C library is not glibc (nothing changed)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask where the OS has one (Linux; a
    container or ``taskset`` may narrow it below the machine's count), else every core (macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_bf16_kind() -> str:
    """:data:`AMX`, :data:`AVX512_BF16` or "" (emulated): the CPU's bf16 instructions that PyTorch uses,
    which it does only with its AVX-512 kernels (``ATEN_CPU_CAPABILITY=avx2`` also emulates bf16)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return ""
    avx512_bf16, amx = cpu_bf16_instructions()
    return AMX if amx else AVX512_BF16 if avx512_bf16 else ""


def cpu_has_native_bf16() -> bool:
    return bool(cpu_bf16_kind())


def cpu_bf16_instructions() -> tuple[bool, bool]:
    """(AVX-512 BF16, AMX tiles): torch's own probes (torch >= 2.5), else the flags of /proc/cpuinfo."""
    probes = [
        getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    if all(probes):
        return probes[0](), probes[1]()
    flags = cpuinfo()[1]
    return "avx512_bf16" in flags, "amx_tile" in flags


def cpuinfo() -> tuple[str, set[str]]:
    """The CPU's model name and flags from /proc/cpuinfo (empty where there is none)."""
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return name, flags


def resolve_precision(
    name: str,
    device: torch.device,
    bf16_speedup: Callable[[], tuple[float, str]] | None = None,
    min_speedup: float = 1.0,
) -> tuple[str, str]:
    """The precision to train and decode in, and why (for the log).

    ``auto``: bf16 on GPUs that support it, else fp16. On a CPU: fp32 without native bf16; with it
    (AVX-512 BF16 or AMX), bf16 if ``bf16_speedup()`` (bf16 speed / fp32 speed, and where that figure
    comes from) is at least ``min_speedup``, else fp32 (also without ``bf16_speedup``).
    """
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
    kind = cpu_bf16_kind()
    if not kind:
        return (
            "fp32",
            "auto: no native bf16 here (avx512_bf16 or AMX, with AVX-512 kernels): it would be slow",
        )
    if bf16_speedup is None:
        return "fp32", f"auto: this CPU's bf16 ({kind}) is often no faster for a small model (not timed here)"
    speedup, source = bf16_speedup()
    if speedup >= min_speedup:
        return "bf16", f"auto: bf16 trains {speedup:.2f}x as fast as fp32 here ({source})"
    return "fp32", (
        f"auto: bf16 trains {speedup:.2f}x as fast as fp32 here ({source}), under "
        f"trainer.cpu_bf16_min_speedup={min_speedup:g}"
    )


def probe_bf16_speedup(
    update: Callable[[str], None], key: dict[str, Any], cache: Path, pairs: int = 8
) -> tuple[float, str]:
    """bf16 speed / fp32 speed of ``update(precision)`` (a forward and backward pass of the model in
    that precision), and where the figure comes from. Measured once per ``key`` (the machine, threads,
    torch and model shape) and kept in the JSON file ``cache``: a run chooses as the runs before it
    on the same machine did. One warm-up each, then ``pairs`` pairs taking turns (fp32 first, then
    bf16 first), so load on a shared machine hits both alike; the median of per-pair ratios."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    if digest in known:
        return known[digest]["speedup"], f"timed {known[digest]['measured']}, cached in {cache}"
    for precision in ("fp32", "bf16"):
        update(precision)
    ratios = []
    for i in range(pairs):
        seconds = {}
        for precision in ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32"):
            start = time.perf_counter()
            update(precision)
            seconds[precision] = time.perf_counter() - start
        ratios.append(seconds["fp32"] / seconds["bf16"])
    speedup = statistics.median(ratios)
    measured = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    known[digest] = {"speedup": round(speedup, 3), "measured": measured, "key": key}
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cache, json.dumps(known, indent=2) + "\n")  # runs started together see it whole
    return speedup, f"timed now over {pairs} updates each, cached in {cache}"


def machine_key() -> dict[str, Any]:
    """What a precision's speed depends on besides the model: the CPU, the kernels, torch, threads."""
    name, flags = cpuinfo()
    return {
        "cpu": name,
        "flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


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
