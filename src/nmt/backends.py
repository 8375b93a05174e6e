"""The ways to decode, behind one interface: ``backend=torch`` (our search over the PyTorch model,
:mod:`nmt.decoding`) and ``backend=ct2`` (CTranslate2 over the exported model, :mod:`nmt.ct2.backend`).

The Translator holds one backend and calls its ``translate_ids``; nothing above it branches on which
one runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from nmt.attention_maps import CrossAttention, cross_attention
from nmt.checkpoint import weights_digest
from nmt.config import DecodingConfig, check_choice
from nmt.ct2.backend import CT2Backend
from nmt.decoding import Hypothesis, score_ids, translate_ids
from nmt.errors import NMTError
from nmt.models import Seq2Seq
from nmt.shortlist import Shortlist, load_shortlist
from nmt.tokenizer import Tokenizer

BACKENDS = ("torch", "ct2")  # the backend= choices (nmt.config.InferenceConfig; checked at start)


class Backend(Protocol):
    """What the Translator needs of a backend."""

    name: str  # one of BACKENDS: in reports, hypothesis file names and the service's answers

    def translate_ids(
        self,
        sources: Sequence[Sequence[int]],
        cfg: DecodingConfig,
        progress: bool = False,
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        """The ``cfg.nbest`` best hypotheses of each source, best first, each starting with its
        source's target prefix when ``prefixes`` are given (lists of target ids, possibly empty)."""
        ...

    def check_shortlist(self, path: str | None) -> None:
        """Refuse, before anything is decoded, a ``decoding.shortlist`` this backend cannot decode over."""
        ...

    def score_ids(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        max_tokens: int,
        shortlist: str | None,
    ) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and of the EOS that follows, in batches
        of up to ``max_tokens`` tokens, normalised as the search normalises: over the whole vocabulary,
        or with ``shortlist`` (``decoding.shortlist``) over each sentence's candidates and the target's
        own tokens (:mod:`nmt.decoding.forced`)."""
        ...


class TorchBackend:
    """Our greedy or beam search over the PyTorch model (or an ensemble of models); it also gives the
    cross-attention behind a translation, which CTranslate2 does not."""

    name = "torch"

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        device: torch.device,
        max_positions: int,
        direction: tuple[str, str],
    ):
        """``direction``: the model's (source, target) languages, which a shortlist must be built for."""
        self.model, self.tokenizer, self.device, self.max_positions = model, tokenizer, device, max_positions
        self.direction = direction
        self.shortlists: dict[str, Shortlist] = {}  # by path: each file is read once

    def shortlist(self, path: str | None) -> Shortlist | None:
        """The shortlist ``decoding.shortlist`` names (checked against the tokenizer and the direction),
        read once."""
        if path is None:
            return None
        if path not in self.shortlists:
            self.shortlists[path] = load_shortlist(Path(path), self.tokenizer, self.direction)
        return self.shortlists[path]

    def check_shortlist(self, path: str | None) -> None:
        self.shortlist(path)

    def translate_ids(
        self,
        sources: Sequence[Sequence[int]],
        cfg: DecodingConfig,
        progress: bool = False,
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        shortlist = self.shortlist(cfg.shortlist)
        return translate_ids(
            self.model,
            sources,
            cfg,
            self.device,
            self.max_positions,
            prefixes=prefixes,
            progress=progress,
            shortlist=shortlist,
        )

    def score_ids(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        max_tokens: int,
        shortlist: str | None,
    ) -> list[list[float]]:
        scores = score_ids(
            self.model,
            sources,
            targets,
            self.device,
            self.max_positions,
            max_tokens,
            self.shortlist(shortlist),
        )
        return [s.token_log_probs for s in scores]

    def attention(self, src_ids: list[int], hyp: list[int]) -> CrossAttention:
        """Where the model looks while producing ``hyp`` from ``src_ids`` (an ensemble: its first model)."""
        return cross_attention(self.model, self.tokenizer, src_ids, hyp)


def load_backend(
    name: str,
    ct2_model: str | None,
    model: Seq2Seq,
    tokenizer: Tokenizer,
    device: torch.device,
    max_positions: int,
    direction: tuple[str, str],
    ct2_threads: tuple[int, int] = (0, 0),
) -> Backend:
    """The backend ``backend=name`` asks for: ``model`` (translating ``direction``) searched by us, or
    CTranslate2 over ``ct2_model`` (the directory scripts/export_ct2.py wrote from the same model: its
    weights are checked) with ``ct2_threads`` (inter, intra; 0 = auto)."""
    check_choice("backend", name, BACKENDS)  # a caller's string: scripts' settings are checked at start
    if name == "torch":
        return TorchBackend(model, tokenizer, device, max_positions, direction)
    if not ct2_model:
        raise NMTError("backend=ct2 needs ct2_model=DIR, a directory written by scripts/export_ct2.py")
    reference = TorchBackend(model, tokenizer, device, max_positions, direction)
    return CT2Backend(
        ct2_model, tokenizer, device, *ct2_threads, weights=weights_digest(model), reference=reference
    )
