"""Where the project's training step spends its time: ``torch.profiler`` over a few steps, the operators'
self time grouped into the costs a small model's step is made of.

The groups go by operator, not by module: an elementwise multiply counts under "other" whether dropout,
the loss or the optimizer made it. Self time is CPU time, so on a GPU it is the host's time to launch
the kernels, not theirs. The profiler's own bookkeeping (a few microseconds per operator) inflates the
many small operators a little, so the shares matter more than the milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from nmt.data import Batch

# Operator names (aten::, without the prefix) of each group, checked in this order.
GROUPS: dict[str, tuple[str, ...]] = {
    "matrix products": ("mm", "addmm", "bmm", "baddbmm", "_addmm_activation"),
    "fused attention": (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    ),
    "softmax, log-softmax, exp": (
        "_softmax",
        "_log_softmax",
        "_softmax_backward_data",
        "_log_softmax_backward_data",
        "logsumexp",
        "exp",
        "exp_",
    ),
    "layer norm": ("native_layer_norm", "native_layer_norm_backward"),
    "random numbers (dropout)": ("random_", "uniform_", "bernoulli_", "rand_like", "native_dropout"),
    "optimizer": ("_fused_adam_", "_fused_adamw_"),
    "gradient norm and clipping": ("_foreach_norm", "_foreach_mul_", "linalg_vector_norm", "clamp"),
    "embeddings": ("embedding", "embedding_dense_backward", "embedding_backward", "index_select"),
    "copies and layout": (
        "copy_",
        "clone",
        "cat",
        "contiguous",
        "_to_copy",
        "index",
        "gather",
        "scatter_add_",
    ),
}


def group_of(op: str) -> str:
    """The group of an operator name as the profiler reports it (``aten::mm``); "other" if none."""
    name = op.removeprefix("aten::")
    return next((group for group, names in GROUPS.items() if name in names), "other")


def profile_steps(step: Callable[[Batch], None], batches: list[Batch], top: int = 15) -> dict[str, Any]:
    """``step`` on each of ``batches`` under the profiler: milliseconds per step by group (summing to the
    profiled step time) and the ``top`` operators by self time."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            step(batch)
    ops = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    per_step = 1e-3 / len(batches)  # microseconds in all -> milliseconds per step
    groups = dict.fromkeys([*GROUPS, "other"], 0.0)
    for e in ops:
        groups[group_of(e.key)] += e.self_cpu_time_total * per_step
    ranked = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "steps": len(batches),
        "ms_per_step": sum(groups.values()),
        "groups_ms": groups,
        "top_ops": [
            {
                "op": e.key,
                "group": group_of(e.key),
                "ms_per_step": e.self_cpu_time_total * per_step,
                "calls_per_step": e.count / len(batches),
            }
            for e in ranked
        ],
        "torch_threads": torch.get_num_threads(),
    }
