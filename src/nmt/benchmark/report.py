"""The benchmark results as a plain-text table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nmt.benchmark.ct2_speed import format_ct2


def format_report(results: dict[str, Any]) -> str:
    """The results as a plain-text table."""
    hw, model = results["hardware"], results["model"]
    ceiling = results["ceiling_flops"]
    lines = [
        f"hardware  {hw['cpu']} ({hw['cpus']} CPUs, {hw['torch_threads']} torch threads)"
        + (f", {hw['gpu']}" if "gpu" in hw else "")
        + f", torch {hw['torch']}, load {hw['load_average_start'][0]:.2f} -> {hw['load_average_end'][0]:.2f}",
        f"model     {model['arch']}, {model['parameters'] / 1e6:.1f}M parameters, {model['precision']} on "
        f"{model['device']}" + (", compiled" if model["compile"] else ""),
        "ceiling   "
        + ", ".join(f"{name} matmul {flops / 1e9:.0f} GFLOP/s" for name, flops in ceiling.items()),
    ]
    if "train" in results:
        lines += ["", *_training_table(results["train"])]
    if "decode" in results:
        lines += ["", *_decoding_table(results["decode"])]
    return "\n".join(lines)


def _training_table(train: dict[str, Any]) -> list[str]:
    b, results = train["batches"], train["results"]
    rows: list[tuple[str, Callable[[dict], str]]] = [
        ("step time (ms)", lambda m: f"{m['step_ms_median']:.1f}"),
        ("tokens/s (src+tgt)", lambda m: f"{m['tokens_per_s_median']:.0f}"),
        ("target tokens/s", lambda m: f"{m['tgt_tokens_per_s_median']:.0f}"),
        ("peak memory (MiB)", lambda m: f"{m['peak_memory_mib']:.0f}"),
    ]
    if train["model_flops_per_token"]:
        rows += [
            ("model GFLOP/s", lambda m: f"{m['model_flops_per_s_median'] / 1e9:.1f}"),
            ("share of ceiling", lambda m: f"{100 * m['share_of_ceiling']:.1f}%"),
        ]
    out = [
        f"training: {train['steps']} measured steps after {train['warmup_steps']} warmup, medians",
        f"{'':<20}" + "".join(f"{name:>16}" for name in results),
    ]
    out += [f"{label:<20}" + "".join(f"{value(m):>16}" for m in results.values()) for label, value in rows]
    for precision, ratio in train.get("project_over_reference", {}).items():
        out.append(f"project/reference tokens/s, {precision}: {ratio:.3f} (median of per-batch ratios)")
    for name, ratio in train["speedup_over_fp32"].items():
        out.append(f"{name} speed / fp32 speed: {ratio:.2f}x (median of per-batch ratios)")
    out.append(
        f"batches: max_tokens {b['max_tokens']}, {b['sentences_mean']:.0f} sentences and "
        f"{b['real_tokens_mean']:.0f} real tokens on average, padding {100 * b['padding_fraction']:.1f}%, "
        f"collate {b['collate_ms_median']:.1f} ms"
    )
    extra = f"first project step {train['first_step_s']:.2f} s"
    if train["model_flops_per_token"]:
        extra = f"model FLOPs per token {train['model_flops_per_token'] / 1e6:.1f} M; " + extra
    if not train["memory_peak_is_per_step"]:
        extra += "; peak memory is the process's lifetime peak"
    return [*out, extra, *(_profile_table(train["profile"]) if "profile" in train else [])]


def _profile_table(profile: dict[str, Any]) -> list[str]:
    total = profile["ms_per_step"]
    out = [
        "",
        f"where a project step's time goes: torch.profiler, {profile['steps']} steps, self CPU time, "
        f"{total:.1f} ms per step",
        f"{'group':<30}{'ms/step':>10}{'share':>8}",
    ]
    for group, ms in sorted(profile["groups_ms"].items(), key=lambda kv: -kv[1]):
        out.append(f"{group:<30}{ms:>10.1f}{100 * ms / total:>7.1f}%")
    out.append(f"{'top operators':<60}{'ms/step':>10}{'calls/step':>12}")
    for op in profile["top_ops"]:
        out.append(f"{op['op']:<60}{op['ms_per_step']:>10.1f}{op['calls_per_step']:>12.0f}")
    return out


def _decoding_table(decode: dict[str, Any]) -> list[str]:
    a, b = decode["max_len"]
    origin = (
        f"random model, outputs of {a:g} * src_len + {b} tokens"
        if decode["model"] == "random"
        else f"checkpoint {decode['model']}"
    )
    out = [
        f"decoding: {decode['sentences']} test sentences, {origin}",
        f"{'search':<10}{'cache':>6}{'sent/s':>10}{'tok/s':>10}{'seconds':>10}",
    ]
    for r in decode["results"]:
        out.append(
            f"{r['search']:<10}{'on' if r['cache'] else 'off':>6}{r['sentences_per_s']:>10.1f}"
            f"{r['tgt_tokens_per_s']:>10.0f}{r['seconds']:>10.2f}"
        )
    speedups = ", ".join(f"{name} {x:.2f}x" for name, x in decode["cache_speedup"].items())
    out.append(f"cache speedup: {speedups}")
    if "kv_cache_per_sentence" in decode:
        kv = decode["kv_cache_per_sentence"]
        out.append(
            f"KV cache per sentence: {kv['bytes'] / 1024:.1f} KiB, beam {kv['beam_size']} "
            f"{kv['beam_bytes'] / 1024:.1f} KiB ({kv['src_positions']} source + {kv['tgt_positions']} target "
            f"positions, {kv['kv_heads']} key/value heads, {kv['dtype_bytes']} bytes per value)"
        )
    return [*out, *(format_ct2(decode["ct2"]) if "ct2" in decode else [])]
