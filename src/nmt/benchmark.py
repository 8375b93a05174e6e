"""How fast training and decoding are, measured on real batches, next to a plain PyTorch reference.

Training runs the project's own :func:`nmt.training.loop.train_step` on a :class:`~nmt.training.loop.Run`
from :func:`~nmt.training.loop.set_up`, i.e. exactly what ``scripts/train.py`` runs, on batches of the
prepared corpus cut by the training sampler. The reference is ``torch.nn.Transformer`` of the same
dimensions with the same embeddings, tied output layer, dropout placement, label-smoothed loss,
optimizer, gradient clipping and precision. The two alternate step by step on the same batches
(A B A B ...), so load changes on a shared machine hit both alike; ``bench.precisions`` adds more
turns per batch (e.g. fp32 and bf16 autocast). Medians are over the measured steps after warmup; the
ratios (project/reference, bf16/fp32) are medians of the per-batch ratios.

Model FLOPs (the convention of PaLM's MFU: useful work only, attention counted in full even where the
causal mask skips half of it, padding not counted). For a sentence pair of s source and t target
tokens (EOS included), with N_enc/N_dec the non-embedding parameters of encoder/decoder, L_enc/L_dec
their layers, d = d_model and V the target vocabulary::

    6 * (N_enc * s + (N_dec + d * V) * t) + 12 * d * (L_enc * s * s + L_dec * t * (t + s))

6 = 2 (a multiply-add) x 3 (forward, and two matmuls backward); the output projection counts although
its weight is tied to the embeddings; 12 * d * keys per query and layer are QK^T and AV. The device's
ceiling is the FLOP rate of one large matmul measured in the same run, so "share of ceiling" says how
much of what the hardware does best the training step achieves. Peak memory is per step: the CUDA
allocator's peak on GPU; on CPU the process's peak resident set (VmHWM, reset before each step), which
includes both models, their optimizer states and the corpus.

Decoding (greedy and beam search, with and without the key/value cache) translates the first
``bench.decode_sentences`` test sentences. A randomly initialised model hardly ever emits EOS, so every
output would run to the length budget (1.2 * src_len + 10 by default), which is about twice the length
of real translations and inflates the uncached cost most; without ``bench.checkpoint`` the budget is
therefore ``bench.random_len_a * src_len + bench.random_len_b`` (default: the source length, close to
the reference length on Multi30k). The random model is the initial one, from before the training
measurement. With a checkpoint, the configured ``decoding`` settings apply. For a Transformer the
decoding results also give the key/value cache of one sentence at the mean source length (EOS
included) and mean greedy output length (BOS and output tokens; :func:`nmt.models.kv_cache_bytes`),
in the run's precision, for one beam and for ``bench.beam_size`` beams.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.benchmark_ct2 import check_ct2_bench, format_ct2, measure_ct2
from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import BenchConfig, TrainConfig, TransformerConfig, to_container
from nmt.data import Batch, collate
from nmt.decoding import translate_ids
from nmt.devices import autocast, resolve_precision
from nmt.errors import NMTError
from nmt.models import Seq2Seq, Transformer, count_parameters, kv_cache_bytes
from nmt.models.transformer import sinusoidal_table
from nmt.tokenizer import PAD_ID
from nmt.training.loop import Run, make_optimizer, set_up, train_step

log = logging.getLogger(__name__)

MiB = 2**20


def run_benchmark(cfg: TrainConfig, bench: BenchConfig, run_dir: Path) -> dict[str, Any]:
    """Measure what ``bench`` asks for; returns the results (also written to ``run_dir/bench.output``)."""
    if bench.steps < 1 or bench.warmup_steps < 0:
        raise NMTError("bench.steps must be >= 1 and bench.warmup_steps >= 0")
    if bench.decode and bench.ct2:
        check_ct2_bench(cfg, bench)
    with tempfile.TemporaryDirectory() as scratch:  # set_up's TensorBoard writer is of no use here
        run = set_up(cfg, Path(scratch))
        run.monitor.close({})
    extra = [resolve_precision(p, run.device)[0] for p in bench.precisions]
    precisions = list(dict.fromkeys([run.precision, *extra]))  # the run's own first
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "config": {**to_container(cfg), "bench": vars(bench)},
        "hardware": hardware(run.device),
        "model": {
            "arch": cfg.model.arch,
            "parameters": count_parameters(run.model),
            "precision": run.precision,
            "device": str(run.device),
            "compile": cfg.trainer.compile,
        },
        "ceiling_flops": matmul_ceiling(run.device, precisions, bench.matmul_size),
    }
    initial = {k: v.clone() for k, v in run.model.state_dict().items()}
    if bench.train:
        results["train"] = measure_training(run, bench, precisions, results["ceiling_flops"])
    if bench.decode:
        # Decode with the initial weights: a few hundred tiny updates already teach a random model to
        # emit EOS (a frequent token), which would make decoding speed depend on bench.steps.
        run.model.load_state_dict(initial)
        results["decode"] = measure_decoding(run, bench)
    results["hardware"]["load_average_end"] = list(os.getloadavg())
    return results


# ----------------------------------------------------------------------------------------- hardware
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
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
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
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    out = {}
    for name in precisions:
        a, b = (torch.randn(n, n, device=device).to(dtypes[name]) for _ in range(2))
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


# ------------------------------------------------------------------------------------------- FLOPs
def transformer_flops(model: Transformer, batch: Batch) -> float:
    """Model FLOPs of one training step on ``batch`` (formula in the module docstring)."""

    def params(*modules: nn.Module) -> int:
        return sum(p.numel() for m in modules for p in m.parameters())

    n_enc, n_dec = params(model.encoder, model.enc_norm), params(model.decoder, model.dec_norm)
    vocab, d = model.output.weight.shape
    s = batch.src.ne(PAD_ID).sum(dim=1).double()
    t = batch.tgt_out.ne(PAD_ID).sum(dim=1).double()
    dense = 6 * (n_enc * s.sum() + (n_dec + d * vocab) * t.sum())
    attention = 12 * d * (len(model.encoder) * (s * s).sum() + len(model.decoder) * (t * (t + s)).sum())
    return float(dense + attention)


# ---------------------------------------------------------------------------------------- reference
class ReferenceTransformer(nn.Module):
    """``torch.nn.Transformer`` dressed like the project's model: scaled embeddings plus positions,
    embeddings tied as configured, dropout only where the project has it, logits at every position."""

    def __init__(self, cfg: TransformerConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool):
        super().__init__()
        d = cfg.d_model
        self.scale = math.sqrt(d)
        self.src_tokens = nn.Embedding(src_vocab, d, padding_idx=PAD_ID)
        tie = cfg.share_embeddings and joint_vocab
        self.tgt_tokens = self.src_tokens if tie else nn.Embedding(tgt_vocab, d, padding_idx=PAD_ID)
        for emb in (self.src_tokens, self.tgt_tokens):
            nn.init.normal_(emb.weight, std=d**-0.5)
        if cfg.positional == "learned":
            self.positions: nn.Module | None = nn.Embedding(cfg.max_positions, d)
        else:
            self.positions = None
            self.register_buffer("table", sinusoidal_table(cfg.max_positions, d), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        with warnings.catch_warnings():  # nested-tensor fast path notice (inference only anyway)
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(
                d,
                cfg.heads,
                cfg.encoder_layers,
                cfg.decoder_layers,
                cfg.ff_dim,
                cfg.dropout,
                batch_first=True,
                norm_first=cfg.norm_first,
            )
        # nn.Transformer applies `dropout` to attention weights and hidden activations too; the project
        # has separate (default 0) rates there, so match them or the reference does extra work.
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout.p = cfg.activation_dropout
            for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = cfg.attention_dropout
        self.output = nn.Linear(d, tgt_vocab, bias=False)
        if cfg.share_embeddings:
            self.output.weight = self.tgt_tokens.weight

    def embed(self, tokens: nn.Embedding, ids: Tensor) -> Tensor:
        span = torch.arange(ids.size(1), device=ids.device)
        pos = self.positions(span) if self.positions is not None else self.table[: ids.size(1)]
        return self.dropout(tokens(ids) * self.scale + pos)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = src.eq(PAD_ID)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=src.device)
        x = self.transformer(
            self.embed(self.src_tokens, src),
            self.embed(self.tgt_tokens, tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
            tgt_is_causal=True,
        )
        return self.output(x)


class ReferenceTrainer:
    """One optimizer update of the reference: same loss, normalisation, clipping and optimizer as
    ``train_step`` (label-smoothed cross entropy summed over non-pad targets / target tokens)."""

    def __init__(self, run: Run):
        cfg, data = run.cfg, run.data
        tok = data.tokenizer
        self.model = ReferenceTransformer(cfg.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.joint)
        self.model.to(run.device).train()
        self.optimizer = make_optimizer(self.model, cfg)
        self.scaler = scaler_for(run.device, run.precision)
        self.cfg, self.device, self.precision = cfg, run.device, run.precision

    def step(self, batch: Batch) -> None:
        with autocast(self.device, self.precision):
            logits = self.model(batch.src, batch.tgt_in)
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(),
                batch.tgt_out.flatten(),
                ignore_index=PAD_ID,
                label_smoothing=self.cfg.optim.label_smoothing,
                reduction="sum",
            )
        self.scaler.scale(loss / batch.tgt_tokens).backward()
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.clip_norm if self.cfg.optim.clip_norm > 0 else math.inf
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------------------- training
def real_batches(run: Run, count: int) -> tuple[list[Batch], list[float]]:
    """The first ``count`` batches the training sampler hands out, and how long each took to collate."""
    split, batches, seconds = run.data.splits["train"], [], []
    for indices in run.sampler:
        start = time.perf_counter()
        batches.append(collate(split, indices, run.cfg.model.max_positions).to(run.device))
        seconds.append(time.perf_counter() - start)
        if len(batches) == count:
            return batches, seconds
    raise NMTError(f"the training split has fewer than {count} batches; lower bench.steps")


def timed(fn: Callable[[], Any], device: torch.device, memory: PeakMemory) -> tuple[float, int]:
    """Seconds and peak memory (bytes) of ``fn()``."""
    memory.reset()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start, memory.peak()


def measure_training(
    run: Run, bench: BenchConfig, precisions: list[str], ceilings: dict[str, float]
) -> dict[str, Any]:
    """Project and reference steps, in every precision, taking turns on the same real batches.

    Results are keyed "project fp32", "reference bf16", ...; ``ceilings`` are the device's matmul
    FLOP/s per precision. Both models keep training across precisions (speed does not depend on the
    weights); each precision has its own gradient scaler, as a run in that precision would.
    """
    batches, collate_s = real_batches(run, bench.warmup_steps + bench.steps)
    reference = None
    if bench.reference:
        if not isinstance(run.model, Transformer):
            raise NMTError("bench.reference=true needs model.arch=transformer (or set bench.reference=false)")
        reference = ReferenceTrainer(run)
    memory = PeakMemory(run.device)
    main_precision, main_scaler = run.precision, run.scaler

    def project_step(batch: Batch, precision: str, scaler: torch.amp.GradScaler) -> None:
        run.precision, run.scaler = precision, scaler
        train_step(run, [batch])
        run.progress.step += 1  # as train() does: the learning rate follows the schedule

    def reference_step(batch: Batch, precision: str, scaler: torch.amp.GradScaler) -> None:
        reference.precision, reference.scaler = precision, scaler
        reference.step(batch)

    steps: dict[str, tuple[Callable, str, torch.amp.GradScaler]] = {}
    for precision in precisions:
        steps[f"project {precision}"] = (project_step, precision, scaler_for(run.device, precision))
        if reference is not None:
            steps[f"reference {precision}"] = (reference_step, precision, scaler_for(run.device, precision))
    times: dict[str, list[float]] = {name: [] for name in steps}
    peaks: dict[str, list[int]] = {name: [] for name in steps}
    first_step = 0.0
    log.info(
        "training: %d warmup + %d measured batches, each timed for %s",
        len(batches) - bench.steps,
        bench.steps,
        ", ".join(steps),
    )
    for i, batch in enumerate(batches):
        for name, (step, precision, scaler) in steps.items():
            seconds, peak = timed(functools.partial(step, batch, precision, scaler), run.device, memory)
            if i == 0 and name == f"project {main_precision}":
                first_step = seconds  # includes torch.compile's compilation with trainer.compile=true
            if i >= bench.warmup_steps:
                times[name].append(seconds)
                peaks[name].append(peak)
    run.precision, run.scaler = main_precision, main_scaler

    measured = batches[bench.warmup_steps :]
    real = [b.src_tokens + b.tgt_tokens for b in measured]
    padded = sum(b.src.numel() + b.tgt_in.numel() for b in measured)
    flops = [transformer_flops(run.model, b) for b in measured] if isinstance(run.model, Transformer) else []
    out: dict[str, Any] = {
        "steps": bench.steps,
        "warmup_steps": bench.warmup_steps,
        "batches": {
            "max_tokens": run.cfg.trainer.max_tokens,
            "sentences_mean": statistics.mean(len(b) for b in measured),
            "real_tokens_mean": statistics.mean(real),
            "tgt_tokens_mean": statistics.mean(b.tgt_tokens for b in measured),
            "padding_fraction": 1.0 - sum(real) / padded,
            "collate_ms_median": 1000 * statistics.median(collate_s[bench.warmup_steps :]),
        },
        "model_flops_per_token": sum(flops) / sum(real) if flops else None,
        "first_step_s": first_step,
        "memory_peak_is_per_step": memory.resettable,
        "results": {},
    }
    for name, seconds in times.items():
        result = {
            "step_ms_median": 1000 * statistics.median(seconds),
            "tokens_per_s_median": statistics.median(n / s for n, s in zip(real, seconds)),
            "tgt_tokens_per_s_median": statistics.median(b.tgt_tokens / s for b, s in zip(measured, seconds)),
            "peak_memory_mib": max(peaks[name]) / MiB,
            "step_ms": [round(1000 * x, 2) for x in seconds],  # per measured step, in batch order
        }
        if flops:
            result["model_flops_per_s_median"] = statistics.median(f / s for f, s in zip(flops, seconds))
            result["share_of_ceiling"] = result["model_flops_per_s_median"] / ceilings[steps[name][1]]
        out["results"][name] = result

    def paired(slow: str, fast: str) -> float:
        """Median over batches of time(slow) / time(fast): how many times faster ``fast`` is."""
        return statistics.median(a / b for a, b in zip(times[slow], times[fast]))

    if reference is not None:
        out["project_over_reference"] = {p: paired(f"reference {p}", f"project {p}") for p in precisions}
    out["speedup_over_fp32"] = {
        f"{model} {p}": paired(f"{model} fp32", f"{model} {p}")
        for p in precisions
        if p != "fp32" and "fp32" in precisions
        for model in ("project", "reference")
        if f"{model} {p}" in times
    }
    return out


def scaler_for(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling only for fp16, as set_up decides."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


# ----------------------------------------------------------------------------------------- decoding
def measure_decoding(run: Run, bench: BenchConfig) -> dict[str, Any]:
    """Greedy and beam search, cached and uncached, over the first test sentences; one timed pass each."""
    cfg, data = run.cfg, run.data
    src_text = data.raw("test")[0]
    n = len(src_text) if bench.decode_sentences <= 0 else min(bench.decode_sentences, len(src_text))
    if bench.checkpoint:
        model, tokenizer, ckpt_cfg = model_from_checkpoint(load_checkpoint(bench.checkpoint), run.device)
        sources = tokenizer.encode_src(src_text[:n])
        max_positions, decoding, origin = ckpt_cfg.model.max_positions, cfg.decoding, bench.checkpoint
        model_cfg = ckpt_cfg.model
    else:
        model: Seq2Seq = run.model
        tokenizer = data.tokenizer
        split = data.splits["test"]
        sources = [split.src(i) for i in range(n)]
        max_positions, origin, model_cfg = cfg.model.max_positions, "random", cfg.model
        decoding = replace(cfg.decoding, max_len_a=bench.random_len_a, max_len_b=bench.random_len_b)
    searches = [("greedy", 1), (f"beam {bench.beam_size}", bench.beam_size)]

    outputs = {}  # (beam, cache) -> the last run's hypotheses, for the CTranslate2 comparison

    def decode(beam: int, cache: bool, some: list) -> tuple[float, int]:
        settings = replace(decoding, beam_size=beam, nbest=1, cache=cache)
        synchronize(run.device)
        start = time.perf_counter()
        with autocast(run.device, run.precision):
            hyps = translate_ids(model, some, settings, run.device, max_positions)
        synchronize(run.device)
        outputs[beam, cache] = hyps
        return time.perf_counter() - start, sum(len(h[0].tokens) + 1 for h in hyps)  # + EOS

    for _, beam in searches:  # warm up allocator and kernels
        decode(beam, True, sources[:32])
    rows = []
    for name, beam in searches:
        for cache in (True, False):
            log.info("decoding %d sentences: %s, cache %s", n, name, "on" if cache else "off")
            seconds, tokens = decode(beam, cache, sources)
            rows.append(
                {
                    "search": name,
                    "beam_size": beam,
                    "cache": cache,
                    "seconds": seconds,
                    "sentences_per_s": n / seconds,
                    "tgt_tokens_per_s": tokens / seconds,
                    "tgt_tokens": tokens,
                }
            )
    model.train()
    speedup = {
        name: next(r["seconds"] for r in rows if r["search"] == name and not r["cache"])
        / next(r["seconds"] for r in rows if r["search"] == name and r["cache"])
        for name, _ in searches
    }
    out = {
        "model": origin,
        "sentences": n,
        "max_len": [decoding.max_len_a, decoding.max_len_b],
        "results": rows,
        "cache_speedup": speedup,
    }
    if isinstance(model_cfg, TransformerConfig):
        greedy_tokens = next(r["tgt_tokens"] for r in rows if r["beam_size"] == 1 and r["cache"])
        src_positions = round(statistics.mean(min(len(s), max_positions - 1) + 1 for s in sources))
        tgt_positions = round(greedy_tokens / n)  # BOS and the output tokens are fed (EOS ends it)
        dtype_bytes = 4 if run.precision == "fp32" else 2
        per_sentence = kv_cache_bytes(model_cfg, tgt_positions, src_positions, dtype_bytes)
        out["kv_cache_per_sentence"] = {
            "src_positions": src_positions,
            "tgt_positions": tgt_positions,
            "kv_heads": model_cfg.kv_heads or model_cfg.heads,
            "dtype_bytes": dtype_bytes,
            "bytes": per_sentence,
            "beam_bytes": bench.beam_size * per_sentence,
        }
    if bench.ct2:
        seconds = {r["search"]: r["seconds"] for r in rows if r["cache"]}
        cached = {name: (seconds[name], outputs[beam, True]) for name, beam in searches}
        out["ct2"] = measure_ct2(model, tokenizer, sources, decoding, searches, cached, bench, run.device)
    return out


# ------------------------------------------------------------------------------------------- report
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
    return [*out, extra]


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
            f"KV cache per sentence: {kv['bytes'] / 1024:.1f} KiB, beam {kv['beam_bytes'] // kv['bytes']} "
            f"{kv['beam_bytes'] / 1024:.1f} KiB ({kv['src_positions']} source + {kv['tgt_positions']} target "
            f"positions, {kv['kv_heads']} key/value heads, {kv['dtype_bytes']} bytes per value)"
        )
    return [*out, *(format_ct2(decode["ct2"]) if "ct2" in decode else [])]
