"""What a worker process does: load the Translator once (:class:`TranslatorSpec`), then turn each batch of
requests into their answers, already as JSON, so the server's event loop only joins bytes.

A batch is a list of ``(ids, (decoding, attention))``, one per request, all with the same settings; they
are decoded in one search. Each request's answer is a :class:`JobResult`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nmt.config import DecodingConfig
from nmt.devices import select_device
from nmt.translator import Hypothesis, Translator

Item = tuple[list[list[int]], tuple[DecodingConfig, bool]]  # (a request's source ids, its settings)


@dataclass(frozen=True)
class TranslatorSpec:
    """How to build the Translator, in the server and again in each worker process (a Translator holds
    threads and native handles that do not cross processes; these few values do)."""

    checkpoint: Any  # a path, or a list of paths: an ensemble
    device: str = "auto"
    backend: str = "torch"
    ct2_model: str | None = None

    def load(self) -> Translator:
        return Translator.from_checkpoint(
            self.checkpoint, select_device(self.device), backend=self.backend, ct2_model=self.ct2_model
        )


@dataclass
class JobResult:
    """One request's answer: ``translations``, a JSON array of one object per sentence, or None when that
    would take more than the response limit (``size`` says how much it would take) or has a score that
    is not a finite number (``size`` 0), which JSON cannot carry."""

    translations: bytes | None
    size: int
    target_tokens: int  # subwords of the best translations


def load_work(spec: TranslatorSpec, max_bytes: int) -> Callable[[list[Item]], list[JobResult]]:
    """The work function of a worker process (a WorkFactory when bound with functools.partial)."""
    return functools.partial(translate_batch, spec.load(), max_bytes)


def translate_batch(translator: Translator, max_bytes: int, items: list[Item]) -> list[JobResult]:
    """Decode the requests of ``items`` (one decoding setting) in one search; per request, its answer."""
    decoding, attention = items[0][1]
    ids = [s for sources, _ in items for s in sources]
    hyps = translator.search(ids, decoding)
    results, start = [], 0
    for sources, _ in items:
        nbests = hyps[start : start + len(sources)]
        start += len(sources)
        sentences = [
            sentence_result(translator, src, nbest, attention) for src, nbest in zip(sources, nbests)
        ]
        tokens = sum(len(nbest[0].tokens) for nbest in nbests if nbest)
        try:
            body = json.dumps(sentences, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        except ValueError:  # NaN or an infinity among the scores
            results.append(JobResult(None, 0, tokens))
            continue
        results.append(JobResult(body if len(body) <= max_bytes else None, len(body), tokens))
    return results


def sentence_result(
    translator: Translator, src: list[int], nbest: Sequence[Hypothesis], attention: bool
) -> dict[str, Any]:
    texts = translator.texts(nbest)
    result: dict[str, Any] = {
        "text": texts[0] if nbest else "",
        "score": nbest[0].score if nbest else None,
        "log_prob": nbest[0].log_prob if nbest else None,
        "nbest": [{"text": t, "score": h.score, "log_prob": h.log_prob} for t, h in zip(texts, nbest)],
    }
    if attention and nbest:
        cross = translator.attention(src, nbest[0].tokens)
        result["attention"] = {
            "source_tokens": cross.source_tokens,
            "target_tokens": cross.target_tokens,
            "weights": cross.weights.round(decimals=4).tolist(),  # [layer][head][target][source]
        }
    return result
