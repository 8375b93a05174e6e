"""Decoding with CTranslate2 (the model exported by ``scripts/export_ct2.py``) behind our decoding API.

:class:`CT2Backend` turns source id lists and a :class:`~nmt.config.DecodingConfig` into the same
:class:`~nmt.decoding.Hypothesis` lists as :func:`nmt.decoding.translate_ids`, so the Translator chooses
a backend with one argument (``backend=torch|ct2``). The searches are the same procedure; where
CTranslate2 differs (its length penalty, budget, suppressed tokens, prefixes, blocked n-grams, vocabulary
maps) the backend asks it for all k finished hypotheses, one call per source length, and ranks or scores
them again with ours. Each difference and how it is bridged: docs/decoding.md, "The CTranslate2 backend".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from nmt.config import DecodingConfig
from nmt.ct2.format import file_digest, read_export_info, require_ctranslate2
from nmt.decoding import Backend, Hypothesis, Ids, batch_source_tokens, hypothesis
from nmt.decoding.common import budget_for_source
from nmt.errors import NMTError
from nmt.text.special import BOS_ID, PAD_ID
from nmt.text.tokenizer import Tokenizer

# Scoring on a CPU: at most this many log-probabilities (fp32, 16 MiB) per batch (CT2Backend.score_ids).
SCORE_BATCH_FLOATS = 2**22


def ct2_length_penalty(alpha: float, length: int) -> float:
    """CTranslate2's ``length_penalty`` whose n ** lp grows like GNMT's ((5 + n) / 6) ** alpha at n
    (equal derivatives of the logarithms; n counts EOS in both). Never 0: with 0 CTranslate2 stops a
    sentence as soon as its best beam ends, where ours (and CTranslate2 otherwise) waits for k ends."""
    return max(alpha * length / (length + 5), 1e-6)


def thread_layout(inter: int, intra: int, cores: int) -> tuple[int, int]:
    """CTranslate2's (inter_threads, intra_threads) on ``cores`` cores: the values given, 0 chosen.

    By default one single-threaded translation per core: the calls (one per source length) are many
    and small, and side by side they beat the same calls spread over threads (a tiny model's products
    are too small to share), on 2 cores also one call of every sentence (docs/ctranslate2.md). Given
    one of the two, the other fills the cores."""
    if inter < 0 or intra < 0:
        raise NMTError(f"ct2_inter_threads={inter}, ct2_intra_threads={intra}: must be >= 0 (0 = auto)")
    if inter and intra:
        return inter, intra
    if inter:
        return inter, max(1, cores // inter)
    if intra:
        return max(1, cores // intra), intra
    return cores, 1


def check_export(
    info: dict[str, Any], model_dir: str | Path, tokenizer: Tokenizer, weights: str | None
) -> None:
    """NMTError unless the export (its record ``info``) was made with ``tokenizer`` and, given the
    checkpoint's ``weights`` digest, from that model."""
    if info["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise NMTError(
            f"ct2_model={model_dir} was exported with a different tokenizer than the checkpoint's; "
            "export this checkpoint again (scripts/export_ct2.py)"
        )
    if weights is not None and info.get("weights_sha256") != weights:
        recorded = f"checkpoint {info.get('checkpoint')}, step {info.get('step')}"
        made_from = (
            f"was exported from another model ({recorded})"
            if "weights_sha256" in info
            else "records no model it was exported from (an older export)"
        )
        raise NMTError(
            f"ct2_model={model_dir} {made_from} than the checkpoint's; export this checkpoint again "
            "(scripts/export_ct2.py)"
        )


class CT2Backend(Backend):
    """A CTranslate2 translator over an exported model directory, fed and answering in our token ids."""

    name = "ct2"  # the backend's name (nmt.inference.backends)

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: Tokenizer,
        device: torch.device | str = "cpu",
        inter_threads: int = 0,
        intra_threads: int = 0,
        compute_type: str = "default",
        weights: str | None = None,
        reference: Backend | None = None,
    ):
        """``inter_threads`` translations at a time, each on ``intra_threads`` threads; 0: chosen for the
        cores torch may use (:func:`thread_layout`). ``weights``: the digest of the checkpoint's weights
        (:func:`nmt.checkpoint.weights_digest`), which the export must record (an export that records
        none, from an older nmt, is refused too); None only where the caller exported the model itself.
        ``reference``: backend=torch over the same model, for what CTranslate2 cannot do (an empty
        source with a target prefix, scoring over a shortlist); without it, those are refused."""
        ctranslate2 = require_ctranslate2()
        info = read_export_info(model_dir)
        check_export(info, model_dir, tokenizer, weights)
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise NMTError(f"backend=ct2 runs on cpu or cuda, not {device.type}")
        self.tokenizer, self.max_positions = tokenizer, int(info["max_positions"])
        self.reference = reference
        self.model_dir = Path(model_dir)
        self.vmap: dict[str, Any] | None = info.get("shortlist")  # the shortlist behind its vocabulary map
        self.shortlists: set[str] = set()  # decoding.shortlist files checked against the map
        self.cpu = device.type == "cpu"
        cores = torch.get_num_threads() if device.type == "cpu" else 1
        self.inter_threads, self.intra_threads = thread_layout(inter_threads, intra_threads, cores)
        torch_threads = torch.get_num_threads()
        self.translator = ctranslate2.Translator(
            str(model_dir),
            device=device.type,
            device_index=device.index or 0,
            compute_type=compute_type,
            inter_threads=self.inter_threads,
            intra_threads=self.intra_threads,
        )
        # CTranslate2 sets the calling thread's OpenMP threads to intra_threads, which torch shares
        torch.set_num_threads(torch_threads)
        self.src_pieces = tokenizer.src_pieces(range(tokenizer.src_vocab_size))
        self.pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        self.suppress = [[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]]

    def check_shortlist(self, path: str | None) -> None:
        """``decoding.shortlist=path``: CTranslate2 reads the map from the model directory, so the model
        must have been exported with this shortlist (the same file content); checked once per path."""
        if path is None or path in self.shortlists:
            return
        export = f"export it again with shortlist={path} (scripts/export_ct2.py)"
        if self.vmap is None:
            raise NMTError(
                f"decoding.shortlist={path}: ct2_model={self.model_dir} has no vocabulary map; {export}"
            )
        if not Path(path).is_file():
            raise NMTError(f"shortlist not found: {path}; build it with scripts/build_shortlist.py")
        if file_digest(Path(path)) != self.vmap["sha256"]:
            made_from = f"{self.vmap['file']}, k={self.vmap['k']}, frequent={self.vmap['frequent']}"
            raise NMTError(
                f"decoding.shortlist={path}: the vocabulary map of ct2_model={self.model_dir} was made from "
                f"another shortlist ({made_from}); {export}"
            )
        self.shortlists.add(path)

    def translate_ids(
        self, sources: Ids, cfg: DecodingConfig, progress: bool = False, prefixes: Ids | None = None
    ) -> list[list[Hypothesis]]:
        """Like :func:`nmt.decoding.translate_ids`: the ``cfg.nbest`` best hypotheses per source, each
        the same whichever other sources share the call, each starting with its source's target prefix
        when ``prefixes`` are given (target ids, possibly empty)."""
        if cfg.no_repeat_ngram and cfg.beam_size > 1:
            raise NMTError(
                f"backend=ct2 cannot block repeated n-grams in beam search as backend=torch does "
                f"(decoding.no_repeat_ngram={cfg.no_repeat_ngram}, decoding.beam_size={cfg.beam_size}): "
                "use backend=torch, decoding.beam_size=1 or decoding.no_repeat_ngram=0"
            )
        self.check_shortlist(cfg.shortlist)
        limit = self.max_positions - 1
        sources = [list(s[:limit]) for s in sources]
        forced = [list(p) for p in prefixes] if prefixes is not None else [[] for _ in sources]
        # CTranslate2 skips an empty input, and would return an empty source's prefix as it is
        continued = [i for i, (s, p) in enumerate(zip(sources, forced)) if not s and p]
        found: list[dict[tuple[int, ...], float | None]] = [{} for _ in sources]
        mine = sorted(set(range(len(sources))) - set(continued))
        with tqdm(total=len(mine), disable=not progress, desc="decoding (ct2)", unit="sent") as bar:
            again = self._search(mine, sources, forced, cfg, found, bar, suppress=False)
            self._search(again, sources, forced, cfg, found, bar, suppress=True)
        todo = [(i, ids) for i, hyps in enumerate(found) for ids, log_p in hyps.items() if log_p is None]
        if todo:
            scores = self.score_ids(
                [sources[i] for i, _ in todo], [list(ids) for _, ids in todo], cfg.max_tokens, cfg.shortlist
            )
            for (i, ids), token_scores in zip(todo, scores):
                found[i][ids] = math.fsum(token_scores)
        out = []
        for hyps in found:
            ranked = [hypothesis(list(ids), log_p, cfg) for ids, log_p in hyps.items()]
            out.append(sorted(ranked, key=lambda h: -h.score)[: cfg.nbest])
        if continued:
            what = "an empty source with a target prefix"
            searched = self._reference(what).translate_ids(
                [[] for _ in continued], cfg, prefixes=[forced[i] for i in continued]
            )
            for i, hyps in zip(continued, searched):
                out[i] = hyps
        return out

    def _reference(self, what: str) -> Backend:
        if self.reference is None:
            raise NMTError(
                f"backend=ct2: {what} needs the PyTorch model beside CTranslate2 "
                "(nmt.inference.backends.load_backend)"
            )
        return self.reference

    def _search(
        self,
        which: Sequence[int],
        sources: list[list[int]],
        forced: list[list[int]],
        cfg: DecodingConfig,
        found: list[dict[tuple[int, ...], float | None]],
        bar: tqdm,
        suppress: bool,
    ) -> list[int]:
        """Search the sources ``which`` in one call per source length, into ``found`` (ids -> log-probability,
        None where only the model can tell it); without ``suppress``, returns instead the sentences whose
        hypotheses hold PAD or BOS, to be searched again with them suppressed."""
        groups: dict[int, list[int]] = defaultdict(list)  # source length -> its sentences
        for i in which:
            groups[len(sources[i])].append(i)
        # Every call is queued before any is awaited, so inter_threads > 1 decodes groups side by side;
        # the largest (sentences x length) first, so that no large group is left to run alone at the end.
        order = sorted(groups.values(), key=lambda idx: -len(idx) * len(sources[idx[0]]))
        calls = [
            (idx, *self._submit([sources[i] for i in idx], cfg, [forced[i] for i in idx], suppress))
            for idx in order
        ]
        renormalised = suppress or cfg.no_unk or cfg.no_repeat_ngram > 0  # tokens banned before softmax
        again = []
        for idx, pending, lp, budget in calls:
            for i, result in zip(idx, pending):
                hyps = self._log_probs(result.result(), lp, budget, rescore=renormalised or bool(forced[i]))
                if not suppress and any(PAD_ID in ids or BOS_ID in ids for ids in hyps):
                    again.append(i)
                    continue
                found[i] = hyps
                bar.update(1)
        return again

    def _submit(
        self, sources: list[list[int]], cfg: DecodingConfig, prefixes: list[list[int]], suppress: bool
    ) -> tuple[list[Any], float, int]:
        """Queue the search of sources of one length (each after its target prefix, if any), with the
        length penalty and budget that length gives, PAD and BOS suppressed if ``suppress``; returns the
        pending results (one per source), the penalty and the budget."""
        n = len(sources[0]) + 1  # with EOS; the likely output length is about the source length
        lp = ct2_length_penalty(cfg.alpha, n)
        budget = budget_for_source(len(sources[0]), cfg, self.max_positions - 1)
        pending = self.translator.translate_batch(
            [[self.src_pieces[i] for i in s] for s in sources],
            asynchronous=True,
            beam_size=cfg.beam_size,
            num_hypotheses=cfg.beam_size,  # all finished hypotheses: we rank them (GNMT)
            length_penalty=lp,
            max_decoding_length=budget,  # a hypothesis this long was cut: EOS would have been next
            min_decoding_length=0,
            disable_unk=cfg.no_unk,
            suppress_sequences=self.suppress if suppress else None,
            return_scores=True,
            max_batch_size=batch_source_tokens(cfg),  # CTranslate2's batch size in source tokens
            batch_type="tokens",
            max_input_length=0,
            no_repeat_ngram_size=cfg.no_repeat_ngram,
            use_vmap=cfg.shortlist is not None,
            target_prefix=[[self.pieces[i] for i in p] or None for p in prefixes] if any(prefixes) else None,
        )
        return pending, lp, budget

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
        self, sources: Ids, targets: Ids, max_tokens: int, shortlist: str | None
    ) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and of the EOS that follows, in batches
        of up to ``max_tokens`` tokens; on a CPU also so small that a batch's log-probabilities (tokens x
        target vocabulary floats) fit the cache: on the multi30k_cpu model (8k vocabulary) batches of 512
        tokens score twice as fast as batches of 8,000. With a ``shortlist``, normalised over each
        sentence's candidates as the search is: by the PyTorch model (CTranslate2 scores over the whole
        vocabulary only)."""
        if shortlist is not None:
            return self._reference("scoring over a shortlist").score_ids(
                sources, targets, max_tokens, shortlist
            )
        results = self.translator.score_batch(
            [[self.src_pieces[i] for i in s] for s in sources],
            [[self.pieces[i] for i in t] for t in targets],
            max_batch_size=self.score_batch_tokens(max_tokens),
            batch_type="tokens",
            max_input_length=0,
        )
        return [list(r.log_probs) for r in results]

    def score_batch_tokens(self, max_tokens: int) -> int:
        """Tokens per scoring batch: ``max_tokens``, on a CPU capped to keep the batch's log-probabilities
        within :data:`SCORE_BATCH_FLOATS`."""
        return min(max_tokens, max(1, SCORE_BATCH_FLOATS // len(self.pieces))) if self.cpu else max_tokens
