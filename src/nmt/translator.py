"""Translate raw text with a checkpoint: tokenise, decode in length-sorted batches, detokenise."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, BinaryIO, TextIO

import torch
from matplotlib.figure import Figure

from nmt.attention_maps import HEAD_MODES, attention_map
from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import (
    DecodingConfig,
    DecodingOverrides,
    TrainConfig,
    check_decoding,
    checkpoint_paths,
    merge_decoding,
)
from nmt.ct2.backend import CT2Backend, load_backend
from nmt.decoding import Hypothesis, translate_ids
from nmt.errors import NMTError
from nmt.models import Seq2Seq
from nmt.models.ensemble import Ensemble
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class Translator:
    """Everything needed to translate, rebuilt from one checkpoint file."""

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        cfg: TrainConfig,
        device: torch.device,
        step: int | None = None,
        ct2: CT2Backend | None = None,
    ):
        self.model, self.tokenizer, self.cfg, self.device = model, tokenizer, cfg, device
        self.step = step  # training updates behind the weights, when known
        self.ct2 = ct2  # decode with CTranslate2 instead of the model (backend=ct2)
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
            return cls(
                model, tokenizer, cfg, device, step, load_backend(backend, ct2_model, tokenizer, device)
            )
        if backend != "torch":
            raise NMTError(f"backend={backend} decodes one model: an ensemble needs backend=torch")
        models = [model]
        for path in paths[1:]:
            other, other_tokenizer, other_cfg = model_from_checkpoint(load_checkpoint(path), device)
            if other_tokenizer.fingerprint != tokenizer.fingerprint:
                raise NMTError(
                    f"checkpoint={path} has another vocabulary (SentencePiece model) than {paths[0]}: "
                    "the models of an ensemble must share it"
                )
            models.append(other)
            positions = min(cfg.model.max_positions, other_cfg.model.max_positions)
            cfg = replace(cfg, model=replace(cfg.model, max_positions=positions))
        return cls(Ensemble(models).eval(), tokenizer, cfg, device)

    def decoding_with(
        self, overrides: DecodingOverrides, base: DecodingConfig | None = None
    ) -> DecodingConfig:
        """The checkpoint's (tuned) decoding settings, or ``base``, with what ``overrides`` sets; checked."""
        decoding = merge_decoding(base or self.cfg.decoding, overrides)
        check_decoding(decoding)
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
        sources = [ids[i] for i in todo]
        if self.ct2 is not None:
            results = self.ct2.translate_ids(sources, decoding, progress)
        else:
            max_positions = self.cfg.model.max_positions
            results = translate_ids(
                self.model, sources, decoding, self.device, max_positions, progress=progress
            )
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

    def plot_attention(
        self, text: str, decoding: DecodingConfig, layer: int = -1, heads: str = "mean"
    ) -> tuple[Figure, str]:
        """Translate ``text`` with the model and plot the cross-attention of decoder ``layer`` (negative
        counts from the last): one panel per head (``heads="all"``) or their mean (``"mean"``).
        Returns (figure, translation)."""
        if heads not in HEAD_MODES:
            raise NMTError(f"heads must be one of {HEAD_MODES}, got {heads!r}")
        src_ids = self.encode([text])[0]
        if not src_ids:
            raise NMTError("text is empty: nothing to translate")
        hyp = translate_ids(self.model, [src_ids], decoding, self.device, self.cfg.model.max_positions)[0][0]
        figure = attention_map(self.model, self.tokenizer, src_ids, hyp.tokens, layer, heads)
        return figure, self.tokenizer.decode_tgt([hyp.tokens])[0]


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
