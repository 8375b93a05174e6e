"""Translate raw text with a checkpoint: tokenise, decode in length-sorted batches, detokenise.

The one way in for every caller (scripts, evaluation, streaming, the service): the Translator holds the
model (:mod:`nmt.inference.loading`), its tokenizer and settings and one backend
(:mod:`nmt.inference.backends`), and answers what callers ask of a model (:meth:`Translator.info`,
:meth:`Translator.attention`), so none of them reaches below it. Text becomes translations on one path,
:meth:`Translator.translations`.

Besides translating: target prefixes that translations must start with (:meth:`Translator.encode_prefixes`),
the model's score of given translations (:meth:`Translator.score`, one forward pass, no search) and word
alignments read off the cross-attention (:meth:`Translator.align`, :mod:`nmt.analysis.word_alignment`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from tqdm.auto import tqdm

from nmt.analysis.cross_attention import CrossAttention
from nmt.analysis.word_alignment import (
    WordAlignment,
    attention_links,
    cross_attention_batches,
    resolve_layer,
    words,
)
from nmt.checkpoint import checkpoint_config, load_checkpoint
from nmt.config import (
    DecodingConfig,
    DecodingOverrides,
    TrainConfig,
    check_decoding,
    checkpoint_paths,
    directions_of,
)
from nmt.decoding import Hypothesis, hypothesis, length_sorted_batches
from nmt.decoding.common import budget_for_source
from nmt.errors import NMTError, count_mismatch
from nmt.inference.backends import Backend, TorchBackend, check_backend, no_attention, open_backend
from nmt.inference.loading import load_models
from nmt.models import Seq2Seq, count_parameters
from nmt.models.ensemble import Ensemble
from nmt.text.tags import choose_target, refuse_tags, tagged, target_languages
from nmt.text.tokenizer import Tokenizer

__all__ = [  # what callers get
    "CrossAttention",
    "Hypothesis",
    "ScoredTranslation",
    "Translations",
    "Translator",
    "WordAlignment",
    "best_tokens",
    "trained_directions",
]

log = logging.getLogger(__name__)


@dataclass
class ScoredTranslation:
    """A given translation of a source as the model scores it under teacher forcing."""

    log_prob: float  # log P(translation + EOS | source)
    score: float  # the search's ranking score of it: length penalty (decoding.alpha) and word reward
    pieces: list[str]  # its subwords, then </s>
    token_log_probs: list[float]  # the log-probability of each piece

    @property
    def tokens(self) -> int:
        """Its length in subwords, EOS included (the n of the length penalty)."""
        return len(self.pieces)


def best_tokens(nbest: Sequence[Sequence[Hypothesis]]) -> list[list[int]]:
    """The target ids (no EOS) of each n-best list's first hypothesis; none for an empty list."""
    return [hyps[0].tokens if hyps else [] for hyps in nbest]


@dataclass
class Translations:
    """Lines as the search left them: what evaluation and the streaming translator write out."""

    sources: list[list[int]]  # each line's source ids, as the model read them (:meth:`Translator.encode`)
    nbest: list[list[Hypothesis]]  # each line's n-best list, best first; empty for an empty line
    texts: list[str]  # each line's best translation ("" for an empty line)

    @property
    def best_tokens(self) -> list[list[int]]:
        """The target ids of each best translation, e.g. to align it with its source."""
        return best_tokens(self.nbest)


# An input line with this share of characters the source vocabulary cannot spell is warned about; the
# first UNFAMILIAR_WARNINGS such lines are named, then one line says more came (a file of them, one line).
UNFAMILIAR_SHARE = 0.1
UNFAMILIAR_WARNINGS = 3


class Translator:
    """Everything needed to translate, rebuilt from one checkpoint file (or several: an ensemble)."""

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        cfg: TrainConfig,
        backend: Backend,
        step: int | None = None,
    ):
        self.model, self.tokenizer, self.cfg, self.backend = model, tokenizer, cfg, backend
        self.step = step  # training updates behind the weights, when known
        self.max_source = cfg.model.max_positions - 1  # room for EOS
        self._unfamiliar_lines = 0  # inputs warned about as unlike the training text (a few, then quiet)
        self.directions = directions_of(cfg.data)  # trained; several: a multilingual, tagged model
        self.multilingual = cfg.data.source == "multi"
        self.target_lang: str | None = None  # the tag put on every input when none is asked for

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Any,
        device: torch.device,
        backend: str = "torch",
        ct2_model: str | None = None,
        ct2_threads: tuple[int, int] = (0, 0),
        workers: int = 1,
    ) -> Translator:
        """A path, or a list of paths: an ensemble, with the first checkpoint's settings (decoding,
        data) and the shortest ``max_positions`` of its models. ``workers`` > 1: ``backend=torch``
        decodes on the CPU in that many single-threaded processes (:mod:`nmt.inference.backends`)."""
        check_backend(backend, workers, device, len(checkpoint_paths(checkpoint)))
        loaded = load_models(checkpoint, device)
        decoder = open_backend(loaded, backend, device, ct2_model, ct2_threads, workers)
        return cls(loaded.model, loaded.tokenizer, loaded.cfg, decoder, loaded.step)

    def info(self) -> dict[str, Any]:
        """What is translating: the model's settings and size, vocabularies, languages, backend, step."""
        tok = self.tokenizer
        return {
            "model": asdict(self.cfg.model),
            "models": len(self.model.models) if isinstance(self.model, Ensemble) else 1,  # > 1: an ensemble
            "parameters": count_parameters(self.model),
            "vocabulary": {"src": tok.src_vocab_size, "tgt": tok.tgt_vocab_size, "joint": tok.joint},
            "languages": {"src": self.cfg.data.src_lang, "tgt": self.cfg.data.tgt_lang},
            "directions": [f"{s}-{t}" for s, t in self.directions],
            "multilingual": self.multilingual,
            "target_languages": target_languages(self.directions),
            "target_lang": self.target_lang,  # the one an input without target_lang goes into, if any
            "backend": self.backend.name,
            "step": self.step,
        }

    def decoding_with(
        self, overrides: DecodingOverrides, base: DecodingConfig | None = None
    ) -> DecodingConfig:
        """The checkpoint's (tuned) decoding settings, or ``base``, with what ``overrides`` sets; checked
        (a shortlist is read here, once, so that a wrong one fails before anything is decoded)."""
        decoding = merge_decoding(base or self.cfg.decoding, overrides)
        check_decoding(decoding)
        self.backend.check_shortlist(decoding.shortlist)
        return decoding

    def choose_target(
        self, tgt_lang: str | None, src_lang: str | None = None, zero_shot: bool = False
    ) -> str:
        """The target language of what follows (``tgt_lang=``, mapped to the model's code: see
        :func:`nmt.text.tags.choose_target`): kept as the default of :meth:`encode`. A bilingual model takes
        its own target language only."""
        lang = choose_target(self.directions, tgt_lang, src_lang, zero_shot)
        self.target_lang = lang if self.multilingual else None
        return lang

    def direction(
        self, tgt_lang: str | None, src_lang: str | None = None, zero_shot: bool = False
    ) -> tuple[str, str]:
        """:meth:`choose_target`, with the source language: ``src_lang``, else the one the model
        translates from into that target (several: refused in one line naming them)."""
        lang = self.choose_target(tgt_lang, src_lang, zero_shot)
        if src_lang:
            return src_lang, lang
        sources = [s for s, t in self.directions if t == lang]
        if len(sources) > 1:
            raise NMTError(f"src_lang: the model translates into {lang} from {', '.join(sources)}; name one")
        return sources[0], lang

    def source_texts(
        self, lines: Sequence[str], first_line: int = 1, tgt_lang: str | None = None
    ) -> list[str]:
        """The lines as the model reads them: tagged with the target language (``tgt_lang``, else the
        chosen one) when it has several; refused when a bilingual model's input has a tag."""
        texts = [line.strip() for line in lines]
        if not self.multilingual:
            refuse_tags(texts, first_line)
            return texts
        lang = self.target_lang if tgt_lang is None else choose_target(self.directions, tgt_lang)
        if lang is None:
            lang = choose_target(self.directions, None)  # one target language; several: refused
        return tagged(lang, texts)

    def encode(
        self, lines: Sequence[str], first_line: int = 1, tgt_lang: str | None = None
    ) -> list[list[int]]:
        """Source ids, truncated (with a warning naming the input line) to what the model can take."""
        ids = self.tokenizer.encode_src(self.source_texts(lines, first_line, tgt_lang))
        for i, seq in enumerate(ids):
            if len(seq) > self.max_source:
                log.warning(
                    "line %d: %d subwords, truncated to the model's limit of %d",
                    first_line + i,
                    len(seq),
                    self.max_source,
                )
        for i, line in enumerate(lines):
            self._warn_if_unfamiliar(line, first_line + i)
        return [seq[: self.max_source] for seq in ids]

    def _warn_if_unfamiliar(self, line: str, number: int) -> None:
        """Warn (the translation still goes out) when UNFAMILIAR_SHARE or more of a line's characters are
        outside the source vocabulary's alphabet: they become <unk>, and text in another language or script
        than the model's source gets a confident translation of nothing (English into the toy model)."""
        if self._unfamiliar_lines > UNFAMILIAR_WARNINGS:
            return
        chars = [c for c in line if not c.isspace()]
        alphabet = self.tokenizer.src_alphabet
        count = sum(c not in alphabet for c in chars)
        if not chars or count < UNFAMILIAR_SHARE * len(chars):
            return
        unknown = sorted({c for c in chars if c not in alphabet})
        self._unfamiliar_lines += 1
        if self._unfamiliar_lines > UNFAMILIAR_WARNINGS:
            log.warning("more lines like it: not reported")
            return
        data = self.cfg.data
        log.warning(
            "line %d: %d of its %d characters (%s) are not in the model's source vocabulary and become "
            "<unk>: is it %s text? The model translates %s -> %s",
            number,
            count,
            len(chars),
            " ".join(unknown[:10]) + (" ..." if len(unknown) > 10 else ""),
            data.src_lang,
            data.src_lang,
            data.tgt_lang,
        )

    def encode_targets(
        self, lines: Sequence[str], first_line: int = 1, what: str = "translation", item: str | None = None
    ) -> list[list[int]]:
        """Target ids of given text (translations to score, prefixes to force), without EOS. Text with
        more subwords than the model can emit is refused in one line naming the input line (or, with
        ``item``, the element ``item[i]`` of a request's list)."""
        ids = self.tokenizer.encode_tgt([line.strip() for line in lines])
        for i, seq in enumerate(ids):
            if len(seq) > self.max_source:
                raise NMTError(
                    f"{where(i, first_line, item)}: the {what} has {len(seq)} subwords; "
                    f"the model emits at most {self.max_source}"
                )
        return ids

    def encode_prefixes(
        self,
        ids: Sequence[Sequence[int]],
        prefixes: Sequence[str],
        decoding: DecodingConfig,
        first_line: int = 1,
        item: str | None = None,
    ) -> list[list[int]]:
        """The target prefix of each encoded source ("" = none) as target subwords without EOS, so that
        the search continues the text rather than ends it. A prefix longer than the source's output
        budget is refused in one line naming the input line (or ``item[i]``, as ``encode_targets``)."""
        if mismatch := count_mismatch(len(prefixes), len(ids), "target prefixes", "source"):
            raise NMTError(mismatch)
        out = self.encode_targets(prefixes, first_line, "target prefix", item)
        for i, (source, prefix) in enumerate(zip(ids, out)):
            budget = budget_for_source(len(source), decoding, self.max_source)
            if len(prefix) > budget:
                raise NMTError(
                    f"{where(i, first_line, item)}: the target prefix has {len(prefix)} subwords, more "
                    f"than the {budget} the output may have (decoding.max_len_a * (source subwords + 1) + "
                    "decoding.max_len_b)"
                )
        return out

    def translations(
        self,
        lines: Sequence[str],
        decoding: DecodingConfig,
        progress: bool = False,
        first_line: int = 1,
        prefixes: Sequence[str] | None = None,
    ) -> Translations:
        """The one path from text to translations: :meth:`encode`, :meth:`encode_prefixes` (when
        ``prefixes`` are given), :meth:`search`, the best of each n-best list. ``first_line`` is the
        input line number of ``lines[0]``, for warnings and errors. (The service runs the same steps,
        encoding as requests come and searching many requests' sources at once.)"""
        ids = self.encode(lines, first_line)
        forced = None if prefixes is None else self.encode_prefixes(ids, prefixes, decoding, first_line)
        nbest = self.search(ids, decoding, progress, forced)
        return Translations(ids, nbest, self.best(nbest))

    def search(
        self,
        ids: Sequence[Sequence[int]],
        decoding: DecodingConfig,
        progress: bool = False,
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        """n-best lists of encoded sources (from :meth:`encode`); an empty source gets an empty list,
        unless it has a target prefix (from :meth:`encode_prefixes`), which every hypothesis starts with."""
        todo = [i for i, seq in enumerate(ids) if seq or (prefixes is not None and prefixes[i])]
        out: list[list[Hypothesis]] = [[] for _ in ids]
        sources = [ids[i] for i in todo]
        if prefixes is None:
            results = self.backend.translate_ids(sources, decoding, progress)
        else:
            forced = [prefixes[i] for i in todo]
            results = self.backend.translate_ids(sources, decoding, progress, prefixes=forced)
        for i, hyps in zip(todo, results):
            out[i] = hyps
        return out

    def search_bytes(self, ids: Sequence[Sequence[int]], decoding: DecodingConfig) -> list[int]:
        """Per encoded source, the bytes of the decoding state its search keeps at most under ``decoding``
        (a Transformer's key/value caches: ``beam_size`` hypotheses over the longest output the length
        budget allows): what a service sums over a batch to bound a search's memory. The PyTorch
        model's, whichever backend decodes (CTranslate2's own state is of the same shapes)."""
        sizes = []
        for seq in ids:
            src = min(len(seq), self.max_source)
            budget = budget_for_source(src, decoding, self.max_source)
            sizes.append(self.model.search_bytes(src + 1, budget + 1, decoding.beam_size))  # +EOS; +BOS
        return sizes

    def translate(
        self,
        lines: Sequence[str],
        decoding: DecodingConfig,
        progress: bool = False,
        first_line: int = 1,
        prefixes: Sequence[str] | None = None,
    ) -> list[str]:
        """Best translation of every line (starting with its prefix, if given); empty lines stay empty."""
        return self.translations(lines, decoding, progress, first_line, prefixes).texts

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        decoding: DecodingConfig,
        progress: bool = False,
        first_line: int = 1,
    ) -> list[ScoredTranslation]:
        """The model's score of each target line as the translation of its source line (teacher forcing:
        one forward pass per batch, no search). ``decoding`` gives the score's length penalty and word
        reward, ``max_tokens`` per batch and the normalisation: with ``decoding.shortlist``, that of a
        search over the shortlist (each sentence's candidates and the translation's own subwords), so
        that a translation and the search's output compare."""
        if mismatch := count_mismatch(len(targets), len(sources), "translations", "source"):
            raise NMTError(mismatch)
        return self.score_ids(
            self.encode(sources, first_line), self.encode_targets(targets, first_line), decoding, progress
        )

    def score_ids(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        decoding: DecodingConfig,
        progress: bool = False,
    ) -> list[ScoredTranslation]:
        """:meth:`score` of encoded pairs: a search's hypothesis scored again gets its log-probability."""
        found: dict[int, ScoredTranslation] = {}
        lengths = [len(s) + len(t) + 2 for s, t in zip(sources, targets)]
        with tqdm(total=len(sources), disable=not progress, desc="scoring", unit="sent") as bar:
            for batch in length_sorted_batches(lengths, decoding.max_tokens):
                terms = self.backend.score_ids(
                    [sources[i] for i in batch],
                    [targets[i] for i in batch],
                    decoding.max_tokens,
                    decoding.shortlist,
                )
                for i, token_log_probs in zip(batch, terms):
                    log_prob = math.fsum(token_log_probs)
                    score = hypothesis(list(targets[i]), log_prob, decoding).score
                    pieces = [*self.tokenizer.tgt_pieces(targets[i]), "</s>"]
                    found[i] = ScoredTranslation(log_prob, score, pieces, list(token_log_probs))
                bar.update(len(batch))
        return [found[i] for i in range(len(sources))]

    def best(self, hyps: Sequence[Sequence[Hypothesis]]) -> list[str]:
        """The text of each n-best list's first hypothesis ("" for an empty list: an empty line)."""
        return self.tokenizer.decode_tgt(best_tokens(hyps))

    def texts(self, hyps: Sequence[Hypothesis]) -> list[str]:
        """The text of each hypothesis (e.g. of an n-best list)."""
        return self.tokenizer.decode_tgt([h.tokens for h in hyps])

    @property
    def missing_attention(self) -> str | None:
        """Why :meth:`attention` cannot answer, in the one line that refuses it (None: it can): the torch
        backend's model has attention weights, CTranslate2's has none to give."""
        return None if isinstance(self.backend, TorchBackend) else no_attention(self.backend.name)

    @property
    def has_attention(self) -> bool:
        """Whether :meth:`attention` (and so :meth:`align`) can answer."""
        return self.missing_attention is None

    def attention(self, source: str | Sequence[int], target: Sequence[int]) -> CrossAttention:
        """Where the model looks (cross-attention of every decoder layer and head) while it produces the
        target ids (a hypothesis' tokens) from ``source``: a line, or its ids from :meth:`encode`. An
        empty source continued from a target prefix has its attention, all of it on the source's EOS."""
        if self.missing_attention:
            raise NMTError(self.missing_attention)
        src_ids = self.encode([source])[0] if isinstance(source, str) else list(source)
        if not src_ids and not target:
            raise NMTError("the source is empty: nothing was translated, no attention to show")
        return self.backend.attention(src_ids, list(target))

    def require_attention(self, what: str) -> None:
        """Refuse ``what`` (e.g. ``alignments=true``) up front, before any decoding, when the backend
        has no attention weights."""
        if self.missing_attention:
            raise NMTError(f"{what}: {self.missing_attention}")

    def check_alignment_layer(self, layer: int | None) -> None:
        """Refuse ``alignment_layer`` (NMTError, one line) when the model has no such decoder layer,
        before anything is decoded; a backend without attention weights gives no alignments to check."""
        if self.has_attention:
            resolve_layer(layer, self.attentions([[]], [[]], 1)[0].weights.size(0))

    def attentions(
        self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], max_tokens: int
    ) -> list[CrossAttention]:
        """:meth:`attention` of many (source, target) id pairs, in batches of about ``max_tokens``."""
        self.require_attention("attention")
        weights = cross_attention_batches(self.model, sources, targets, max_tokens)
        tok = self.tokenizer
        return [
            CrossAttention(w, [*tok.src_pieces(s), "</s>"], [*tok.tgt_pieces(t), "</s>"])
            for w, s, t in zip(weights, sources, targets)
        ]

    def align(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        layer: int | None,
        max_tokens: int,
    ) -> list[WordAlignment]:
        """The word alignment of each (source, target) id pair, a translation or a given one: for each
        target word, the source word that decoder ``layer`` (None: the penultimate) attends to most
        while predicting it, heads averaged (the reading chosen in docs/alignment.md). A multilingual
        model's tag is left out: the words are those of the input."""
        attentions = self.attentions(sources, targets, max_tokens)
        tok, out = self.tokenizer, []
        skip = 1 if self.multilingual else 0  # the target-language tag first: no word of the input
        for source, target, cross in zip(sources, targets, attentions):
            index = resolve_layer(layer, cross.weights.size(0))
            src_pieces, tgt_pieces = cross.source_tokens[skip:-1], cross.target_tokens[:-1]
            weights = cross.weights[index].mean(dim=0)[:, skip:]
            out.append(
                WordAlignment(
                    attention_links(weights, src_pieces, tgt_pieces, shift=False),
                    words(source[skip:], src_pieces, tok.decode_src),
                    words(target, tgt_pieces, tok.decode_tgt),
                )
            )
        return out


def merge_decoding(base: DecodingConfig, overrides: DecodingOverrides) -> DecodingConfig:
    """The checkpoint's decoding settings with the overrides that were given."""
    return replace(base, **{k: v for k, v in vars(overrides).items() if v is not None})


def where(i: int, first_line: int, item: str | None) -> str:
    """How a refusal names the i-th text of a batch: the line of an input file, or a request's ``item[i]``."""
    return f"line {first_line + i}" if item is None else f"{item}[{i}]"


def trained_directions(checkpoint: Any) -> list[tuple[str, str]]:
    """The directions a checkpoint (an ensemble's first) was trained on, from its config alone."""
    return directions_of(checkpoint_config(load_checkpoint(checkpoint_paths(checkpoint)[0])).data)
