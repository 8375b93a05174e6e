"""Decoding throughput: greedy and beam search, with and without the key/value cache.

A randomly initialised model hardly ever emits EOS, so its outputs would all run to the length
budget; without ``bench.checkpoint`` the budget is ``bench.random_len_a * src_len +
bench.random_len_b`` instead, about the length of real translations.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

from nmt.benchmark.ct2_speed import measure_ct2
from nmt.benchmark.hardware import synchronize
from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import BenchConfig, DecodingConfig, TransformerConfig
from nmt.decoding import translate_ids
from nmt.devices import autocast
from nmt.models import Seq2Seq, kv_cache_bytes
from nmt.text.tokenizer import Tokenizer
from nmt.training.setup import Run

log = logging.getLogger(__name__)


@dataclass
class Subject:
    """What is decoded: the model (the checkpoint's, or the run's randomly initialised one), the first
    ``sentences`` test sources as ids, and the settings."""

    model: Seq2Seq
    tokenizer: Tokenizer
    sources: list[list[int]]
    max_positions: int
    decoding: DecodingConfig
    origin: str  # the checkpoint's path, or "random"
    model_cfg: Any  # the model's config

    @property
    def sentences(self) -> int:
        return len(self.sources)


def measure_decoding(run: Run, bench: BenchConfig) -> dict[str, Any]:
    """Greedy and beam search, cached and uncached, over the first test sentences; one timed pass each."""
    subject = decoding_subject(run, bench)
    searches = [("greedy", 1), (f"beam {bench.beam_size}", bench.beam_size)]
    outputs = {}  # (beam, cache) -> the last run's hypotheses, for the CTranslate2 comparison
    for _, beam in searches:  # warm up allocator and kernels
        decode(run, subject, beam, True, subject.sources[:32])
    rows = []
    for name, beam in searches:
        for cache in (True, False):
            log.info("decoding %d sentences: %s, cache %s", subject.sentences, name, "on" if cache else "off")
            seconds, tokens, outputs[beam, cache] = decode(run, subject, beam, cache, subject.sources)
            rows.append(
                {
                    "search": name,
                    "beam_size": beam,
                    "cache": cache,
                    "seconds": seconds,
                    "sentences_per_s": subject.sentences / seconds,
                    "tgt_tokens_per_s": tokens / seconds,
                    "tgt_tokens": tokens,
                }
            )
    subject.model.train()
    speedup = {
        name: next(r["seconds"] for r in rows if r["search"] == name and not r["cache"])
        / next(r["seconds"] for r in rows if r["search"] == name and r["cache"])
        for name, _ in searches
    }
    decoding = subject.decoding
    out = {
        "model": subject.origin,
        "sentences": subject.sentences,
        "max_len": [decoding.max_len_a, decoding.max_len_b],
        "results": rows,
        "cache_speedup": speedup,
    }
    if isinstance(subject.model_cfg, TransformerConfig):
        out["kv_cache_per_sentence"] = kv_cache_report(run, bench, subject, rows)
    if bench.ct2:
        seconds = {r["search"]: r["seconds"] for r in rows if r["cache"]}
        cached = {name: (seconds[name], outputs[beam, True]) for name, beam in searches}
        out["ct2"] = measure_ct2(
            subject.model, subject.tokenizer, subject.sources, decoding, searches, cached, bench, run.device
        )
    return out


def decoding_subject(run: Run, bench: BenchConfig) -> Subject:
    """The checkpoint of ``bench.checkpoint``, or the run's model with ``bench.random_len_*``'s length
    budget, over the first ``bench.decode_sentences`` test sentences (all with 0)."""
    cfg, data = run.cfg, run.data
    src_text = data.raw("test")[0]
    n = len(src_text) if bench.decode_sentences <= 0 else min(bench.decode_sentences, len(src_text))
    if bench.checkpoint:
        model, tokenizer, ckpt_cfg = model_from_checkpoint(load_checkpoint(bench.checkpoint), run.device)
        sources = tokenizer.encode_src(src_text[:n])
        return Subject(
            model,
            tokenizer,
            sources,
            ckpt_cfg.model.max_positions,
            cfg.decoding,
            bench.checkpoint,
            ckpt_cfg.model,
        )
    split = data.splits["test"]
    sources = [split.src(i) for i in range(n)]
    decoding = replace(cfg.decoding, max_len_a=bench.random_len_a, max_len_b=bench.random_len_b)
    return Subject(run.model, data.tokenizer, sources, cfg.model.max_positions, decoding, "random", cfg.model)


def decode(
    run: Run, subject: Subject, beam: int, cache: bool, some: list[list[int]]
) -> tuple[float, int, list]:
    """Seconds and output tokens (EOS included) of one search over ``some``, and its hypotheses."""
    settings = replace(subject.decoding, beam_size=beam, nbest=1, cache=cache)
    synchronize(run.device)
    start = time.perf_counter()
    with autocast(run.device, run.precision):
        hyps = translate_ids(subject.model, some, settings, run.device, subject.max_positions)
    synchronize(run.device)
    return time.perf_counter() - start, sum(len(h[0].tokens) + 1 for h in hyps), hyps  # + EOS


def kv_cache_report(run: Run, bench: BenchConfig, subject: Subject, rows: list[dict]) -> dict[str, Any]:
    """The key/value cache a Transformer keeps per sentence, for the average greedy output."""
    model_cfg, n = subject.model_cfg, subject.sentences
    greedy_tokens = next(r["tgt_tokens"] for r in rows if r["beam_size"] == 1 and r["cache"])
    src_positions = round(
        statistics.mean(min(len(s), subject.max_positions - 1) + 1 for s in subject.sources)
    )
    tgt_positions = round(greedy_tokens / n)  # BOS and the output tokens are fed (EOS ends it)
    dtype_bytes = 4 if run.precision == "fp32" else 2
    per_sentence = kv_cache_bytes(model_cfg, tgt_positions, src_positions, dtype_bytes)
    return {
        "src_positions": src_positions,
        "tgt_positions": tgt_positions,
        "kv_heads": model_cfg.kv_heads or model_cfg.heads,
        "dtype_bytes": dtype_bytes,
        "bytes": per_sentence,
        "beam_size": bench.beam_size,
        "beam_bytes": kv_cache_bytes(model_cfg, tgt_positions, src_positions, dtype_bytes, bench.beam_size),
    }
