"""The CTranslate2 part of ``scripts/benchmark.py`` (``bench.ct2=true``): the benchmark's model, exported
once per ``bench.ct2_quantizations`` entry, decodes the same sentences with the same decoding settings
as the PyTorch measurement (greedy and beam search), with as many threads as torch uses.

Reported per setting: sentences/s, target tokens/s, the speed ratio over PyTorch's cached search and
the share of sentences whose best translation equals PyTorch's. A randomly initialised model (no
``bench.checkpoint``) never emits EOS, so every hypothesis reaches the length budget, and the
CTranslate2 backend then rescores all of them with EOS (see :mod:`nmt.ct2.backend`), which a trained
model hardly ever needs: benchmark a checkpoint for representative ratios.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import checkpoint_config, load_checkpoint
from nmt.config import BenchConfig, DecodingConfig, TrainConfig
from nmt.ct2.backend import CT2Backend
from nmt.ct2.export import check_exportable, check_quantization, export_model
from nmt.ct2.format import require_ctranslate2
from nmt.decoding import Hypothesis
from nmt.models import Transformer
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def check_ct2_bench(cfg: TrainConfig, bench: BenchConfig) -> None:
    """Fail before any measurement when the CTranslate2 part cannot run."""
    require_ctranslate2()
    for quantization in bench.ct2_quantizations:
        check_quantization(quantization)
    model_cfg = checkpoint_config(load_checkpoint(bench.checkpoint)).model if bench.checkpoint else cfg.model
    check_exportable(model_cfg)


def measure_ct2(
    model: Transformer,
    tokenizer: Tokenizer,
    sources: Sequence[Sequence[int]],
    decoding: DecodingConfig,
    searches: list[tuple[str, int]],
    torch_runs: dict[str, tuple[float, list[list[Hypothesis]]]],
    bench: BenchConfig,
    device: torch.device,
) -> dict[str, Any]:
    """Time CTranslate2 decoding; ``torch_runs`` maps a search name to PyTorch's (seconds, hypotheses)."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for quantization in bench.ct2_quantizations:
            model_dir = export_model(model, tokenizer, Path(scratch) / quantization, quantization)
            backend = CT2Backend(model_dir, tokenizer, device, threads=torch.get_num_threads())
            for _, beam in searches:  # warm up, as the PyTorch measurement does
                backend.translate_ids(sources[:32], replace(decoding, beam_size=beam, nbest=1))
            for name, beam in searches:
                log.info("decoding %d sentences with CTranslate2 (%s): %s", len(sources), quantization, name)
                settings = replace(decoding, beam_size=beam, nbest=1)
                start = time.perf_counter()
                hyps = backend.translate_ids(sources, settings)
                seconds = time.perf_counter() - start
                torch_seconds, torch_hyps = torch_runs[name]
                same = sum(a[0].tokens == b[0].tokens for a, b in zip(hyps, torch_hyps))
                tokens = sum(len(h[0].tokens) + 1 for h in hyps)  # + EOS
                rows.append(
                    {
                        "quantization": quantization,
                        "search": name,
                        "beam_size": beam,
                        "seconds": seconds,
                        "sentences_per_s": len(sources) / seconds,
                        "tgt_tokens_per_s": tokens / seconds,
                        "speedup_over_torch": torch_seconds / seconds,
                        "same_as_torch": same / len(sources),
                    }
                )
    return {"threads": torch.get_num_threads(), "results": rows}


def format_ct2(ct2: dict[str, Any]) -> list[str]:
    """The CTranslate2 rows of the decoding table."""
    out = [
        f"CTranslate2 ({ct2['threads']} threads) vs PyTorch with the cache",
        f"{'search':<10}{'weights':>14}{'sent/s':>10}{'tok/s':>10}{'seconds':>10}{'speedup':>9}{'same':>8}",
    ]
    for r in ct2["results"]:
        out.append(
            f"{r['search']:<10}{r['quantization']:>14}{r['sentences_per_s']:>10.1f}{r['tgt_tokens_per_s']:>10.0f}"
            f"{r['seconds']:>10.2f}{r['speedup_over_torch']:>8.2f}x{100 * r['same_as_torch']:>7.1f}%"
        )
    return out
