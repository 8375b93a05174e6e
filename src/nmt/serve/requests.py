"""What a client may send to ``POST /translate`` and how a bad request is answered: a JSON error
``{"error": ..., "field": ...}`` with a 4xx status that names what is wrong."""

from __future__ import annotations

import json
from dataclasses import fields

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nmt.config import DecodingOverrides, ServerLimits

SERVER_SIDE = ("max_tokens", "cache")  # decoding settings the server keeps to itself (batching, speed)


class TranslateRequest(BaseModel):
    """Sentences and, optionally, decoding settings; unset settings are the checkpoint's."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: list[str]
    attention: bool = False  # also return the cross-attention of the chosen hypotheses (torch backend)
    beam_size: int | None = Field(default=None, ge=1)
    nbest: int | None = Field(default=None, ge=1)
    alpha: float | None = Field(default=None, ge=0)
    max_len_a: float | None = Field(default=None, ge=0)
    max_len_b: int | None = Field(default=None, ge=0)
    no_unk: bool | None = None
    no_repeat_ngram: int | None = Field(default=None, ge=0)
    word_reward: float | None = None

    def decoding(self) -> DecodingOverrides:
        return DecodingOverrides(**{f.name: getattr(self, f.name, None) for f in fields(DecodingOverrides)})


class BadRequest(Exception):
    """A request refused with ``status``, naming the ``field`` at fault."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message

    def body(self) -> dict[str, str]:
        return {"error": f"{self.field}: {self.message}", "field": self.field}


def parse_request(body: bytes, limits: ServerLimits) -> TranslateRequest:
    """The request in ``body``, or BadRequest: 400 (not UTF-8, not JSON), 422 (a field's type or value),
    413 (more sentences or characters than the server takes)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, "body", f"invalid UTF-8 at byte {e.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(400, "body", f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise BadRequest(400, "body", 'a JSON object is expected, e.g. {"text": ["A sentence."]}')
    try:
        request = TranslateRequest.model_validate(data)
    except ValidationError as e:
        error = e.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "body"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        if field.split(".")[0] in SERVER_SIDE:
            message = "set by the server, not per request"
        raise BadRequest(422, field, message) from None
    if len(request.text) > limits.max_sentences:
        raise BadRequest(
            413, "text", f"{len(request.text)} sentences; at most {limits.max_sentences} per request"
        )
    chars = sum(len(line) for line in request.text)
    if chars > limits.max_chars:
        raise BadRequest(413, "text", f"{chars} characters; at most {limits.max_chars} per request")
    if request.beam_size is not None and request.beam_size > limits.max_beam_size:
        raise BadRequest(422, "beam_size", f"{request.beam_size} is out of range 1..{limits.max_beam_size}")
    return request
