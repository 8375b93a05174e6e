"""What benchmark numbers depend on: the machine, its matmul ceiling, and peak memory."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import statistics
import time
from typing import Any

import torch

from nmt.devices import DTYPES, usable_cores

MiB = 2**20


def hardware(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: CPU (or GPU) model, torch build, threads, and the load at the start."""
    cpu, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
        "cpus": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_start": list(os.getloadavg()),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device: torch.device, precisions: list[str], n: int, repeats: int = 5) -> dict[str, float]:
    """FLOP/s of an n x n x n matmul (median of ``repeats``) in each precision (what autocast runs)."""
    out = {}
    for name in precisions:
        a, b = (torch.randn(n, n, device=device).to(DTYPES[name]) for _ in range(2))
        times = []
        for i in range(repeats + 1):  # the first one warms up
            synchronize(device)
            start = time.perf_counter()
            a @ b
            synchronize(device)
            if i:
                times.append(time.perf_counter() - start)
        out[name] = 2 * n**3 / statistics.median(times)
    return out


class PeakMemory:
    """Peak memory of a stretch of code: CUDA allocator peak on GPU, resident set size (VmHWM) on CPU.

    Linux resets the process's VmHWM by writing 5 to /proc/self/clear_refs; where that is not allowed
    the lifetime peak (``ru_maxrss``) is all there is, and ``resettable`` says so.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.resettable = device.type == "cuda" or self._clear_refs()

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.resettable:
            self._clear_refs()

    def peak(self) -> int:
        """Bytes: allocated tensors on GPU, the whole process's resident memory on CPU."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        with contextlib.suppress(OSError), open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    @staticmethod
    def _clear_refs() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False
