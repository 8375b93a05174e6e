"""Translate raw text with a checkpoint: tokenise, decode in length-sorted batches, detokenise.

The one way in for every caller (scripts, evaluation, the service): the Translator holds the model,
its tokenizer and settings and one backend (:mod:`nmt.backends`), and answers what callers ask of a
model (:meth:`Translator.info`, :meth:`Translator.attention`), so none of them reaches below it.

Besides translating: target prefixes that translations must start with (:meth:`Translator.encode_prefixes`),
the model's score of given translations (:meth:`Translator.score`, one forward pass, no search) and word
alignments read off the cross-attention (:meth:`Translator.align`, :mod:`nmt.alignment`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any, BinaryIO, TextIO

import torch
from tqdm.auto import tqdm

from nmt.alignment import WordAlignment, attention_links, cross_attention_batches, resolve_layer, words
from nmt.attention_maps import CrossAttention
from nmt.backends import Backend, TorchBackend, load_backend
from nmt.checkpoint import Task, check_same_task, load_checkpoint, model_from_checkpoint
from nmt.config import (
    DecodingConfig,
    DecodingOverrides,
    TrainConfig,
    check_decoding,
    checkpoint_paths,
)
from nmt.decoding import Hypothesis, batch_source_tokens, hypothesis, length_sorted_batches
from nmt.decoding.common import budget_for_source
from nmt.devices import usable_cores
from nmt.errors import NMTError
from nmt.models import Seq2Seq, count_parameters
from nmt.models.ensemble import Ensemble
from nmt.tokenizer import Tokenizer

__all__ = [  # what callers get
    "CrossAttention",
    "Hypothesis",
    "Scored",
    "StreamOptions",
    "Translator",
    "WordAlignment",
    "translate_stream",
]

log = logging.getLogger(__name__)


@dataclass
class Scored:
    """A given translation of a source as the model scores it under teacher forcing."""

    log_prob: float  # log P(translation + EOS | source)
    score: float  # the search's ranking score of it: length penalty (decoding.alpha) and word reward
    pieces: list[str]  # its subwords, then </s>
    token_log_probs: list[float]  # the log-probability of each piece

    @property
    def tokens(self) -> int:
        """Its length in subwords, EOS included (the n of the length penalty)."""
        return len(self.pieces)


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
        decodes on the CPU in that many single-threaded processes (:class:`ProcessesBackend`)."""
        check_workers(workers, backend, device)
        paths = checkpoint_paths(checkpoint)
        ckpt = load_checkpoint(paths[0])
        model, tokenizer, cfg = model_from_checkpoint(ckpt, device)
        direction = (cfg.data.src_lang, cfg.data.tgt_lang)
        if len(paths) == 1:
            step = ckpt.get("progress", {}).get("step")
            positions = cfg.model.max_positions
            if workers > 1:
                decoder = ProcessesBackend(
                    model, tokenizer, positions, direction, checkpoint, workers, threads=1
                )
            else:
                decoder = load_backend(
                    backend, ct2_model, model, tokenizer, device, positions, direction, ct2_threads
                )
            return cls(model, tokenizer, cfg, decoder, step)
        if backend != "torch":
            raise NMTError(f"backend={backend} decodes one model: an ensemble needs backend=torch")
        models = [model]
        for path in paths[1:]:
            other, other_tokenizer, other_cfg = model_from_checkpoint(load_checkpoint(path), device)
            check_same_task(
                f"checkpoint={path}",
                Task.of(other_cfg.data.src_lang, other_cfg.data.tgt_lang, other_tokenizer),
                str(paths[0]),
                Task.of(*direction, tokenizer),
                "the models of an ensemble",
            )
            models.append(other)
            positions = min(cfg.model.max_positions, other_cfg.model.max_positions)
            cfg = replace(cfg, model=replace(cfg.model, max_positions=positions))
        ensemble = Ensemble(models).eval()
        positions = cfg.model.max_positions
        if workers > 1:
            decoder = ProcessesBackend(
                ensemble, tokenizer, positions, direction, checkpoint, workers, threads=1
            )
        else:
            decoder = TorchBackend(ensemble, tokenizer, device, positions, direction)
        return cls(ensemble, tokenizer, cfg, decoder)

    def info(self) -> dict[str, Any]:
        """What is translating: the model's settings and size, vocabularies, languages, backend, step."""
        tok = self.tokenizer
        return {
            "model": asdict(self.cfg.model),
            "models": len(self.model.models) if isinstance(self.model, Ensemble) else 1,  # > 1: an ensemble
            "parameters": count_parameters(self.model),
            "vocabulary": {"src": tok.src_vocab_size, "tgt": tok.tgt_vocab_size, "joint": tok.joint},
            "languages": {"src": self.cfg.data.src_lang, "tgt": self.cfg.data.tgt_lang},
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

    def encode(self, lines: Sequence[str], first_line: int = 1) -> list[list[int]]:
        """Source ids, truncated (with a warning naming the input line) to what the model can take."""
        ids = self.tokenizer.encode_src([line.strip() for line in lines])
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
        if len(prefixes) != len(ids):
            raise NMTError(f"{len(prefixes)} target prefixes for {len(ids)} sources: give one per source")
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

    def hypotheses(
        self,
        lines: Sequence[str],
        decoding: DecodingConfig,
        progress: bool = False,
        first_line: int = 1,
        prefixes: Sequence[str] | None = None,
    ) -> list[list[Hypothesis]]:
        """n-best lists of every line (an empty line without a prefix gets an empty list), each starting
        with its line's target prefix when ``prefixes`` are given. ``first_line`` is the input line
        number of ``lines[0]``, for warnings and errors."""
        ids = self.encode(lines, first_line)
        forced = None if prefixes is None else self.encode_prefixes(ids, prefixes, decoding, first_line)
        return self.search(ids, decoding, progress, forced)

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
        return self.best(self.hypotheses(lines, decoding, progress, first_line, prefixes))

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        decoding: DecodingConfig,
        progress: bool = False,
        first_line: int = 1,
    ) -> list[Scored]:
        """The model's score of each target line as the translation of its source line (teacher forcing:
        one forward pass per batch, no search). ``decoding`` gives the score's length penalty and word
        reward, ``max_tokens`` per batch and the normalisation: with ``decoding.shortlist``, that of a
        search over the shortlist (each sentence's candidates and the translation's own subwords), so
        that a translation and the search's output compare."""
        if len(sources) != len(targets):
            raise NMTError(f"{len(targets)} translations for {len(sources)} sources: give one per source")
        return self.score_ids(
            self.encode(sources, first_line), self.encode_targets(targets, first_line), decoding, progress
        )

    def score_ids(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        decoding: DecodingConfig,
        progress: bool = False,
    ) -> list[Scored]:
        """:meth:`score` of encoded pairs: a search's hypothesis scored again gets its log-probability."""
        found: dict[int, Scored] = {}
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
                    found[i] = Scored(log_prob, score, pieces, list(token_log_probs))
                bar.update(len(batch))
        return [found[i] for i in range(len(sources))]

    def best(self, hyps: list[list[Hypothesis]]) -> list[str]:
        """The text of each n-best list's first hypothesis ("" for an empty list: an empty line)."""
        return self.tokenizer.decode_tgt([h[0].tokens if h else [] for h in hyps])

    def texts(self, hyps: Sequence[Hypothesis]) -> list[str]:
        """The text of each hypothesis (e.g. of an n-best list)."""
        return self.tokenizer.decode_tgt([h.tokens for h in hyps])

    @property
    def has_attention(self) -> bool:
        """Whether :meth:`attention` can answer: the torch backend's model can, CTranslate2 cannot."""
        return isinstance(self.backend, TorchBackend)

    def attention(self, source: str | Sequence[int], target: Sequence[int]) -> CrossAttention:
        """Where the model looks (cross-attention of every decoder layer and head) while it produces the
        target ids (a hypothesis' tokens) from ``source``: a line, or its ids from :meth:`encode`. An
        empty source continued from a target prefix has its attention, all of it on the source's EOS."""
        if not isinstance(self.backend, TorchBackend):
            raise NMTError(no_attention(self.backend.name))
        src_ids = self.encode([source])[0] if isinstance(source, str) else list(source)
        if not src_ids and not target:
            raise NMTError("the source is empty: nothing was translated, no attention to show")
        return self.backend.attention(src_ids, list(target))

    def require_attention(self, what: str) -> None:
        """Refuse ``what`` (e.g. ``alignments=true``) up front, before any decoding, when the backend
        has no attention weights."""
        if not self.has_attention:
            raise NMTError(f"{what}: {no_attention(self.backend.name)}")

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
        while predicting it, heads averaged (the reading chosen in docs/alignment.md)."""
        attentions = self.attentions(sources, targets, max_tokens)
        tok, out = self.tokenizer, []
        for source, target, cross in zip(sources, targets, attentions):
            index = resolve_layer(layer, cross.weights.size(0))
            src_pieces, tgt_pieces = cross.source_tokens[:-1], cross.target_tokens[:-1]
            out.append(
                WordAlignment(
                    attention_links(cross.weights[index].mean(dim=0), src_pieces, tgt_pieces, shift=False),
                    words(source, src_pieces, tok.decode_src),
                    words(target, tgt_pieces, tok.decode_tgt),
                )
            )
        return out


@dataclass
class StreamOptions:
    """What :func:`translate_stream` does besides translating each line."""

    prefixes: BinaryIO | None = None  # target prefixes, a line per input line (empty = none)
    prefix_name: str = "prefix_file"  # what errors call ``prefixes``
    alignments: bool = False  # append a tab and the translation's word alignment (Pharaoh i-j)
    alignment_layer: int | None = None  # None: the penultimate decoder layer


def translate_stream(
    translator: Translator,
    source: BinaryIO,
    target: TextIO,
    decoding: DecodingConfig,
    batch_sentences: int,
    name: str = "stdin",
    options: StreamOptions | None = None,
) -> None:
    """Translate ``source`` (bytes, UTF-8, called ``name`` in errors) line by line to ``target``: one
    line at a time when interactive, batches of ``batch_sentences`` otherwise, flushing after each."""
    options = options or StreamOptions()
    interactive = source.isatty()
    size = 1 if interactive else max(1, batch_sentences)
    prefix_lines = _lines(options.prefixes, False, options.prefix_name) if options.prefixes else None
    batch: list[str] = []
    prefixes: list[str] = []
    done = 0  # lines written so far: warnings name input lines, not lines of the batch
    for line in _lines(source, interactive, name):
        batch.append(line)
        if prefix_lines is not None:
            prefix = next(prefix_lines, None)
            if prefix is None:
                raise NMTError(
                    f"{options.prefix_name} has {done + len(batch) - 1} lines, {name} more: "
                    "give a prefix line (empty for none) per input line"
                )
            prefixes.append(prefix)
        if len(batch) >= size:
            _write(target, _translate_lines(translator, batch, prefixes, decoding, done + 1, options))
            done, batch, prefixes = done + len(batch), [], []
    if batch:
        _write(target, _translate_lines(translator, batch, prefixes, decoding, done + 1, options))
        done += len(batch)
    if prefix_lines is not None and next(prefix_lines, None) is not None:
        raise NMTError(f"{options.prefix_name} has more lines than the {done} of {name}")


def _translate_lines(
    translator: Translator,
    lines: list[str],
    prefixes: list[str],
    decoding: DecodingConfig,
    first_line: int,
    options: StreamOptions,
) -> list[str]:
    """The output lines of a batch: each translation, with a tab and its alignment when asked."""
    ids = translator.encode(lines, first_line)
    forced = translator.encode_prefixes(ids, prefixes, decoding, first_line) if options.prefixes else None
    hyps = translator.search(ids, decoding, prefixes=forced)
    texts = translator.best(hyps)
    if not options.alignments:
        return texts
    targets = [h[0].tokens if h else [] for h in hyps]
    aligned = translator.align(ids, targets, options.alignment_layer, decoding.max_tokens)
    return [f"{text}\t{a.pharaoh()}" for text, a in zip(texts, aligned)]


def _lines(source: BinaryIO, interactive: bool, name: str) -> Iterator[str]:
    """Decoded lines; invalid UTF-8 is an error naming the line (SentencePiece would fail obscurely)."""
    number = 0
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = source.readline()
        if not raw:
            return
        number += 1
        try:
            yield raw.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as e:
            raise NMTError(
                f"{name}:{number}: invalid UTF-8 ({e.reason} at byte {e.start} of the line)"
            ) from None


def _write(target: TextIO, lines: list[str]) -> None:
    target.write("".join(line + "\n" for line in lines))
    target.flush()


def merge_decoding(base: DecodingConfig, overrides: DecodingOverrides) -> DecodingConfig:
    """The checkpoint's decoding settings with the overrides that were given."""
    return replace(base, **{k: v for k, v in vars(overrides).items() if v is not None})


def no_attention(backend: str) -> str:
    """The one line refusing attention weights, or the alignments read from them, to ``backend``: only
    the torch backend's model exposes them."""
    return f"the {backend} backend has no attention weights; use backend=torch"


def where(i: int, first_line: int, item: str | None) -> str:
    """How a refusal names the i-th text of a batch: the line of an input file, or a request's ``item[i]``."""
    return f"line {first_line + i}" if item is None else f"{item}[{i}]"


def check_workers(workers: int, backend: str, device: torch.device) -> None:
    """One line for a ``workers`` setting that cannot be: fewer than 1, or several where they do not
    apply (CTranslate2 has its own ``ct2_inter_threads``; a GPU decodes in one process)."""
    if workers < 1:
        raise NMTError(f"workers={workers}: must be >= 1")
    cores = usable_cores()
    if workers > cores:
        raise NMTError(f"workers={workers}: more than the {cores} CPU cores here (each loads the model)")
    if workers > 1 and backend != "torch":
        raise NMTError(
            f"workers={workers} is for backend=torch; backend={backend} decodes in parallel with "
            "ct2_inter_threads"
        )
    if workers > 1 and device.type != "cpu":
        raise NMTError(f"workers={workers} decodes in CPU processes; on device {device.type} use workers=1")


def _decoding_worker(checkpoint: Any, threads: int, conn: Connection) -> None:
    """One of :class:`ProcessesBackend`'s processes: the checkpoint's torch backend on ``threads``
    intra-op threads, decoding the batches it is sent until it is sent None."""
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    try:
        backend = Translator.from_checkpoint(checkpoint, torch.device("cpu")).backend
    except Exception as e:  # the parent raises it, in one line
        conn.send(("error", f"a decoding worker could not load the checkpoint: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the parent has gone (it exited): so do we
            return
        if job is None:
            return
        sources, cfg, prefixes = job
        try:
            conn.send(("done", backend.translate_ids(sources, cfg, prefixes=prefixes)))
        except Exception as e:  # the parent raises it, in one line
            conn.send(("error", f"a decoding worker failed: {e}"))


class ProcessesBackend(TorchBackend):
    """``backend=torch`` decoding in ``workers`` single-threaded processes (``workers=N`` of
    ``translate.py`` and ``evaluate.py``): the search's small matrix products do not share well between
    threads, so on a CPU N processes of one thread decode faster than one process of N threads
    (docs/speed.md). Each process loads the checkpoint once; the length-sorted batches go to whichever
    process is free, and the results come back in input order, the same as decoded here. Scoring
    and attention run in this process, as in :class:`TorchBackend`.

    ``threads`` > 1 (one process of several threads) is for the benchmark that times torch's own
    threads beside CTranslate2: in a process where CTranslate2 has run a team of OpenMP threads,
    torch's intra-op threads then decode 1.3-1.4x slower (docs/speed.md)."""

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        max_positions: int,
        direction: tuple[str, str],
        checkpoint: Any,
        workers: int,
        *,
        threads: int,
    ):
        super().__init__(model, tokenizer, torch.device("cpu"), max_positions, direction)
        context = multiprocessing.get_context("spawn")  # nothing of this process' threads is inherited
        self.conns: list[Connection] = []
        for _ in range(workers):
            mine, theirs = context.Pipe()
            context.Process(target=_decoding_worker, args=(checkpoint, threads, theirs), daemon=True).start()
            self.conns.append(mine)
        for conn in self.conns:
            self._receive(conn)

    def close(self) -> None:
        """Stop the processes (they also stop when this process exits)."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        self.conns = []

    @staticmethod
    def _receive(conn: Connection) -> Any:
        try:
            kind, value = conn.recv()
        except EOFError:
            raise NMTError("a decoding worker process stopped unexpectedly") from None
        if kind == "error":
            raise NMTError(value)
        return value

    def translate_ids(
        self,
        sources: Sequence[Sequence[int]],
        cfg: DecodingConfig,
        progress: bool = False,
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        if not self.conns:
            raise NMTError("the decoding worker processes were closed")
        batches = list(length_sorted_batches([len(s) + 1 for s in sources], batch_source_tokens(cfg)))
        if len(batches) < len(self.conns):  # fewer batches than processes: a share of each length each
            order = [i for batch in batches for i in batch]
            batches = [order[w :: len(self.conns)] for w in range(len(self.conns))]
        results: list[list[Hypothesis]] = [[] for _ in sources]
        todo, busy = iter(batch for batch in batches if batch), {}
        with tqdm(total=len(sources), disable=not progress, desc="decoding", unit="sent") as bar:
            for conn in self.conns:
                self._send(conn, next(todo, None), sources, cfg, prefixes, busy)
            while busy:
                for conn in wait(list(busy)):
                    batch = busy.pop(conn)
                    try:
                        found = self._receive(conn)
                    except NMTError:
                        self._drain(busy)  # so that no stale answer is read by the next call
                        raise
                    for i, hyps in zip(batch, found):
                        results[i] = hyps
                    bar.update(len(batch))
                    self._send(conn, next(todo, None), sources, cfg, prefixes, busy)
        return results

    @staticmethod
    def _drain(busy: dict) -> None:
        """Wait for the answers of the batches still out, and drop them."""
        for conn in busy:
            with contextlib.suppress(EOFError, OSError):
                conn.recv()
        busy.clear()

    @staticmethod
    def _send(
        conn: Connection,
        batch: list[int] | None,
        sources: Sequence[Sequence[int]],
        cfg: DecodingConfig,
        prefixes: Sequence[Sequence[int]] | None,
        busy: dict,
    ) -> None:
        if batch is None:
            return
        forced = [prefixes[i] for i in batch] if prefixes is not None else None
        conn.send(([list(sources[i]) for i in batch], cfg, forced))
        busy[conn] = batch
