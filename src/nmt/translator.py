"""Translate raw text with a checkpoint: tokenise, decode in length-sorted batches, detokenise.

The one way in for every caller (scripts, evaluation, the service): the Translator holds the model,
its tokenizer and settings and one backend (:mod:`nmt.backends`), and answers what callers ask of a
model (:meth:`Translator.info`, :meth:`Translator.attention`), so none of them reaches below it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from typing import Any, BinaryIO, TextIO

import torch

from nmt.attention_maps import CrossAttention
from nmt.backends import Backend, TorchBackend, load_backend
from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import (
    DecodingConfig,
    DecodingOverrides,
    TrainConfig,
    check_decoding,
    checkpoint_paths,
    merge_decoding,
)
from nmt.decoding import Hypothesis
from nmt.errors import NMTError
from nmt.models import Seq2Seq, count_parameters
from nmt.models.ensemble import Ensemble
from nmt.tokenizer import Tokenizer

__all__ = ["CrossAttention", "Hypothesis", "Translator", "translate_stream"]  # what callers get

log = logging.getLogger(__name__)


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

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Any, device: torch.device, backend: str = "torch", ct2_model: str | None = None
    ) -> Translator:
        """A path, or a list of paths: an ensemble, with the first checkpoint's settings (decoding,
        data) and the shortest ``max_positions`` of its models."""
        paths = checkpoint_paths(checkpoint)
        ckpt = load_checkpoint(paths[0])
        model, tokenizer, cfg = model_from_checkpoint(ckpt, device)
        if len(paths) == 1:
            step = ckpt.get("progress", {}).get("step")
            decoder = load_backend(backend, ct2_model, model, tokenizer, device, cfg.model.max_positions)
            return cls(model, tokenizer, cfg, decoder, step)
        if backend != "torch":
            raise NMTError(f"backend={backend} decodes one model: an ensemble needs backend=torch")
        models, direction = [model], (cfg.data.src_lang, cfg.data.tgt_lang)
        for path in paths[1:]:
            other, other_tokenizer, other_cfg = model_from_checkpoint(load_checkpoint(path), device)
            if (other_cfg.data.src_lang, other_cfg.data.tgt_lang) != direction:
                raise NMTError(
                    f"checkpoint={path} translates {other_cfg.data.src_lang}->{other_cfg.data.tgt_lang}, "
                    f"{paths[0]} {direction[0]}->{direction[1]}: the models of an ensemble must translate "
                    "in one direction"
                )
            if other_tokenizer.fingerprint != tokenizer.fingerprint:
                raise NMTError(
                    f"checkpoint={path} has another vocabulary (SentencePiece model) than {paths[0]}: "
                    "the models of an ensemble must share it"
                )
            models.append(other)
            positions = min(cfg.model.max_positions, other_cfg.model.max_positions)
            cfg = replace(cfg, model=replace(cfg.model, max_positions=positions))
        ensemble = Ensemble(models).eval()
        decoder = TorchBackend(ensemble, tokenizer, device, cfg.model.max_positions)
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
        if isinstance(self.backend, TorchBackend):
            self.backend.shortlist(decoding.shortlist)
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
        return [seq[: self.max_source] for seq in ids]

    def hypotheses(
        self, lines: Sequence[str], decoding: DecodingConfig, progress: bool = False, first_line: int = 1
    ) -> list[list[Hypothesis]]:
        """n-best lists of every line (an empty line gets an empty list). ``first_line`` is the input
        line number of ``lines[0]``, for warnings."""
        return self.search(self.encode(lines, first_line), decoding, progress)

    def search(
        self, ids: Sequence[Sequence[int]], decoding: DecodingConfig, progress: bool = False
    ) -> list[list[Hypothesis]]:
        """n-best lists of encoded sources (from :meth:`encode`); an empty source gets an empty list."""
        todo = [i for i, seq in enumerate(ids) if seq]
        out: list[list[Hypothesis]] = [[] for _ in ids]
        results = self.backend.translate_ids([ids[i] for i in todo], decoding, progress)
        for i, hyps in zip(todo, results):
            out[i] = hyps
        return out

    def translate(
        self, lines: Sequence[str], decoding: DecodingConfig, progress: bool = False, first_line: int = 1
    ) -> list[str]:
        """Best translation of every line; empty lines stay empty."""
        return self.best(self.hypotheses(lines, decoding, progress, first_line))

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
        target ids (a hypothesis' tokens) from ``source``: a line, or its ids from :meth:`encode`."""
        if not isinstance(self.backend, TorchBackend):
            raise NMTError(f"the {self.backend.name} backend has no attention weights; use backend=torch")
        src_ids = self.encode([source])[0] if isinstance(source, str) else list(source)
        if not src_ids:
            raise NMTError("the source is empty: nothing was translated, no attention to show")
        return self.backend.attention(src_ids, list(target))


def translate_stream(
    translator: Translator,
    source: BinaryIO,
    target: TextIO,
    decoding: DecodingConfig,
    batch_sentences: int,
    name: str = "stdin",
) -> None:
    """Translate ``source`` (bytes, UTF-8, called ``name`` in errors) line by line to ``target``: one
    line at a time when interactive, batches of ``batch_sentences`` otherwise, flushing after each."""
    interactive = source.isatty()
    size = 1 if interactive else max(1, batch_sentences)
    batch: list[str] = []
    done = 0  # lines written so far: warnings name input lines, not lines of the batch
    for line in _lines(source, interactive, name):
        batch.append(line)
        if len(batch) >= size:
            _write(target, translator.translate(batch, decoding, first_line=done + 1))
            done, batch = done + len(batch), []
    if batch:
        _write(target, translator.translate(batch, decoding, first_line=done + 1))


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
