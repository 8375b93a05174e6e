"""The HTTP service of ``scripts/serve.py``: ``POST /translate``, ``GET /health``, ``GET /info`` and the
page at ``GET /``, over one :class:`~nmt.translator.Translator` (the same path as ``translate.py``, so
the same input gets the same output)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, astuple
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from nmt.config import DecodingConfig, ServerLimits
from nmt.errors import NMTError
from nmt.serve.batcher import Batcher, Job, QueueFull
from nmt.serve.requests import BadRequest, parse_request
from nmt.translator import Hypothesis, Translator


def create_app(translator: Translator, limits: ServerLimits, defaults: DecodingConfig) -> FastAPI:
    """The service; ``defaults`` are the decoding settings of a request that sets none."""
    batcher = Batcher(lambda jobs: translate_jobs(translator, jobs), limits.max_tokens, limits.queue_size)
    backend = translator.backend.name

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    app = FastAPI(title="nmt translation service", lifespan=lifespan)
    page = resources.files("nmt.serve").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "queued": len(batcher.pending), "batches": batcher.batches}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return service_info(translator, limits, defaults)

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        started = time.perf_counter()
        try:
            parsed = parse_request(await request.body(), limits)
            decoding = translator.decoding_with(parsed.decoding(), base=defaults)
            if parsed.attention and not translator.has_attention:
                raise BadRequest(
                    422, "attention", f"the {backend} backend has no attention weights; use backend=torch"
                )
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=e.status)
        except NMTError as e:  # settings that are fine one by one but not together (nbest > beam_size)
            return JSONResponse({"error": str(e), "field": "decoding"}, status_code=422)
        ids = translator.encode(parsed.text)
        try:
            future = batcher.submit(ids, (astuple(decoding), parsed.attention), (decoding, parsed.attention))
        except QueueFull as e:
            headers = {"Retry-After": str(limits.retry_after_s)}
            return JSONResponse({"error": f"busy: {e}; retry later"}, status_code=503, headers=headers)
        translations = await future
        return JSONResponse(
            {
                "translations": translations,
                "decoding": asdict(decoding),
                "backend": backend,
                "elapsed_ms": round(1000 * (time.perf_counter() - started), 1),
            }
        )

    return app


def translate_jobs(translator: Translator, jobs: list[Job]) -> list[list[dict[str, Any]]]:
    """Decode the jobs (one decoding setting) in one search; per job, one result per sentence."""
    decoding, attention = jobs[0].settings
    ids = [s for job in jobs for s in job.ids]
    hyps = translator.search(ids, decoding)
    results, start = [], 0
    for job in jobs:
        results.append(
            [
                sentence_result(translator, src, nbest, attention)
                for src, nbest in zip(job.ids, hyps[start : start + len(job.ids)])
            ]
        )
        start += len(job.ids)
    return results


def sentence_result(
    translator: Translator, src: list[int], nbest: list[Hypothesis], attention: bool
) -> dict[str, Any]:
    texts = translator.texts(nbest)
    result: dict[str, Any] = {
        "text": texts[0] if nbest else "",
        "score": nbest[0].score if nbest else None,
        "log_prob": nbest[0].log_prob if nbest else None,
        "nbest": [{"text": t, "score": h.score, "log_prob": h.log_prob} for t, h in zip(texts, nbest)],
    }
    if attention and nbest:
        cross = translator.attention(src, nbest[0].tokens)
        result["attention"] = {
            "source_tokens": cross.source_tokens,
            "target_tokens": cross.target_tokens,
            "weights": cross.weights.round(decimals=4).tolist(),  # [layer][head][target][source]
        }
    return result


def service_info(translator: Translator, limits: ServerLimits, defaults: DecodingConfig) -> dict[str, Any]:
    return {**translator.info(), "decoding": asdict(defaults), "limits": asdict(limits)}
