"""The HTTP service of ``scripts/serve.py``: ``POST /translate``, ``GET /health``, ``GET /info``,
``GET /metrics`` and the page at ``GET /``, over one :class:`~nmt.inference.translator.Translator` (the
same path as ``translate.py``, so the same input gets the same output).

A request is checked before it costs anything (:mod:`nmt.serve.limits`): its Host (with
``allowed_hosts``), its media type, its size as declared and as read, the time its body takes, its JSON,
its fields, the output length and attention it may ask for. It then waits in the queue
(:mod:`nmt.serve.batcher`) for a worker process (:mod:`nmt.serve.workers`) until ``serve.timeout_s``; a
request whose client left is dropped there, undecoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import re
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, astuple, dataclass, replace
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from nmt.config import DecodingConfig, ServerLimits
from nmt.devices import select_device, usable_cores
from nmt.errors import NMTError
from nmt.inference.translator import Translator
from nmt.serve.batch_decoding import (
    JobResult,
    ScoreSettings,
    TranslateSettings,
    TranslatorSpec,
    load_work,
    translate_batch,
)
from nmt.serve.batcher import Batcher, Job, QueueFull
from nmt.serve.limits import (
    BadRequest,
    check_attention_size,
    check_content_type,
    check_output_length,
    check_score_memory,
    check_scores,
    check_search_memory,
    declared_length,
    read_body,
    score_batch_tokens,
)
from nmt.serve.requests import ScoreRequest, TranslateRequest, encode_sources, parse_request, parse_score
from nmt.serve.telemetry import ServiceMetrics
from nmt.serve.workers import InlineWorker, Refused, ServerStopping, Worker, WorkerFailed, WorkerTimeout

Parsed = TypeVar("Parsed")  # a request model: what parse_request or parse_score returns

log = logging.getLogger(__name__)
CLIENT_GONE = 499  # no one reads this answer (nginx's code for a client that closed the request)
_DECODING_KEY = re.compile(r"decoding\.(\w+)=")


@dataclass
class ServiceState:
    """Everything the route handlers share, made once by :func:`create_app` and kept on ``app.state``."""

    translator: Translator
    limits: ServerLimits
    defaults: DecodingConfig  # the decoding settings of a request that sets none
    scoring: DecodingConfig  # /score's: within decoding.max_tokens and serve.max_score_mb
    alignment_layer: int | None  # the decoder layer of the word alignments (None: the penultimate)
    metrics: ServiceMetrics
    batcher: Batcher
    accepts: BackendCheck
    info: dict[str, Any]  # what GET /info answers
    page: str  # the page at GET /

    @property
    def max_body(self) -> int:
        return self.limits.max_body_kb * 1024


@dataclass
class Queued:
    """A checked request, ready for the queue: its source ids, its batching key (requests share a search
    only with requests of the same key), its settings, and what its search keeps in memory."""

    ids: list[list[int]]
    key: Any
    settings: TranslateSettings | ScoreSettings
    name: str  # the answer's field: "translations" or "scores"
    decoding: DecodingConfig  # the settings the answer shows
    memory: int = 0


def create_app(
    translator: Translator,
    limits: ServerLimits,
    defaults: DecodingConfig,
    spec: TranslatorSpec | None = None,
    alignment_layer: int | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> FastAPI:
    """The service; ``defaults`` are the decoding settings of a request that sets none, and
    ``alignment_layer`` the decoder layer of the word alignments asked for (None: the penultimate).
    With ``allowed_hosts`` (:func:`trusted_hosts`) a request whose ``Host`` is none of them gets 400
    (a page on a DNS-rebound name is same-origin with the service: Host is what tells it apart); an app
    made in code without them, e.g. for a test client, answers any Host.

    With ``spec`` (how ``translator`` was built), ``serve.workers`` processes decode, each building
    its own Translator from it, and a batch past ``serve.timeout_s`` is stopped with its process.
    Without it (a Translator made in code) a thread of this process decodes: such a batch runs to its
    end, while its requests get their 504 on time. NMTError when the backend cannot decode ``defaults``
    or the model has no decoder layer ``alignment_layer``.
    """
    state = service_state(translator, limits, defaults, spec, alignment_layer)
    app = FastAPI(title="nmt translation service", lifespan=lifespan)
    if allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed_hosts=list(allowed_hosts), metrics=state.metrics)
    app.state.service = state
    app.add_api_route("/", index, methods=["GET"], response_class=HTMLResponse)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/info", service_info, methods=["GET"])
    app.add_api_route("/metrics", prometheus, methods=["GET"])
    app.add_api_route("/translate", translate, methods=["POST"])
    app.add_api_route("/score", score, methods=["POST"])
    return app


def service_state(
    translator: Translator,
    limits: ServerLimits,
    defaults: DecodingConfig,
    spec: TranslatorSpec | None,
    alignment_layer: int | None,
) -> ServiceState:
    """The checks made at start (NMTError for settings every request would fail with), then the
    workers, their queue and what the service tells about itself."""
    check_defaults(translator, defaults, limits)
    vocab = translator.tokenizer.tgt_vocab_size
    check_score_memory(limits, vocab, translator.max_source)
    # /score's batches: within decoding.max_tokens and serve.max_score_mb (the answers show ``defaults``)
    scoring = replace(defaults, max_tokens=score_batch_tokens(limits, vocab, defaults.max_tokens))
    translator.check_alignment_layer(alignment_layer)  # the page asks for alignments with each translation
    metrics = ServiceMetrics()
    max_response, max_search = int(limits.max_response_mb * 2**20), limits.max_search_mb * 2**20
    workers = make_workers(translator, limits, spec, max_response)
    batcher = Batcher(workers, limits.max_tokens, limits.queue_size, metrics, max_search)
    info = {**translator.info(), "decoding": public_decoding(defaults), "limits": asdict(limits)}
    page = resources.files("nmt.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    accepts = BackendCheck(translator)
    return ServiceState(
        translator, limits, defaults, scoring, alignment_layer, metrics, batcher, accepts, info, page
    )


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The workers run while the app does."""
    batcher = app.state.service.batcher
    await batcher.start()
    try:
        yield
    finally:
        await batcher.stop()


def service(request: Request) -> ServiceState:
    return request.app.state.service


async def index(request: Request) -> str:
    state = service(request)
    state.metrics.requests.labels(path="/", status="200").inc()
    return state.page


async def health(request: Request) -> JSONResponse:
    """200 while every worker can decode; 503 while one is down or starting again."""
    state = service(request)
    batcher = state.batcher
    running = batcher.running
    status = 200 if running else 503
    state.metrics.requests.labels(path="/health", status=str(status)).inc()
    body = {
        "status": "ok" if running else "unavailable",
        "workers": {"ready": sum(w.alive for w in batcher.workers), "total": len(batcher.workers)},
        "queued": len(batcher.pending),
        "batches": batcher.batches,
        "restarts": batcher.restarts,
    }
    return JSONResponse(body, status_code=status)


async def service_info(request: Request) -> dict[str, Any]:
    state = service(request)
    state.metrics.requests.labels(path="/info", status="200").inc()
    return state.info


async def prometheus(request: Request) -> Response:
    metrics = service(request).metrics
    metrics.requests.labels(path="/metrics", status="200").inc()
    return Response(metrics.render(), media_type=metrics.content_type)


async def translate(request: Request) -> Response:
    return await handle(request, "/translate", parse_request, translation_job)


async def score(request: Request) -> Response:
    """The model's score of given translations (the page's edited translation), hardened as
    ``/translate``: the same limits, queue, workers and timeout."""
    return await handle(request, "/score", parse_score, scoring_job)


async def handle(request: Request, path: str, parse: Callable, job: Callable) -> Response:
    """A POST of ``path``: its body parsed by ``parse``, queued by ``job``, answered by :func:`finish`."""
    state = service(request)
    answer = Reply(path, state.metrics)
    deadline = answer.started + state.limits.timeout_s
    try:
        parsed = await request_body(state, request, parse)
        answer.sentences = len(parsed.text)
        queued = job(state, parsed)
    except BadRequest as e:
        return answer(e.status, e.body(), e.headers)
    except ClientDisconnect:
        return answer(CLIENT_GONE, {"error": "the client left"})
    return await finish(state, request, answer, queued, deadline)


async def request_body(
    state: ServiceState, request: Request, parse: Callable[[bytes, ServerLimits], Parsed]
) -> Parsed:
    """A POST's JSON body parsed by ``parse``, or BadRequest: a wrong content type, a declared or read
    body over ``serve.max_body_kb``, a body that arrives slower than ``serve.timeout_s`` allows."""
    check_content_type(request.headers.get("content-type"))
    declared_length(request.headers.get("content-length"), state.max_body)
    return parse(await read_body(request.stream(), state.max_body, state.limits.timeout_s), state.limits)


def translation_job(state: ServiceState, parsed: TranslateRequest) -> Queued:
    """A ``/translate`` request checked before it costs anything: its settings (also by the backend), the
    attention and alignments it asks for, its prefixes, its output length and search memory; BadRequest
    otherwise."""
    translator, limits = state.translator, state.limits
    decoding = settings(translator, parsed.decoding(), state.defaults, state.accepts)
    check_scores(decoding, limits)
    if parsed.attention and translator.missing_attention:
        raise BadRequest(422, "attention", translator.missing_attention)
    if parsed.alignments and translator.missing_attention:
        raise BadRequest(422, "alignments", translator.missing_attention)
    ids = encode_sources(translator, parsed.text, parsed.target_lang)
    lengths = [len(s) for s in ids]
    prefixes = None
    if parsed.prefix is not None:
        try:
            prefixes = translator.encode_prefixes(ids, parsed.prefix, decoding, item="prefix")
        except NMTError as e:
            raise BadRequest(422, "prefix", str(e)) from None
    asked = set(parsed.model_fields_set)
    check_output_length(lengths, decoding, limits, translator.max_source, asked)
    memory = translator.search_bytes(ids, decoding)
    check_search_memory(memory, lengths, decoding, limits, asked)
    if parsed.attention:
        check_attention_size(lengths, decoding, limits, translator.max_source, state.info["model"])
    # requests with target prefixes share a search only with requests of the same prefixes
    prefix_key = tuple(map(tuple, prefixes)) if prefixes else None
    key = (astuple(decoding), parsed.attention, parsed.alignments, prefix_key)
    job = TranslateSettings(decoding, parsed.attention, parsed.alignments, prefixes, state.alignment_layer)
    return Queued(ids, key, job, "translations", decoding, sum(memory))


def scoring_job(state: ServiceState, parsed: ScoreRequest) -> Queued:
    """A ``/score`` request checked: the alignments it asks for and its targets; BadRequest otherwise."""
    translator = state.translator
    if parsed.alignments and translator.missing_attention:
        raise BadRequest(422, "alignments", translator.missing_attention)
    ids = encode_sources(translator, parsed.text, parsed.target_lang)
    try:
        targets = translator.encode_targets(parsed.target, item="target")
    except NMTError as e:
        raise BadRequest(422, "target", str(e)) from None
    key = ("score", astuple(state.defaults), parsed.alignments)
    job = ScoreSettings(state.scoring, targets, parsed.alignments, state.alignment_layer)
    return Queued(ids, key, job, "scores", state.defaults)


async def finish(
    state: ServiceState, request: Request, answer: Reply, queued: Queued, deadline: float
) -> Response:
    """Queue the job, wait for its worker and answer ``{name: ..., "decoding", "backend", "elapsed_ms"}``,
    or the error that stopped it."""
    outcome = await run_job(state, request, answer, queued, deadline)
    if isinstance(outcome, Response):
        return outcome
    if outcome.refused is not None:
        return answer(422, refusal(outcome.refused))
    if outcome.translations is None:
        return answer(*unanswerable(outcome, state.limits))
    if queued.name == "translations":
        state.metrics.sentences.inc(len(queued.ids))
        state.metrics.source_tokens.inc(sum(len(s) for s in queued.ids))
        state.metrics.target_tokens.inc(outcome.target_tokens)
    elapsed_ms = round(1000 * (answer.loop.time() - answer.started), 1)
    backend = state.info["backend"]
    tail = {"decoding": public_decoding(queued.decoding), "backend": backend, "elapsed_ms": elapsed_ms}
    head = f'{{"{queued.name}":'.encode()
    return answer(200, head + outcome.translations + b"," + json.dumps(tail)[1:].encode())


async def run_job(
    state: ServiceState, request: Request, answer: Reply, queued: Queued, deadline: float
) -> JobResult | Response:
    """The worker's result for ``queued``, or the answer when it has none: a full queue, a failed,
    stopping or late worker, a client that left."""
    limits = state.limits
    retry = {"Retry-After": str(limits.retry_after_s)}
    try:
        job = state.batcher.submit(queued.ids, queued.key, queued.settings, deadline, queued.memory)
    except QueueFull as e:
        return answer(503, {"error": f"busy: {e}; retry later"}, retry)
    except WorkerFailed as e:
        return answer(503, {"error": str(e)}, retry)
    outcome = await wait_for(request, state.batcher, job, deadline)
    if outcome is None:
        return answer(CLIENT_GONE, {"error": "the client left"})
    try:
        return outcome.result()
    except (asyncio.CancelledError, WorkerTimeout):
        message = f"not translated within serve.timeout_s={limits.timeout_s:g} s; send less or retry later"
        return answer(504, {"error": message})
    except Refused as e:
        return answer(422, refusal(str(e)))
    except ServerStopping as e:
        return answer(503, {"error": str(e)}, retry)
    except WorkerFailed as e:
        return answer(500, {"error": f"{e}; it is being started again"})
    except Exception:  # noqa: BLE001 - a bug: logged with its traceback, the client gets a 500
        log.exception("translating a request failed")
        return answer(500, {"error": "internal error"})


def unanswerable(result: JobResult, limits: ServerLimits) -> tuple[int, dict[str, str]]:
    """The 422 of a result with no answer: one too large to send, or scores that are not numbers."""
    if result.size:
        message = (
            f"the answer would take {result.size / 2**20:.1f} MB, over serve.max_response_mb="
            f"{limits.max_response_mb:g}; send fewer sentences or ask for a shorter n-best list"
        )
        return 422, {"error": f"text: {message}", "field": "text"}
    message = "decoding: these settings give scores that are not finite numbers"
    return 422, {"error": message, "field": "decoding"}


def public_decoding(decoding: DecodingConfig) -> dict[str, Any]:
    """The decoding settings as the service shows them: a shortlist by its file name and digest (which
    tell a client what it was decoded over), never by the path on the server's disk."""
    settings = asdict(decoding)
    if decoding.shortlist:
        settings["shortlist"] = file_identity(decoding.shortlist)
    return settings


@functools.lru_cache(maxsize=16)
def file_identity(path: str) -> dict[str, str]:
    """``{"file": name, "sha256": digest}`` of a file the server reads (read once)."""
    return {"file": Path(path).name, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}


LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
BACKLOG = 2048  # connections waiting to be accepted: uvicorn's default
ANY_ADDRESS = ("0.0.0.0", "::", "")


def listen(host: str, port: int) -> socket.socket:
    """The service's socket, bound and listening before the model loads: a port already in use (a second
    start) fails at once, in one line, instead of after the model and its workers are up. It listens
    at once because Linux lets sockets with SO_REUSEADDR share a port while none of them listens, so a
    second start that only bound would load its model beside the first; clients that connect while
    the model loads wait in the backlog until the service answers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise NMTError(
            f"host={host} port={port}: cannot listen there ({e.strerror or e}); another server may hold it: "
            "stop it, or choose another port=..."
        ) from None
    return sock


def served_url(sock: socket.socket) -> str:
    """The address clients reach the listening ``sock`` at: the port bound (``port=0`` takes any free
    one), and for a wildcard host (0.0.0.0, ::) this machine's loopback, saying it serves every address."""
    host, port = sock.getsockname()[:2]
    if host in ANY_ADDRESS:
        loopback = "[::1]" if sock.family == socket.AF_INET6 else "127.0.0.1"
        return f"http://{loopback}:{port}/ (and every address of this machine: host={host})"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def trusted_hosts(configured: Sequence[str], bound: str) -> list[str]:
    """The Host names answered: ``serve.allowed_hosts``, or by default the address the server is bound
    to (``host=``) and the names of localhost (with ``host=0.0.0.0`` also this machine's name)."""
    if configured:
        return list(configured)
    hosts = [f"[{bound}]" if ":" in bound else bound, *LOCAL_HOSTS]
    if bound in ANY_ADDRESS:
        hosts = [*LOCAL_HOSTS, socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys(h.lower() for h in hosts if h))


class HostCheck(TrustedHostMiddleware):
    """Starlette's Host check (400 for a Host not allowed), its refusals counted in ``/metrics`` and the
    access log as every other answer is: a DNS-rebinding page probing the service shows there. They are
    counted under the request's path when the service has it, under ``other`` otherwise, so that
    arbitrary paths never become metric labels."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str], metrics: ServiceMetrics):
        super().__init__(self._allowed, allowed_hosts=allowed_hosts, www_redirect=False)
        self.inner, self.metrics = app, metrics

    async def _allowed(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["nmt.host_allowed"] = True
        await self.inner(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.monotonic()
        await super().__call__(scope, receive, send)
        if scope["type"] == "http" and not scope.get("nmt.host_allowed"):
            routes = {getattr(route, "path", None) for route in scope["app"].routes}
            path = scope["path"] if scope["path"] in routes else "other"
            self.metrics.answered(path, 400, 0, time.monotonic() - started)


class Reply:
    """The answers of one request, each counted in ``/metrics`` and the access log with its status, the
    request's sentences and the time since it came."""

    def __init__(self, path: str, metrics: ServiceMetrics):
        self.path, self.metrics = path, metrics
        self.loop = asyncio.get_running_loop()
        self.started = self.loop.time()
        self.sentences = 0  # known once the body is parsed

    def __call__(
        self, status: int, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
    ) -> Response:
        self.metrics.answered(self.path, status, self.sentences, self.loop.time() - self.started)
        if isinstance(body, dict):
            return JSONResponse(body, status_code=status, headers=headers)
        return Response(body, status_code=status, media_type="application/json", headers=headers)


def make_workers(
    translator: Translator, limits: ServerLimits, spec: TranslatorSpec | None, max_response: int
) -> list[Worker | InlineWorker]:
    """``serve.workers`` processes built from ``spec`` (0: one per CPU core this process may use, one
    on a GPU), or, without a spec, ``translator`` in a thread."""
    max_search = limits.max_search_mb * 2**20
    if spec is None:
        work = partial(translate_batch, translator, max_response, max_search=max_search)
        return [InlineWorker(work, "worker 0")]
    count = limits.workers
    if count == 0:
        count = 1 if select_device(spec.device).type != "cpu" else usable_cores()
    factory = partial(load_work, spec, max_response, max_search)
    return [Worker(factory, limits.threads, f"worker {i}") for i in range(count)]


def settings(
    translator: Translator, overrides: Any, defaults: DecodingConfig, accepts: BackendCheck
) -> DecodingConfig:
    """A request's decoding settings, checked, also by the backend; 422 naming the option otherwise."""
    try:
        decoding = translator.decoding_with(overrides, base=defaults)
    except NMTError as e:
        raise BadRequest(422, **refusal_fields(str(e))) from None
    accepts(decoding)
    return decoding


class BackendCheck:
    """422 naming the option when the backend cannot decode with some settings (CTranslate2 cannot block
    n-grams in beam search as ours does): a call with no sentences decodes nothing but checks them. The
    answers of the last ``size`` distinct settings are kept: the call costs a few milliseconds (the
    torch backend readies the model) that most requests, with the same settings, need not pay."""

    def __init__(self, translator: Translator, size: int = 256):
        self.translator, self.size = translator, size
        self.known: OrderedDict[tuple, str | None] = OrderedDict()

    def __call__(self, decoding: DecodingConfig) -> None:
        key = astuple(decoding)
        if key in self.known:
            self.known.move_to_end(key)
        else:
            try:
                self.translator.search([], decoding)
                self.known[key] = None
            except NMTError as e:
                self.known[key] = str(e)
            if len(self.known) > self.size:
                self.known.popitem(last=False)
        if self.known[key] is not None:
            raise BadRequest(422, **refusal_fields(self.known[key]))


def refusal_fields(message: str) -> dict[str, str]:
    """The option that an NMTError about decoding settings names first (``decoding.X=...``)."""
    match = _DECODING_KEY.search(message)
    return {"field": match.group(1) if match else "decoding", "message": message}


def refusal(message: str) -> dict[str, str]:
    return BadRequest(422, **refusal_fields(message)).body()


def check_defaults(translator: Translator, defaults: DecodingConfig, limits: ServerLimits) -> None:
    """Refuse, at start, default settings that would make every request fail."""
    try:
        BackendCheck(translator)(defaults)
        check_scores(defaults, limits)
    except BadRequest as e:
        raise NMTError(f"decoding.{e.field}: {e.message}") from None
    if min(translator.max_source, defaults.max_len_b) > limits.max_output_tokens:
        raise NMTError(
            f"decoding.max_len_b={defaults.max_len_b} allows longer outputs than serve.max_output_tokens="
            f"{limits.max_output_tokens}: lower it or raise serve.max_output_tokens"
        )
    longest = [[0] * translator.max_source]  # only its length counts
    (needed,) = translator.search_bytes(longest, defaults)
    if needed > limits.max_search_mb * 2**20:
        raise NMTError(
            f"serve.max_search_mb={limits.max_search_mb:g}: searching one sentence of "
            f"{translator.max_source} subwords with the default decoding.beam_size={defaults.beam_size} "
            f"keeps {needed / 2**20:.1f} MB; raise it or lower decoding.beam_size"
        )


async def wait_for(request: Request, batcher: Batcher, job: Job, deadline: float) -> asyncio.Future | None:
    """The job's future once done; cancelled at ``deadline``; None when the client left first (the job
    is then dropped if no worker has it yet)."""
    loop = asyncio.get_running_loop()
    gone = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {job.future, gone}, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
    if job.future.done():
        return job.future
    batcher.cancel(job, "disconnected" if gone in done else "timeout")
    return None if gone in done else job.future


async def disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
