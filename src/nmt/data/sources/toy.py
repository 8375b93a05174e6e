"""A synthetic, learnable task made from a seed: seconds to learn on a CPU, what the tests train on."""

from __future__ import annotations

import random
from collections.abc import Iterator

from nmt.config import ToyDataConfig
from nmt.data.sources.shapes import Chunk, RawCorpus
from nmt.errors import NMTError

# Kept: the task draws every split from one small lexicon, so short sentences recur across splits; it is
# learnt as a rule, not as text seen or unseen.
REMOVE_HELD_OUT = False
SCHEMA = ToyDataConfig


def resolve(cfg: ToyDataConfig) -> ToyDataConfig:
    return cfg


def pin(cfg: ToyDataConfig) -> ToyDataConfig:
    return cfg


def describe(cfg: ToyDataConfig) -> str:
    return f"the toy task (seed {cfg.seed}, swap_pairs={cfg.swap_pairs})"


def cache_key(cfg: ToyDataConfig, settings: dict) -> dict:
    """Every setting makes the task: the key is all of them."""
    return settings


def read(cfg: ToyDataConfig, split: str) -> Iterator[Chunk]:
    """The toy task is small: made whole, handed out as one chunk."""
    corpus = make_toy(cfg)[split]
    yield corpus[cfg.src_lang], corpus[cfg.tgt_lang]


def _other_language(cfg: ToyDataConfig) -> str:
    """The language beside "src": "tgt" (the task), or any other name (a task of its own lexicon)."""
    langs = (cfg.src_lang, cfg.tgt_lang)
    if langs.count("src") != 1:
        raise NMTError(
            f"data=toy has the language src and one other (tgt, or any name for a lexicon of its own), "
            f"got {cfg.src_lang!r} and {cfg.tgt_lang!r}"
        )
    return langs[1] if langs[0] == "src" else langs[0]


TOY_LANGS = ("src", "tgt")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def make_toy(cfg: ToyDataConfig) -> RawCorpus:
    """A learnable synthetic task: translate word by word through an invented lexicon, then swap
    adjacent word pairs ("a b c d e" -> "B A D C E"; ``cfg.swap_pairs=False``: "A B C D E").

    Everything follows from ``cfg.seed``. The languages are "src" and "tgt" (swap them for the inverse
    task); a target language of another name ("de") has target words of its own, drawn from the seed and
    its name, for the same source sentences: toy languages of a multi-way corpus.
    """
    other = _other_language(cfg)
    if not 1 <= cfg.min_len <= cfg.max_len:
        raise NMTError(
            f"data.min_len={cfg.min_len}, data.max_len={cfg.max_len}: need 1 <= min_len <= max_len"
        )
    rng = random.Random(cfg.seed)
    words = _invent_words(rng, 2 * cfg.vocab_words)
    targets = words[cfg.vocab_words :]
    if other != "tgt":
        targets = _invent_words(random.Random(f"{cfg.seed}:{other}"), cfg.vocab_words)
    lexicon = dict(zip(words[: cfg.vocab_words], targets))
    source_words = list(lexicon)
    reorder = _swap_pairs if cfg.swap_pairs else list
    corpus: RawCorpus = {}
    for split, size in (("train", cfg.train_size), ("valid", cfg.valid_size), ("test", cfg.test_size)):
        sentences = [rng.choices(source_words, k=rng.randint(cfg.min_len, cfg.max_len)) for _ in range(size)]
        corpus[split] = {
            "src": [" ".join(s) for s in sentences],
            other: [" ".join(reorder([lexicon[w] for w in s])) for s in sentences],
        }
    return corpus


def _invent_words(rng: random.Random, n: int) -> list[str]:
    """n distinct pronounceable words of 2-3 consonant-vowel syllables, in order of invention."""
    words: dict[str, None] = {}
    while len(words) < n:
        syllables = rng.randint(2, 3)
        words["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))] = None
    return list(words)


def _swap_pairs(words: list[str]) -> list[str]:
    out = list(words)
    for i in range(0, len(words) - 1, 2):
        out[i], out[i + 1] = words[i + 1], words[i]
    return out
