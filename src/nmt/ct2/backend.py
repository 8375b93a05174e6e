"""Decoding with CTranslate2 (the model exported by ``scripts/export_ct2.py``) behind our decoding API.

:class:`CT2Backend` turns source id lists and a :class:`~nmt.config.DecodingConfig` into the same
:class:`~nmt.decoding.Hypothesis` lists as :func:`nmt.decoding.translate_ids`, so the Translator (and
through it evaluation) chooses a backend with one argument (``backend=torch|ct2``).

The searches are the same procedure: greedy, or beam search that keeps the 2k best extensions per
step, finishes those among the first k that end in EOS, and is done with k finished hypotheses or at
the length budget ``max_len_a * src_len + max_len_b``. CTranslate2 has one ``max_decoding_length``
per call: all sentences go in one call (CTranslate2 sorts and batches them itself) with the largest
budget, and the few whose search came within one step of their own budget are searched again, grouped
by budget, which gives what a call with their budget gives (a search that ended earlier never saw the
budget). Both rank beams by plain log-probability and length-normalise only the finished hypotheses.
What differs:

- Length penalty. Ours is GNMT's, ``log P / ((5 + |y|) / 6) ** alpha``; CTranslate2's
  ``length_penalty`` divides by ``|y| ** length_penalty`` (|y| counts EOS in both). No value makes
  them equal, so CTranslate2 returns all k finished hypotheses and they are ranked here with GNMT's
  formula, which gives our result. CTranslate2's own value matters only where more than k hypotheses
  finish in one step: ours keeps the k most probable, CTranslate2 the k best by its normalisation
  (n-best lists can then differ beyond the best). It is set to the value whose penalty grows like
  GNMT's around the likely output length (:func:`ct2_length_penalty`).
  To use an exported model with CTranslate2 directly, ``length_penalty = alpha * n / (n + 5)`` for
  outputs of about n tokens is the closest match.
- Length budget. Ours forces EOS after the budget; CTranslate2 stops there without EOS. The
  hypotheses it cut are rescored here with EOS, as ours ends them, but at the last step CTranslate2
  finishes its k best extensions, not (as ours) every beam, and prefers cut ones (no EOS cost) when
  it keeps k: outputs that reach the budget can differ.
- Suppressed tokens (PAD and BOS always, UNK with ``no_unk``) are removed before CTranslate2's
  softmax and after ours: log-probabilities differ by about the suppressed probability mass
  (1e-3 at most on the toy model), which can flip near-ties.

- Blocked n-grams (``no_repeat_ngram``, CTranslate2's ``no_repeat_ngram_size``): both ban a token that
  would complete an n-gram already in the hypothesis, but CTranslate2 bans it before its softmax, so
  its scores are of the renormalised distribution, where ours (like fairseq's and Hugging Face's) are
  the model's. Greedy search picks the same tokens either way, and its hypotheses are rescored here
  by the model (teacher-forced); beam search would rank beams differently (on a random model 24 of 30
  outputs differ), so ``backend=ct2`` refuses blocking with ``beam_size`` > 1.

``word_reward``, which only matters when finished hypotheses of different lengths are ranked, is
added here when ranking, as in ours.
The returned ``score`` is ours (GNMT plus word reward, from the log-probability), so both backends'
scores compare.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from nmt.config import DecodingConfig
from nmt.ct2.format import read_export_info, require_ctranslate2
from nmt.decoding import Hypothesis, hypothesis
from nmt.errors import NMTError
from nmt.special import BOS_ID, PAD_ID
from nmt.tokenizer import Tokenizer


def ct2_length_penalty(alpha: float, length: int) -> float:
    """CTranslate2's ``length_penalty`` whose n ** lp grows like GNMT's ((5 + n) / 6) ** alpha at n
    (equal derivatives of the logarithms; n counts EOS in both). Never 0: with 0 CTranslate2 stops a
    sentence as soon as its best beam ends, where ours (and CTranslate2 otherwise) waits for k ends."""
    return max(alpha * length / (length + 5), 1e-6)


class CT2Backend:
    """A CTranslate2 translator over an exported model directory, fed and answering in our token ids."""

    name = "ct2"  # the backend's name (nmt.backends)

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: Tokenizer,
        device: torch.device | str = "cpu",
        threads: int = 0,
        compute_type: str = "default",
    ):
        ctranslate2 = require_ctranslate2()
        info = read_export_info(model_dir)
        if info["tokenizer_fingerprint"] != tokenizer.fingerprint:
            raise NMTError(
                f"ct2_model={model_dir} was exported with a different tokenizer than the checkpoint's; "
                "export this checkpoint again (scripts/export_ct2.py)"
            )
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise NMTError(f"backend=ct2 runs on cpu or cuda, not {device.type}")
        self.tokenizer, self.max_positions = tokenizer, int(info["max_positions"])
        self.translator = ctranslate2.Translator(
            str(model_dir),
            device=device.type,
            device_index=device.index or 0,
            compute_type=compute_type,
            intra_threads=threads or torch.get_num_threads(),
        )
        self.pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        self.suppress = [[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]]

    def translate_ids(
        self, sources: Sequence[Sequence[int]], cfg: DecodingConfig, progress: bool = False
    ) -> list[list[Hypothesis]]:
        """Like :func:`nmt.decoding.translate_ids`: the ``cfg.nbest`` best hypotheses per source."""
        if cfg.no_repeat_ngram and cfg.beam_size > 1:
            raise NMTError(
                f"backend=ct2 cannot block repeated n-grams in beam search as backend=torch does "
                f"(decoding.no_repeat_ngram={cfg.no_repeat_ngram}, decoding.beam_size={cfg.beam_size}): "
                "use backend=torch, decoding.beam_size=1 or decoding.no_repeat_ngram=0"
            )
        limit = self.max_positions - 1
        sources = [list(s[:limit]) for s in sources]
        budgets = [_budget(len(s) + 1, cfg, limit) for s in sources]
        results: list[list[Hypothesis]] = [[] for _ in sources]
        redo: dict[int, list[int]] = defaultdict(list)  # length budget -> sentences to search again
        with tqdm(total=len(sources), disable=not progress, desc="decoding (ct2)", unit="sent") as bar:
            if sources:
                longest = max(budgets)
                for i, hyps in enumerate(self._translate(sources, cfg, longest)):
                    if budgets[i] < longest and max(len(h.tokens) for h in hyps) >= budgets[i] - 1:
                        redo[budgets[i]].append(i)
                    else:
                        results[i] = hyps[: cfg.nbest]
                bar.update(len(sources) - sum(map(len, redo.values())))
            for budget, idx in sorted(redo.items()):
                for i, h in zip(idx, self._translate([sources[i] for i in idx], cfg, budget)):
                    results[i] = h[: cfg.nbest]
                bar.update(len(idx))
        return results

    def _translate(
        self, sources: list[list[int]], cfg: DecodingConfig, budget: int
    ) -> list[list[Hypothesis]]:
        """All sources searched with one length budget; every finished hypothesis, best first."""
        # The likely output length is about the source length.
        typical = round(sum(len(s) + 1 for s in sources) / len(sources))
        lp = ct2_length_penalty(cfg.alpha, typical)
        results = self.translator.translate_batch(
            [self.tokenizer.src_pieces(s) for s in sources],
            beam_size=cfg.beam_size,
            num_hypotheses=cfg.beam_size,  # all finished hypotheses: we rank them (GNMT)
            length_penalty=lp,
            max_decoding_length=budget,  # a hypothesis this long was cut: EOS would have been next
            min_decoding_length=0,
            disable_unk=cfg.no_unk,
            suppress_sequences=self.suppress,
            return_scores=True,
            max_batch_size=max(1, cfg.max_tokens // max(cfg.beam_size, 1)),
            batch_type="tokens",
            max_input_length=0,
            no_repeat_ngram_size=cfg.no_repeat_ngram,
        )
        found = [self._log_probs(result, lp, budget, rescore=cfg.no_repeat_ngram > 0) for result in results]
        todo = [(i, ids) for i, hyps in enumerate(found) for ids, log_p in hyps.items() if log_p is None]
        if todo:
            scores = self.score_ids([sources[i] for i, _ in todo], [list(ids) for _, ids in todo])
            for (i, ids), token_scores in zip(todo, scores):
                found[i][ids] = sum(token_scores)
        out = []
        for hyps in found:
            ranked = [hypothesis(list(ids), log_p, cfg) for ids, log_p in hyps.items()]
            out.append(sorted(ranked, key=lambda h: -h.score))
        return out

    def _log_probs(
        self, result, lp: float, budget: int, rescore: bool
    ) -> dict[tuple[int, ...], float | None]:
        """Token ids -> log-probability of one sentence's hypotheses; None where it must be rescored
        (``rescore``: all of them)."""
        hyps: dict[tuple[int, ...], float | None] = {}
        for tokens, score in zip(result.hypotheses, result.scores):
            ids = tuple(self.ids[t] for t in tokens)
            if rescore or len(ids) >= budget or not math.isfinite(score):
                hyps[ids] = None  # cut where ours forces EOS: score it with EOS
            else:
                hyps[ids] = score * (len(ids) + 1) ** lp  # undo CTranslate2's normalisation
        return hyps

    def score_ids(
        self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and of the EOS that follows."""
        results = self.translator.score_batch(
            [self.tokenizer.src_pieces(s) for s in sources],
            [self.tokenizer.tgt_pieces(t) for t in targets],
            max_input_length=0,
        )
        return [list(r.log_probs) for r in results]


def _budget(src_len: int, cfg: DecodingConfig, limit: int) -> int:
    """Output tokens allowed before EOS, as :func:`nmt.decoding.max_lengths` (src_len counts EOS)."""
    return max(1, min(limit, int(cfg.max_len_a * src_len + cfg.max_len_b)))
