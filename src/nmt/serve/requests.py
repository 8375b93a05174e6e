"""What a client may send to ``POST /translate`` and ``POST /score``, and how a bad request is answered:
a JSON error ``{"error": ..., "field": ...}`` with a 4xx status that names what is wrong.

The decoding fields of a request are made from :class:`~nmt.config.DecodingConfig`: every option
that changes the translation, each with its value rule (the one ``decoding.*`` of the scripts is
checked with), so an option or a limit added there holds here too. Options that only change the
speed (batch size, cache) are the server's to set.
"""

from __future__ import annotations

import json
import typing
from dataclasses import fields
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import PydanticCustomError

from nmt.config import DecodingConfig, DecodingOverrides, Rule, ServerLimits
from nmt.errors import NMTError, count_mismatch
from nmt.serve.limits import BadRequest, check_depth, check_text

__all__ = [
    "BadRequest",
    "ScoreRequest",
    "TranslateRequest",
    "encode_sources",
    "parse_request",
    "parse_score",
    "request_model",
]

SERVER_SIDE = tuple(f.name for f in fields(DecodingConfig) if f.metadata["speed_only"])


class RequestBase(BaseModel):
    """Sentences and, optionally, decoding settings; unset settings are the checkpoint's."""

    # allow_inf_nan=False: NaN, Infinity and 1e999 (JSON numbers Python reads as infinite) are refused
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    text: list[str]
    attention: bool = False  # also return the cross-attention of the chosen hypotheses (torch backend)
    alignments: bool = False  # also return the word alignment of the chosen hypotheses (torch backend)
    prefix: list[str] | None = None  # target prefixes, one per sentence ("" = none): translations start so
    target_lang: str | None = None  # the language to translate into (a multilingual model's; else its own)

    def decoding(self) -> DecodingOverrides:
        return DecodingOverrides(**{f.name: getattr(self, f.name, None) for f in fields(DecodingOverrides)})


def _follows(rule: Rule) -> AfterValidator:
    """A pydantic check of a value by an nmt.config rule, failing with the rule's message."""
    ok, what = rule

    def check(value: Any) -> Any:
        if not ok(value):
            raise PydanticCustomError("value_rule", what)
        return value

    return AfterValidator(check)


def request_model(config: type = DecodingConfig) -> type[RequestBase]:
    """The request: ``text``, ``attention`` and each option of ``config`` (a decoding config dataclass)
    but the speed-only ones, optional (None: the server's default), checked by the option's rule."""
    hints = typing.get_type_hints(config)
    options: dict[str, Any] = {}
    for f in fields(config):
        if f.metadata["speed_only"]:
            continue
        kind = Annotated[hints[f.name], _follows(f.metadata["rule"])] if f.metadata["rule"] else hints[f.name]
        options[f.name] = (kind | None, None)
    return create_model("TranslateRequest", __base__=RequestBase, __module__=__name__, **options)


TranslateRequest = request_model()


class ScoreRequest(BaseModel):
    """Sources and a translation of each to score (with the server's length penalty and word reward)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: list[str]
    target: list[str]  # the translation of each source, to score
    target_lang: str | None = None  # the language of ``target`` (a multilingual model's)
    alignments: bool = False  # also return the word alignment of each pair (torch backend)


def parse_request(body: bytes, limits: ServerLimits) -> TranslateRequest:
    """The request in ``body``, or BadRequest: 400 (not UTF-8, not JSON, nested too deeply), 422 (a
    field's type or value), 413 (more sentences or characters than the server takes)."""
    request = validate(TranslateRequest, json_object(body))
    lines = request.text + (request.prefix or [])
    check_sizes(len(request.text), lines, limits)
    if request.prefix is not None and (
        mismatch := count_mismatch(len(request.prefix), len(request.text), "prefixes", "sentence")
    ):
        raise BadRequest(422, "prefix", mismatch)
    if request.beam_size is not None and request.beam_size > limits.max_beam_size:
        raise BadRequest(422, "beam_size", f"{request.beam_size} is out of range 1..{limits.max_beam_size}")
    if request.no_repeat_ngram is not None and request.no_repeat_ngram > limits.max_output_tokens:
        raise BadRequest(
            422,
            "no_repeat_ngram",
            f"{request.no_repeat_ngram} is longer than any output (serve.max_output_tokens="
            f"{limits.max_output_tokens})",
        )
    check_text(request.text)
    check_text(request.prefix or [], "prefix")
    return request


def parse_score(body: bytes, limits: ServerLimits) -> ScoreRequest:
    """The ``POST /score`` request in ``body``, refused as :func:`parse_request` refuses, and with 422
    when ``target`` does not have one translation per source."""
    request = validate(ScoreRequest, json_object(body))
    check_sizes(len(request.text), request.text + request.target, limits)
    if mismatch := count_mismatch(len(request.target), len(request.text), "translations", "source"):
        raise BadRequest(422, "target", mismatch)
    check_text(request.text)
    check_text(request.target, "target")
    return request


def json_object(body: bytes) -> dict:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, "body", f"invalid UTF-8 at byte {e.start}") from None
    check_depth(body)
    try:
        data = json.loads(text, parse_int=json_int)
    except json.JSONDecodeError as e:
        raise BadRequest(400, "body", f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise BadRequest(400, "body", 'a JSON object is expected, e.g. {"text": ["A sentence."]}')
    if (found := find_huge(data)) is not None:
        field, huge = found
        raise BadRequest(422, field, f"an integer of {huge.digits} digits is not a value any field takes")
    return data


class HugeInt:
    """A JSON integer with more digits than Python converts to an int (``sys.get_int_max_str_digits``,
    4,300): kept as its length, so that the field it was sent in can be named."""

    def __init__(self, digits: int):
        self.digits = digits


def json_int(text: str) -> int | HugeInt:
    try:
        return int(text)
    except ValueError:
        return HugeInt(len(text.lstrip("-")))


def find_huge(value: Any, path: str = "") -> tuple[str, HugeInt] | None:
    """The first :class:`HugeInt` in ``value`` (at most :data:`MAX_JSON_DEPTH` levels) and where it is,
    as a field name (``max_len_b``, ``text.1``)."""
    if isinstance(value, HugeInt):
        return path or "body", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := find_huge(item, f"{path}.{key}" if path else str(key))) is not None:
            return found
    return None


def validate(model: type[BaseModel], data: dict) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        error = e.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "body"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        if field.split(".")[0] in SERVER_SIDE:
            message = "set by the server, not per request"
        raise BadRequest(422, field, message) from None


def check_sizes(sentences: int, lines: list[str], limits: ServerLimits) -> None:
    """413 for more sentences, or characters over all the request's text, than the server takes."""
    if sentences > limits.max_sentences:
        raise BadRequest(413, "text", f"{sentences} sentences; at most {limits.max_sentences} per request")
    chars = sum(len(line) for line in lines)
    if chars > limits.max_chars:
        raise BadRequest(413, "text", f"{chars} characters; at most {limits.max_chars} per request")


def encode_sources(translator: Any, text: list[str], target_lang: str | None) -> list[list[int]]:
    """The request's sentences as the model reads them (tagged with ``target_lang`` when the model has
    several languages; the server's ``tgt_lang=`` else), a 422 naming the field when refused (a language
    the model does not translate into, none where it has several, a tag sent to a bilingual model)."""
    try:
        return translator.encode(text, tgt_lang=target_lang)
    except NMTError as e:
        raise BadRequest(
            422, "target_lang" if target_lang or translator.multilingual else "text", str(e)
        ) from None
