"""The one interface of a way to decode (``backend=``): what the Translator calls, and what the
CTranslate2 backend asks of our search for what CTranslate2 cannot do. It lives here, below both
:mod:`nmt.inference.backends` and :mod:`nmt.ct2`, so that each implements it and neither copies it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from nmt.config import DecodingConfig
from nmt.decoding.common import Hypothesis

Ids = Sequence[Sequence[int]]  # sentences, each its token ids (no BOS, no EOS)


class Backend(Protocol):
    """What the Translator needs of a backend."""

    name: str  # one of nmt.inference.backends.BACKENDS: in reports, hypothesis names, the service's answers

    def translate_ids(
        self, sources: Ids, cfg: DecodingConfig, progress: bool = False, prefixes: Ids | None = None
    ) -> list[list[Hypothesis]]:
        """The ``cfg.nbest`` best hypotheses of each source, best first, each starting with its
        source's target prefix when ``prefixes`` are given (lists of target ids, possibly empty)."""
        ...

    def check_shortlist(self, path: str | None) -> None:
        """Refuse, before anything is decoded, a ``decoding.shortlist`` this backend cannot decode over."""
        ...

    def score_ids(
        self, sources: Ids, targets: Ids, max_tokens: int, shortlist: str | None
    ) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and of the EOS that follows, in batches
        of up to ``max_tokens`` tokens, normalised as the search normalises: over the whole vocabulary,
        or with ``shortlist`` (``decoding.shortlist``) over each sentence's candidates and the target's
        own tokens (:mod:`nmt.decoding.teacher_forcing`)."""
        ...
