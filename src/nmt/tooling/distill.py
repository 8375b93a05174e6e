"""Sequence-level knowledge distillation (Kim and Rush, 2016): a teacher, or an ensemble of teachers,
translates the training sources with beam search, and a student trains on those translations instead
of (or beside) the references. The teacher's beam output is a simpler, more consistent target than
human translations, and a small student learns it better than the references; an ensemble teacher
passes on what the ensemble knows to one model that decodes at the price of one.

The teacher translates through the :class:`~nmt.inference.translator.Translator` (either backend), and the
work is cached under ``{data.cache_dir}/distilled/<key>/``, the key naming everything the translations
depend on, every file by its content (the teachers' checkpoints, the decoding settings with the
shortlist's content, the backend and its model, the source text)::

    meta.json                              what the key stands for
    translations/<start>-<stop>.<tgt>      the teacher's translations, one chunk of lines per file
    distilled-<name>[-with-original]/      the corpus: {train,valid,test}.{src,tgt} for data=local, named
                                           by the key and the content of the files copied into it

Each chunk is written atomically when it is done, so an interrupted run resumes at the first chunk
missing, and a second run translates nothing. Valid and test are copied from the original corpus:
checkpoints and length penalties are chosen, and students scored, on real references.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from nmt.cache import atomic_dir, atomic_write_text, file_digest, hash_key
from nmt.config import DecodingConfig, DistillConfig, check_values, checkpoint_paths, data_or_model_data
from nmt.data import prepare_text, read_lines, read_text, text_path
from nmt.devices import select_device
from nmt.errors import NMTError
from nmt.inference.translator import Translator

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # of the cache layout and the key: a change gets new folders, never a stale reuse


@dataclass
class DistilledCorpus:
    """What :func:`distill` made: the corpus folder for ``data=local data.dir=...`` and its counts."""

    folder: Path
    src_lang: str
    tgt_lang: str
    distilled: int  # training sources translated by the teacher
    translated_now: int  # of those, translated by this run (0: everything came from the cache)
    train_pairs: int  # lines of the training split written (twice ``distilled`` with keep_original)
    empty: int  # translations that came out empty (data=local's cleaning drops those pairs)
    seconds: float  # spent translating in this run

    def student_command(self) -> str:
        """The main job's command that trains the student preset on this corpus."""
        return (
            f"bash scripts/run.sh experiment=multi30k_distill_cpu data.dir={self.folder} "
            f"data.src_lang={self.src_lang} data.tgt_lang={self.tgt_lang}"
        )


def distill(cfg: DistillConfig, progress: bool = True) -> DistilledCorpus:
    """Translate the training sources of ``cfg.data`` (default: the teacher's data) with the teacher and
    write the distilled corpus, reusing whatever an earlier run with the same key left."""
    check_values(cfg)
    translator = Translator.from_checkpoint(
        cfg.teacher, select_device(cfg.device), cfg.backend, cfg.ct2_model
    )
    decoding = translator.decoding_with(cfg.decoding)
    data = data_or_model_data(cfg.data, translator.cfg.data)
    text = prepare_text(data, progress=progress)
    src, tgt = data.src_lang, data.tgt_lang
    sources = read_text(text, "train", src)
    settings = cache_settings(cfg, decoding, text_path(text, "train", src), src, tgt)
    key = hash_key(settings)
    root = Path(data.cache_dir) / "distilled" / key
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "meta.json").is_file():
        paths = [str(Path(p).resolve()) for p in checkpoint_paths(cfg.teacher)]
        meta = {
            **settings,
            "teacher_paths": paths,
            "ct2_model_path": cfg.ct2_model,
            "shortlist_path": decoding.shortlist,
        }
        atomic_write_text(root / "meta.json", json.dumps(meta, indent=2) + "\n")

    started = time.perf_counter()
    translations, translated_now = translate_in_chunks(
        translator, sources, decoding, root / "translations", tgt, cfg.distill.chunk_sentences, progress
    )
    seconds = time.perf_counter() - started

    folder = root / corpus_name(key, text, src, tgt, cfg.distill.keep_original)
    train_src, train_tgt = sources, translations
    if cfg.distill.keep_original:
        train_src, train_tgt = sources + sources, translations + read_text(text, "train", tgt)
    if not folder.is_dir():
        with atomic_dir(folder) as tmp:
            _write_lines(tmp / f"train.{src}", train_src)
            _write_lines(tmp / f"train.{tgt}", train_tgt)
            for split in ("valid", "test"):
                for lang in (src, tgt):
                    shutil.copyfile(text / f"{split}.{lang}", tmp / f"{split}.{lang}")
    return DistilledCorpus(
        folder=folder,
        src_lang=src,
        tgt_lang=tgt,
        distilled=len(sources),
        translated_now=translated_now,
        train_pairs=len(train_src),
        empty=sum(not line for line in translations),
        seconds=seconds,
    )


def cache_settings(cfg: DistillConfig, decoding: DecodingConfig, sources: Path, src: str, tgt: str) -> dict:
    """Everything the translations depend on, by content (the key): a retrained teacher or edited text
    gets a new key under the same file names, and a teacher copied elsewhere finds its translations."""
    settings = {
        "format": FORMAT_VERSION,
        "teachers": [file_digest(Path(p))["sha1"] for p in checkpoint_paths(cfg.teacher)],
        # a file input by its content: a shortlist built again at the same path is another input
        "decoding": {
            **asdict(decoding),
            "shortlist": decoding.shortlist and file_digest(Path(decoding.shortlist))["sha1"],
        },
        "backend": cfg.backend,
        "sources": file_digest(sources)["sha1"],
        "direction": [src, tgt],
    }
    if cfg.backend == "ct2":
        settings["ct2_model"] = file_digest(Path(cfg.ct2_model) / "model.bin")["sha1"]
    return settings


def corpus_name(key: str, text: Path, src: str, tgt: str, keep_original: bool) -> str:
    """The corpus folder's name: the translations' ``key`` and the content of the files copied into it
    beside them (valid and test, and with ``keep_original`` the training references), so that edited
    references get a new folder rather than the old one."""
    copied = [(split, lang) for split in ("valid", "test") for lang in (src, tgt)]
    copied += [("train", tgt)] if keep_original else []
    digests = {f"{split}.{lang}": file_digest(text_path(text, split, lang))["sha1"] for split, lang in copied}
    contents = hash_key({"translations": key, **digests})
    return f"distilled-{contents}" + ("-with-original" if keep_original else "")


def translate_in_chunks(
    translator: Translator,
    sources: list[str],
    decoding: DecodingConfig,
    folder: Path,
    tgt_lang: str,
    chunk: int,
    progress: bool,
) -> tuple[list[str], int]:
    """The translations of ``sources``, chunk by chunk: a chunk already in ``folder`` is read, a missing
    one translated and written atomically. Returns them and how many sentences were translated now."""
    folder.mkdir(parents=True, exist_ok=True)
    spans = [(start, min(start + chunk, len(sources))) for start in range(0, len(sources), chunk)]
    paths = [folder / f"{start:09d}-{stop:09d}.{tgt_lang}" for start, stop in spans]
    done = sum(stop - start for (start, stop), path in zip(spans, paths) if path.is_file())
    if done:
        log.info("resuming: %d of %d sentences already translated in %s", done, len(sources), folder)
    out: list[str] = []
    translated = 0
    with tqdm(total=len(sources), initial=done, desc="distilling", unit=" sent", disable=not progress) as bar:
        for (start, stop), path in zip(spans, paths):
            if path.is_file():
                lines = read_lines(path)
                if len(lines) != stop - start:
                    raise NMTError(f"{path}: {len(lines)} lines, expected {stop - start}; delete the file")
            else:
                lines = translator.translate(sources[start:stop], decoding, first_line=start + 1)
                atomic_write_text(path, "".join(line + "\n" for line in lines))
                translated += stop - start
                bar.update(stop - start)
            out.extend(lines)
    return out, translated


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
