"""Decoding throughput: greedy and beam search, with and without the key/value cache.

A randomly initialised model hardly ever emits EOS, so its outputs would all run to the length
budget; without ``bench.checkpoint`` the budget is ``bench.random_len_a * src_len +
bench.random_len_b`` instead, about the length of real translations.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import replace
from typing import Any

from nmt.benchmark.ct2_speed import measure_ct2
from nmt.benchmark.hardware import synchronize
from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import BenchConfig, TransformerConfig
from nmt.decoding import translate_ids
from nmt.devices import autocast
from nmt.models import Seq2Seq, kv_cache_bytes
from nmt.training.setup import Run

log = logging.getLogger(__name__)


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
            "beam_size": bench.beam_size,
            "beam_bytes": kv_cache_bytes(
                model_cfg, tgt_positions, src_positions, dtype_bytes, bench.beam_size
            ),
        }
    if bench.ct2:
        seconds = {r["search"]: r["seconds"] for r in rows if r["cache"]}
        cached = {name: (seconds[name], outputs[beam, True]) for name, beam in searches}
        out["ct2"] = measure_ct2(model, tokenizer, sources, decoding, searches, cached, bench, run.device)
    return out
