"""What a worker process does: load the Translator once (:class:`TranslatorSpec`), then turn each batch of
requests into their answers, already as JSON, so the server's event loop only joins bytes.

A batch is a list of ``(ids, settings)``, one per request, all with the same batching key: translations
(:class:`TranslateSettings`) decoded in one search, or translations to score (:class:`ScoreSettings`) in one
forward pass. Each request's answer is a :class:`JobResult`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nmt.config import DecodingConfig
from nmt.devices import select_device
from nmt.errors import NMTError
from nmt.inference.translator import Hypothesis, Translator, WordAlignment, best_tokens
from nmt.serve.limits import search_groups


@dataclass
class TranslateSettings:
    """What ``POST /translate`` asks besides the sentences."""

    decoding: DecodingConfig
    attention: bool = False  # the cross-attention of each chosen translation
    alignments: bool = False  # the word alignment of each chosen translation
    prefixes: list[list[int]] | None = None  # target prefixes (ids), one per sentence of the request
    alignment_layer: int | None = None  # the decoder layer of the alignments (None: the penultimate)


@dataclass
class ScoreSettings:
    """What ``POST /score`` asks besides the sources: the translations to score."""

    decoding: DecodingConfig  # the score's length penalty and word reward
    targets: list[list[int]]  # target ids, one per source of the request
    alignments: bool = False
    alignment_layer: int | None = None


Item = tuple[list[list[int]], TranslateSettings | ScoreSettings]  # (a request's source ids, its settings)


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
    would take more than the response limit (``size`` says how much it would take), has a score that
    is not a finite number (``size`` 0), which JSON cannot carry, or was ``refused``."""

    translations: bytes | None
    size: int
    target_tokens: int  # subwords of the best translations
    refused: str | None = None  # why this request, decoded alone, was refused (an NMTError)


def load_work(
    spec: TranslatorSpec, max_bytes: int, max_search: float
) -> Callable[[list[Item]], list[JobResult]]:
    """The work function of a worker process (a WorkFactory when bound with functools.partial)."""
    return functools.partial(translate_batch, spec.load(), max_bytes, max_search=max_search)


def translate_batch(
    translator: Translator, max_bytes: int, items: list[Item], max_search: float = math.inf
) -> list[JobResult]:
    """Decode the requests of ``items`` (one decoding setting) in one search, or in as few as keep at
    most ``max_search`` bytes each (``serve.max_search_mb``), or score them (:func:`score_batch`); per
    request, its answer. When the batch is refused (NMTError), each request is done again alone, so
    that only the one at fault gets the refusal (``JobResult.refused``)."""
    try:
        return batch_results(translator, max_bytes, items, max_search)
    except NMTError:
        if len(items) == 1:
            raise
    results = []
    for item in items:
        try:
            results += batch_results(translator, max_bytes, [item], max_search)
        except NMTError as e:
            results.append(JobResult(None, 0, 0, refused=str(e)))
    return results


def batch_results(
    translator: Translator, max_bytes: int, items: list[Item], max_search: float
) -> list[JobResult]:
    settings = items[0][1]
    if isinstance(settings, ScoreSettings):
        return score_batch(translator, max_bytes, items)
    decoding, attention = settings.decoding, settings.attention
    ids = [s for sources, _ in items for s in sources]
    prefixes = None
    if any(s.prefixes for _, s in items):
        prefixes = [p for sources, s in items for p in (s.prefixes or [[] for _ in sources])]
    hyps = search_within(translator, ids, decoding, prefixes, max_search)
    aligned = None
    if settings.alignments:
        aligned = translator.align(ids, best_tokens(hyps), settings.alignment_layer, decoding.max_tokens)
    results, start = [], 0
    for sources, _ in items:
        nbests = hyps[start : start + len(sources)]
        links = aligned[start : start + len(sources)] if aligned is not None else [None] * len(sources)
        start += len(sources)
        sentences = [
            sentence_result(translator, src, nbest, attention, a)
            for src, nbest, a in zip(sources, nbests, links)
        ]
        tokens = sum(len(nbest[0].tokens) for nbest in nbests if nbest)
        results.append(json_result(sentences, max_bytes, tokens))
    return results


def search_within(
    translator: Translator,
    ids: list[list[int]],
    decoding: DecodingConfig,
    prefixes: list[list[int]] | None,
    max_bytes: float,
) -> list[list[Hypothesis]]:
    """``translator.search`` of ``ids``, in groups of sentences whose search state together is within
    ``max_bytes`` (:func:`~nmt.serve.limits.search_groups`): a request of many sentences at a large
    beam is searched a part at a time. The search decodes each sentence as it would alone, up to float
    rounding: float32 kernels sum in an order that depends on the batch's shape (its rows, its padded
    length), so scores agree within rounding and a translation can change only at a tie within it."""
    groups = search_groups(translator.search_bytes(ids, decoding), max_bytes)
    if len(groups) <= 1:
        return translator.search(ids, decoding, prefixes=prefixes)
    hyps: list[list[Hypothesis]] = [[] for _ in ids]
    for group in groups:
        part = [prefixes[i] for i in group] if prefixes is not None else None
        for i, found in zip(group, translator.search([ids[i] for i in group], decoding, prefixes=part)):
            hyps[i] = found
    return hyps


def score_batch(translator: Translator, max_bytes: int, items: list[Item]) -> list[JobResult]:
    """Score the translations of the requests of ``items`` (one decoding setting) together; per request,
    a list of ``{"log_prob", "score", "tokens", "pieces", "token_log_probs"}`` (and ``alignment``)."""
    settings = [s for _, s in items]
    decoding, alignments = settings[0].decoding, settings[0].alignments
    ids = [s for sources, _ in items for s in sources]
    targets = [t for s in settings for t in s.targets]
    scored = translator.score_ids(ids, targets, decoding)
    layer = settings[0].alignment_layer
    aligned = translator.align(ids, targets, layer, decoding.max_tokens) if alignments else None
    results, start = [], 0
    for sources, _ in items:
        answers = []
        for i in range(start, start + len(sources)):
            s = scored[i]
            answer = {"log_prob": s.log_prob, "score": s.score, "tokens": s.tokens}
            answer |= {"pieces": s.pieces, "token_log_probs": s.token_log_probs}
            if aligned is not None:
                answer["alignment"] = alignment_result(aligned[i])
            answers.append(answer)
        start += len(sources)
        results.append(json_result(answers, max_bytes, 0))
    return results


def json_result(sentences: list[dict[str, Any]], max_bytes: int, tokens: int) -> JobResult:
    try:
        body = json.dumps(sentences, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:  # NaN or an infinity among the scores
        return JobResult(None, 0, tokens)
    return JobResult(body if len(body) <= max_bytes else None, len(body), tokens)


def alignment_result(alignment: WordAlignment) -> dict[str, Any]:
    return {
        "source_words": alignment.source_words,
        "target_words": alignment.target_words,
        "links": [list(link) for link in alignment.links],  # [source word, target word], from 0
    }


def sentence_result(
    translator: Translator,
    src: list[int],
    nbest: Sequence[Hypothesis],
    attention: bool,
    alignment: WordAlignment | None = None,
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
    if alignment is not None and nbest:
        result["alignment"] = alignment_result(alignment)
    return result
