"""The ways to decode, behind one interface: ``backend=torch`` (our search over the PyTorch model,
:mod:`nmt.decoding`), the same in ``workers`` CPU processes (:class:`ProcessesBackend`), and
``backend=ct2`` (CTranslate2 over the exported model, :mod:`nmt.ct2.backend`).

The Translator holds one backend and calls its ``translate_ids``; nothing above it branches on which
one runs. :func:`open_backend` picks it from the settings.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from nmt.analysis.cross_attention import CrossAttention, cross_attention
from nmt.checkpoint import weights_digest
from nmt.config import DecodingConfig, InferenceConfig, check_choice, choices_of
from nmt.ct2.backend import CT2Backend
from nmt.decoding import (
    Backend,
    Hypothesis,
    Ids,
    batch_source_tokens,
    length_sorted_batches,
    score_ids,
    translate_ids,
)
from nmt.decoding.shortlist import Shortlist, load_shortlist
from nmt.devices import usable_cores
from nmt.errors import NMTError
from nmt.inference.loading import LoadedModels, load_models
from nmt.models import Seq2Seq
from nmt.text.tokenizer import Tokenizer

BACKENDS = choices_of(InferenceConfig, "backend")


class TorchBackend(Backend):
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
        self, sources: Ids, cfg: DecodingConfig, progress: bool = False, prefixes: Ids | None = None
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
        self, sources: Ids, targets: Ids, max_tokens: int, shortlist: str | None
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


def open_backend(
    loaded: LoadedModels,
    name: str,
    device: torch.device,
    ct2_model: str | None = None,
    ct2_threads: tuple[int, int] = (0, 0),
    workers: int = 1,
) -> Backend:
    """The backend that ``backend=name`` and ``workers`` ask for over ``loaded`` (checked beforehand with
    :func:`check_backend`): ``workers`` > 1 decodes with ``backend=torch`` on the CPU in that many
    single-threaded processes, each loading ``loaded``'s checkpoints."""
    positions = loaded.cfg.model.max_positions
    if workers > 1:
        return ProcessesBackend(
            loaded.model, loaded.tokenizer, positions, loaded.direction, loaded.paths, workers, threads=1
        )
    return load_backend(
        name, ct2_model, loaded.model, loaded.tokenizer, device, positions, loaded.direction, ct2_threads
    )


def no_attention(backend: str) -> str:
    """The one line refusing attention weights, or the alignments read from them, to ``backend``: only
    the torch backend's model exposes them (:attr:`nmt.inference.translator.Translator.missing_attention`)."""
    return f"the {backend} backend has no attention weights; use backend=torch"


def check_backend(backend: str, workers: int, device: torch.device, models: int) -> None:
    """One line, before any model is loaded, for settings no backend decodes with: ``workers`` fewer than
    1, or several where they do not apply (CTranslate2 has its own ``ct2_inter_threads``; a GPU decodes
    in one process); an ensemble of ``models`` > 1 with a backend that decodes one model."""
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
    if models > 1 and backend != "torch":
        raise NMTError(f"backend={backend} decodes one model: an ensemble needs backend=torch")


def _decoding_worker(checkpoint: Any, threads: int, conn: Connection) -> None:
    """One of :class:`ProcessesBackend`'s processes: the checkpoint's torch backend on ``threads``
    intra-op threads, decoding the batches it is sent until it is sent None."""
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    cpu = torch.device("cpu")
    try:
        loaded = load_models(checkpoint, cpu)
        backend = TorchBackend(
            loaded.model, loaded.tokenizer, cpu, loaded.cfg.model.max_positions, loaded.direction
        )
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
        self.checkpoint, self.threads = checkpoint, threads
        self.context = multiprocessing.get_context("spawn")  # nothing of this process' threads is inherited
        self.processes: dict[Connection, BaseProcess] = {}
        self.conns = [self._start() for _ in range(workers)]
        for conn in self.conns:
            self._receive(conn)

    def _start(self) -> Connection:
        """A new worker process; the connection to it (its "ready" is still to be received)."""
        mine, theirs = self.context.Pipe()
        process = self.context.Process(target=_decoding_worker, args=(self.checkpoint, self.threads, theirs))
        process.daemon = True
        process.start()
        theirs.close()  # the worker's end is the worker's alone: its death reads as EOF here
        self.processes[mine] = process
        return mine

    def _restart(self, conn: Connection) -> Connection:
        """Replace the worker behind ``conn`` (gone: killed, or out of memory) by a new one, loaded."""
        self.processes.pop(conn).join(timeout=1)
        conn.close()
        new = self._start()
        self._receive(new)
        self.conns[self.conns.index(conn)] = new
        return new

    def close(self) -> None:
        """Stop the processes (they also stop when this process exits)."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        self.conns, self.processes = [], {}

    @staticmethod
    def _receive(conn: Connection) -> Any:
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            raise NMTError("a decoding worker process stopped unexpectedly") from None
        if kind == "error":
            raise NMTError(value)
        return value

    def translate_ids(
        self, sources: Ids, cfg: DecodingConfig, progress: bool = False, prefixes: Ids | None = None
    ) -> list[list[Hypothesis]]:
        if not self.conns:
            raise NMTError("the decoding worker processes were closed")
        for conn in list(self.conns):  # one that died since (killed, during the last call or after it)
            if not self.processes[conn].is_alive():
                self._restart(conn)
        batches = list(length_sorted_batches([len(s) + 1 for s in sources], batch_source_tokens(cfg)))
        if len(batches) < len(self.conns):  # fewer batches than processes: a share of each length each
            order = [i for batch in batches for i in batch]
            batches = [order[w :: len(self.conns)] for w in range(len(self.conns))]
        results: list[list[Hypothesis]] = [[] for _ in sources]
        todo, busy = iter(batch for batch in batches if batch), {}
        with tqdm(total=len(sources), disable=not progress, desc="decoding", unit="sent") as bar:
            try:
                for conn in list(self.conns):
                    self._send(conn, next(todo, None), sources, cfg, prefixes, busy)
                while busy:
                    for conn in wait(list(busy)):
                        batch = busy.pop(conn)
                        for i, hyps in zip(batch, self._receive(conn)):
                            results[i] = hyps
                        bar.update(len(batch))
                        self._send(conn, next(todo, None), sources, cfg, prefixes, busy)
            except NMTError:
                self._drain(busy)  # so that no stale answer is read by the next call
                raise
        return results

    @staticmethod
    def _drain(busy: dict) -> None:
        """Wait for the answers of the batches still out, and drop them."""
        for conn in busy:
            with contextlib.suppress(EOFError, OSError):
                conn.recv()
        busy.clear()

    def _send(
        self,
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
        job = ([list(sources[i]) for i in batch], cfg, forced)
        try:
            conn.send(job)
        except OSError:  # the worker died between batches: nothing of this batch is lost; a new one takes it
            conn = self._restart(conn)
            conn.send(job)
        busy[conn] = batch
