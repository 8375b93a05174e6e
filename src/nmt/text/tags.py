"""Target-language tags (Johnson et al., 2017), written ``>>de<<`` as OPUS-MT writes them: the first
token of every source sentence of a multilingual model says which language to translate into.

A bilingual model has no tags; a multilingual one knows its directions (``(src, tgt)`` pairs, from the
corpora it was trained on) and asks for a target language whenever it has several. Tags are
SentencePiece user-defined symbols (:func:`nmt.text.tokenizer.train_tokenizer`), so never split.
"""

from __future__ import annotations

import logging
import re

from nmt.errors import NMTError

log = logging.getLogger(__name__)

TAG = re.compile(r">>([A-Za-z0-9_-]+)<<")
# ISO 639-2/3 codes of the languages a corpus names by their two letters: accepted, mapped, logged
THREE_LETTERS = {
    "ces": "cs", "cze": "cs", "deu": "de", "ger": "de", "eng": "en", "fra": "fr", "fre": "fr",
    "ron": "ro", "rum": "ro", "rus": "ru", "spa": "es", "ita": "it", "nld": "nl", "dut": "nl",
    "por": "pt", "pol": "pl", "fin": "fi", "est": "et", "lav": "lv", "lit": "lt", "tur": "tr",
    "hin": "hi", "zho": "zh", "chi": "zh", "jpn": "ja", "kor": "ko", "ara": "ar", "guj": "gu",
    "kaz": "kk",
}  # fmt: skip
Direction = tuple[str, str]


def tag(lang: str) -> str:
    """The tag of a target language: ``>>de<<``."""
    return f">>{lang}<<"


def tagged(lang: str, lines: list[str]) -> list[str]:
    """``lines`` with the tag of ``lang`` in front, as a multilingual model reads its source."""
    prefix = tag(lang) + " "
    return [prefix + line for line in lines]


def untagged(line: str) -> str:
    """A source line without its leading tag (the sentence itself, for held-out comparisons)."""
    match = TAG.match(line)
    return line[match.end() :].lstrip() if match else line


def refuse_tags(lines: list[str], first_line: int = 1) -> None:
    """A bilingual model's input with a tag in it: refused in one line (the model knows no tags, and
    would translate the tag's pieces as text)."""
    for i, line in enumerate(lines):
        found = TAG.search(line)
        if found:
            raise NMTError(
                f"line {first_line + i}: {found.group(0)} is a target-language tag, but this model is "
                "bilingual (one direction, no tags): remove it"
            )


def target_languages(directions: list[Direction]) -> list[str]:
    """The target languages of ``directions``, in order, each once."""
    return list(dict.fromkeys(tgt for _, tgt in directions))


def choose_target(
    directions: list[Direction], tgt_lang: str | None, src_lang: str | None = None, zero_shot: bool = False
) -> str:
    """The target language to translate into: ``tgt_lang`` mapped to a code the model has (another case,
    or a three-letter code, mapped and logged), required when the model has several; one line naming the
    codes it has else. A direction never trained (``src_lang -> tgt_lang``) needs ``zero_shot``."""
    targets = target_languages(directions)
    codes = ", ".join(targets)
    if not tgt_lang:
        if len(targets) == 1:
            return targets[0]
        raise NMTError(f"tgt_lang: this model translates into several languages ({codes}); name one")
    lang = _known_code(tgt_lang, targets + [s for s, _ in directions])
    if lang not in targets:
        raise NMTError(f"tgt_lang={tgt_lang}: the model translates into {codes} only")
    if src_lang and (src_lang, lang) not in directions:
        if not zero_shot:
            trained = ", ".join(f"{s}->{t}" for s, t in directions)
            raise NMTError(
                f"tgt_lang={tgt_lang}: {src_lang}->{lang} was never trained (trained: {trained}); "
                "zero_shot=true translates it anyway"
            )
        log.info("%s->%s: zero-shot (never trained)", src_lang, lang)
    return lang


def _known_code(given: str, codes: list[str]) -> str:
    """``given`` as one of ``codes``: itself, case aside, or a three-letter code's two letters; logged
    when mapped. Unknown: returned as given (the caller names the codes there are)."""
    if given in codes:
        return given
    lowered = given.lower()
    mapped = lowered if lowered in codes else THREE_LETTERS.get(lowered, given)
    if mapped != given and mapped in codes:
        log.info("target language %r taken as %r", given, mapped)
        return mapped
    return given
