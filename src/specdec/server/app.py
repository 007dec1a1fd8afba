"""The FastAPI app: OpenAI-compatible endpoints, /health, /metrics, /speculation, and the web view at `/`.

Request handling, in order: the body's size and read time (`limits.BodyLimit`: 413, 408), API key,
then in a worker process (prep.py, so that neither the event loop and /health nor the engine thread
wait on it): the JSON, a prompt length bound from counts, validation (pydantic, strict, mapped to
OpenAI's 400 shape), fields this server does not honour (fields.py: 400), the model, the chat
template and tokenization; back here the drafter, the context check, then admission to the
engine's queue (503 when full or shutting down; every 503 says Retry-After). Only after all of that can a stream start, so every client
error gets a proper status code. The engine is a BatchedEngine over a slot model of the target
(worker.EngineWorker steps it on a thread of its own).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.drafters.base import Drafter
from specdec.drafters.registry import DraftMenu
from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.engine.controller import RequestK, Speculation
from specdec.generation import GenerationConfig, SpecStats
from specdec.runtime import Runtime, eos_ids, grammars_for, slot_target
from specdec.sampling import SamplingParams
from specdec.server import protocol as P
from specdec.server.connection import BodyLimit
from specdec.server.limits import Limits
from specdec.server.metrics import ServerMetrics
from specdec.server.prep import Preparer, PrepSettings
from specdec.server.structured import constraint_of
from specdec.server.worker import DoneEvent, EngineWorker, ErrorEvent, Job, TokenEvent

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs to the context
RETRY_AFTER = {"Retry-After": "1"}  # on every 503: a full queue or a drain passes; seconds to wait


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    default_draft: str
    k: int
    api_key: str | None = None
    max_queue: int = 16  # sequences that may wait for a slot; more get 503
    limits: Limits = Limits()
    max_num_seqs: int = 8  # sequences decoding together: the slot model's slots
    max_model_len: int | None = None  # a slot's positions (None: the target's own context, at most 4096)
    prefill_chunk: int = BatchConfig.prefill_chunk
    speculation: Speculation = RequestK()  # the controller of K per sequence per step (here: each request's k;
    # `specdec serve` passes its --speculation, auto by default)


class ServerState:
    """What the endpoints share: the runtime (the target, its tokenizer, the default drafter as
    loaded), the target as a slot model in a BatchedEngine, the drafters by name (the default one and
    `extra_drafters`, each sequence drafting with a fork of one), and the worker that steps the engine."""

    def __init__(self, config: ServerConfig, runtime: Runtime, extra_drafters: dict[str, Drafter] | None = None):
        self.config = config
        self.runtime = runtime
        self.loaded_drafters = {config.default_draft: runtime.drafter, **(extra_drafters or {})}
        self.metrics = ServerMetrics(config.model_name)
        self.slots = slot_target(runtime.target.model, config.max_num_seqs, config.max_model_len)
        self.slots.warm_up()  # before any request
        self.drafters = DraftMenu(runtime.target, self.slots.max_slots, max_length=self.slots.max_length)
        for name, drafter in self.loaded_drafters.items():
            self.drafters.adopt(name, drafter)  # forks share its weights: none is loaded twice
        self.engine = BatchedEngine(self.slots, self.drafters.factory(config.default_draft), eos_ids(runtime.target),
                                    runtime.decode, BatchConfig(config.prefill_chunk, config.speculation),
                                    grammars=grammars_for(runtime.target))
        self.kv_cache_bytes = int(getattr(self.slots, "kv_cache_bytes", 0))
        self.metrics.set_capacity(self.slots.max_slots, self.kv_cache_bytes)
        self.worker = EngineWorker(self.engine, self.drafters, config.max_queue, self.metrics)
        tokenizer = runtime.tokenizer
        self.token_text = lambda token_id: tokenizer.decode([token_id])  # logprobs name tokens with specials
        self.prepare = Preparer(PrepSettings(tokenizer, config.model_name, self.max_model_len,
                                             _longest_token_chars(tokenizer), self.slots.vocab_size))

    @property
    def max_model_len(self) -> int:
        return int(self.slots.max_length)


def _longest_token_chars(tokenizer) -> int | None:
    # Byte-level BPE writes a token as one character per byte, SentencePiece as its text: either way
    # no more characters than the token covers in the prompt (at least 1, for any 0-length oddity).
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else None
    return max(1, max(map(len, vocab))) if vocab else None


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        import anyio

        await anyio.to_thread.run_sync(state.worker.shutdown)
        state.prepare.close()

    app = FastAPI(title="specdec", description="OpenAI-compatible server with exact speculative decoding",
                  lifespan=lifespan)
    app.state.specdec = state
    limits = state.config.limits
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s,
                       on_refuse=state.metrics.reject)
    _install_error_handlers(app, state)
    auth = Depends(_check_api_key(state.config.api_key, state.metrics))

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        if not state.worker.accepting:
            return JSONResponse({"status": "shutting down"}, status_code=503, headers=RETRY_AFTER)
        return JSONResponse({"status": "ok", "in_flight": state.worker.in_system})

    @app.get("/metrics")
    async def metrics() -> Response:
        state.metrics.set_controller(state.engine.controller.summary())
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/speculation")
    async def speculation() -> dict:
        return _decision(state)

    @app.get("/v1/models", dependencies=[auth])
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(state)]}

    @app.post("/v1/completions", dependencies=[auth], openapi_extra=_body_schema(P.CompletionRequest))
    async def completions(raw: Request):
        prepared = await state.prepare(await raw.body(), chat=False)
        return await _serve(state, prepared.request, prepared.prompt_ids, chat=False, raw=raw)

    @app.post("/v1/chat/completions", dependencies=[auth], openapi_extra=_body_schema(P.ChatCompletionRequest))
    async def chat_completions(raw: Request):
        prepared = await state.prepare(await raw.body(), chat=True)
        return await _serve(state, prepared.request, prepared.prompt_ids, chat=True, raw=raw)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    _with_request_schemas(app)
    return app


REQUEST_MODELS = (P.CompletionRequest, P.ChatCompletionRequest)
SCHEMA_REF = "#/components/schemas/{model}"


def _body_schema(model: type[P.SamplingFields]) -> dict:
    """The OpenAPI request body of an endpoint that reads its body itself (server/prep.py)."""
    schema = model.model_json_schema(ref_template=SCHEMA_REF)
    schema.pop("$defs", None)  # in the document's components: _with_request_schemas
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _with_request_schemas(app: FastAPI) -> None:
    """Add the request models' nested schemas (their $defs) to the OpenAPI document's components."""
    generate = app.openapi

    def openapi() -> dict:
        document = generate()
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for model in REQUEST_MODELS:
            schemas.update(model.model_json_schema(ref_template=SCHEMA_REF).get("$defs", {}))
        return document

    app.openapi = openapi


# ---- errors and auth -----------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI, state: ServerState) -> None:
    def reply(error: P.APIError) -> JSONResponse:
        state.metrics.reject(error.status)
        headers = {**(error.headers or {}), **(RETRY_AFTER if error.status == 503 else {})}
        return JSONResponse(error.body(), status_code=error.status, headers=headers or None)

    @app.exception_handler(P.APIError)
    async def api_error(_: Request, exc: P.APIError):
        return reply(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError):
        return reply(P.validation_error(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(raw: Request, exc: StarletteHTTPException):
        message, code = str(exc.detail), None
        if exc.status_code == 405:  # Starlette's 405 carries the Allow header; say it in words too
            allowed = (exc.headers or {}).get("Allow", "")
            message, code = f"{raw.method} is not allowed on {raw.url.path}; use {allowed}", "method_not_allowed"
        return reply(P.APIError(exc.status_code, message, None, code, headers=exc.headers))


def _check_api_key(api_key: str | None, metrics: ServerMetrics):
    expected = api_key.encode() if api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        # compare_digest takes the same time wherever the first difference is: no timing oracle.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise P.APIError(401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                             None, "invalid_api_key")

    return check


# ---- requests to jobs ----------------------------------------------------------------------------


def _model_card(state: ServerState) -> dict:
    c = state.config
    return {"id": c.model_name, "object": "model", "created": P.now(), "owned_by": "specdec",
            "max_model_len": state.max_model_len,
            "specdec": {"target": state.runtime.target.name,  # the model's own name, e.g. "(random weights)"
                        "drafters": list(state.loaded_drafters), "draft": c.default_draft, "k": _server_k(c),
                        "speculation": c.speculation.name,
                        "max_k": P.MAX_K, "max_num_seqs": state.slots.max_slots, "max_queue": c.max_queue,
                        "kv_cache_bytes": state.kv_cache_bytes}}


def _decision(state: ServerState) -> dict:
    """The engine's latest step at its speculation boundary (what /metrics' speculation gauges show),
    for the web view: the controller, the decoding sequences in the pass, each one's draft budget and
    drafts verified (by place in the batch), the plan's reason, and the controller's summary."""
    trace, controller = state.engine.last_step, state.engine.controller
    fields = {"mode": controller.name, "batch_size": 0, "ks": [], "drafted": [], "reason": None}
    if trace is not None:
        fields.update(batch_size=len(trace.record.sequences), ks=list(trace.plan.budgets),
                      drafted=list(trace.record.drafted), reason=trace.plan.reason)
    fields["controller"] = controller.summary()
    return fields


def _make_job(state: ServerState, request: P.SamplingFields, prompt_ids: list[int], chat: bool) -> Job:
    c = state.config
    _check_fields(state, request)
    draft = request.draft or c.default_draft
    if draft not in state.loaded_drafters:
        raise P.APIError(400, f"draft: {draft!r} is not loaded; choose one of {list(state.loaded_drafters)}",
                         "draft", "invalid_value")
    max_tokens, param = _token_budget(state, request, len(prompt_ids), chat)
    constraint = constraint_of(request, state.engine.grammars)
    try:
        configs = tuple(GenerationConfig(max_new_tokens=max_tokens, k=_request_k(state, request),
                                         sampling=_sampling(request, i), stop=request.stop_strings(),
                                         ignore_eos=request.ignore_eos, logprobs=request.top_logprobs_count,
                                         constraint=constraint)
                        for i in range(request.n))
    except ValueError as exc:
        raise P.APIError(400, str(exc), None, "invalid_value") from None
    return Job(draft, prompt_ids, configs)


def _check_fields(state: ServerState, request: P.SamplingFields) -> None:
    """400 for fields that contradict each other, and for n beyond what the queue can ever hold."""
    if request.stream_options is not None and not request.stream:
        raise P.APIError(400, "stream_options: only with stream set to true", "stream_options", "invalid_value")
    if isinstance(request, P.ChatCompletionRequest) and request.top_logprobs is not None and not request.logprobs:
        raise P.APIError(400, "top_logprobs: needs logprobs set to true", "top_logprobs", "invalid_value")
    capacity = state.slots.max_slots + state.config.max_queue
    if request.n > capacity:
        raise P.APIError(400, f"n: {request.n} choices cannot fit this server's {capacity} sequences "
                              "(--max-num-seqs + --max-queue)", "n", "invalid_value")


def _request_k(state: ServerState, request: P.SamplingFields) -> int:
    """K for the request's sequences: its own `k`, else the server's; under --speculation auto|K the
    server's policy decides (its K, auto's most), and a request's `k` is not used."""
    own = request.k if isinstance(state.config.speculation, RequestK) else None
    return own or _server_k(state.config)


def _server_k(config: ServerConfig) -> int:
    """The server's K: -k, or under --speculation auto|K its K (auto: the most it drafts)."""
    return config.k if isinstance(config.speculation, RequestK) else config.speculation.k


def _sampling(request: P.SamplingFields, index: int) -> SamplingParams:
    """Choice `index` samples with seed + index (mod 2**64, as torch reads a negative seed): n choices
    of a seeded request are n reproducible, different sequences."""
    seed = None if request.seed is None else (request.seed + index) % 2**64
    return SamplingParams(temperature=request.temperature, top_k=max(0, request.top_k), top_p=request.top_p,
                          min_p=request.min_p, seed=seed)


def _token_budget(state: ServerState, request: P.SamplingFields, prompt_len: int, chat: bool) -> tuple[int, str]:
    """(max new tokens, the field that set it), or a 400 when the prompt and it cannot fit the context."""
    limit = state.max_model_len
    prompt_param = "messages" if chat else "prompt"
    if prompt_len >= limit:
        raise P.APIError(400, f"{prompt_param}: the prompt has {prompt_len} tokens; the context is {limit}",
                         prompt_param, "context_length_exceeded")
    max_tokens, param = _max_tokens(request)
    if max_tokens is None:
        max_tokens = limit - prompt_len if chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, limit - prompt_len)
    if prompt_len + max_tokens > limit:
        raise P.APIError(400, f"{param}: prompt ({prompt_len} tokens) + {param} ({max_tokens}) exceeds "
                              f"the context of {limit} tokens", param, "context_length_exceeded")
    return max_tokens, param


def _max_tokens(request: P.SamplingFields) -> tuple[int | None, str]:
    if request.max_completion_tokens is not None:
        return request.max_completion_tokens, "max_completion_tokens"
    return request.max_tokens, "max_tokens"


# ---- responses -----------------------------------------------------------------------------------


def _speculative(state: ServerState, job: Job, stats: list[SpecStats]) -> dict:
    """The request's speculation counts, summed over its choices."""
    total = SpecStats()
    for one in stats:
        for name in ("rounds", "drafted", "accepted", "generated", "draft_time", "verify_time", "other_time"):
            setattr(total, name, getattr(total, name) + getattr(one, name))
    decode = max((one.decode_time for one in stats), default=0.0)  # the choices ran side by side
    return {"draft": state.loaded_drafters[job.draft].name, "k": job.configs[0].k, "rounds": total.rounds,
            "drafted": total.drafted, "accepted": total.accepted, "acceptance_rate": total.acceptance_rate,
            "tokens_per_round": total.tokens_per_round,
            "tokens_per_second": total.generated / decode if decode > 0 else 0.0}


def _usage(state: ServerState, job: Job, stats: list[SpecStats]) -> dict:
    return P.usage(len(job.prompt_ids), sum(s.generated for s in stats), _speculative(state, job, stats))


def _logprobs(state: ServerState, job: Job, tokens, chat: bool, offset: int = 0) -> dict | None:
    if job.configs[0].logprobs is None:
        return None
    if chat:
        return P.chat_logprobs(list(tokens), state.token_text)
    return P.completion_logprobs(list(tokens), state.token_text, offset)


async def _serve(state: ServerState, request: P.SamplingFields, prompt_ids: list[int], chat: bool, raw: Request):
    job = _make_job(state, request, prompt_ids, chat)
    events = state.worker.submit(job)  # 503 here, before any byte is sent
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    if request.stream:
        stream = _sse(state, job, events, rid, chat, request.include_usage)
        return _JobStream(stream, lambda: state.worker.leave(job), media_type="text/event-stream",
                          headers={"Cache-Control": "no-cache"})
    watcher = asyncio.create_task(_cancel_on_disconnect(state, raw, job))
    done: dict[int, DoneEvent] = {}
    try:
        async for event in events:
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, DoneEvent):
                done[event.index] = event
    finally:
        watcher.cancel()
    if len(done) < job.n:
        raise P.APIError(503, "the request was dropped before it finished", None, "aborted")
    choice = P.chat_choice if chat else P.completion_choice
    choices = [choice(i, d.text, d.finish_reason, _logprobs(state, job, d.all_tokens, chat))
               for i, d in sorted(done.items())]
    build = P.chat_response if chat else P.completion_response
    return build(rid, state.config.model_name, choices, _usage(state, job, [d.stats for d in done.values()]))


class _JobStream(StreamingResponse):
    """A streamed answer that lets its job go however the response ends. The stream's own generator
    does so too, but only once it has started: a client that leaves between the headers and the
    first iteration cancels it unstarted, and its job would wait its turn, run, and never count as
    abandoned."""

    def __init__(self, content, leave: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self._leave = leave

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._leave()  # once more after a normal end: a no-op for a job that is done


async def _cancel_on_disconnect(state: ServerState, raw: Request, job: Job, every: float = 0.25) -> None:
    """A non-streamed request has no writes to fail on: poll for the client leaving."""
    while not job.cancelled.is_set():
        if await raw.is_disconnected():
            state.worker.leave(job)  # its sequences leave the batch at the next step (or never join it)
            return
        await asyncio.sleep(every)


def _sse_data(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _token_fields(state: ServerState, event: TokenEvent) -> dict:
    """A streamed chunk's `specdec` field: its first token's origin and round, its tokens, the running
    counts, and the draft tree of a tree round that starts in it (`tree`, docs/server.md)."""
    first = event.tokens[0] if event.tokens else {}
    fields = {"origin": first.get("origin"), "round": first.get("round"), "tokens": event.tokens, "stats": event.stats}
    if event.tree is not None:
        fields["tree"] = event.tree.fields(state.token_text)
    return fields


async def _sse(state: ServerState, job: Job, events: AsyncIterator[object], rid: str, chat: bool,
               include_usage: bool) -> AsyncIterator[str]:
    model = state.config.model_name
    offsets = [0] * job.n  # characters of each choice's text so far (completions' text_offset)

    def chunk(index: int, text: str | None, finish: str | None, extra: dict | None, tokens) -> str:
        logprobs = _logprobs(state, job, tokens, chat, offsets[index]) if tokens else None
        offsets[index] += len(text or "")
        if chat:
            delta = {} if text is None else {"content": text}
            return _sse_data(P.chat_chunk(rid, model, index, delta, finish, extra, logprobs))
        return _sse_data(P.completion_chunk(rid, model, index, text or "", finish, extra, logprobs))

    stats: list[SpecStats] = []
    try:
        if chat:
            for i in range(job.n):
                yield _sse_data(P.chat_chunk(rid, model, i, {"role": "assistant", "content": ""}, None, None))
        async for event in events:
            if isinstance(event, TokenEvent):
                yield chunk(event.index, event.text, None, _token_fields(state, event), event.tokens)
            elif isinstance(event, ErrorEvent):
                yield _sse_data(event.error.body())
                break
            elif isinstance(event, DoneEvent):
                stats.append(event.stats)
                yield chunk(event.index, None, event.finish_reason, {"tokens": event.tokens} if event.tokens else None,
                            event.tokens)
        else:
            if include_usage:
                obj = "chat.completion.chunk" if chat else "text_completion"
                yield _sse_data(P.usage_chunk(rid, model, obj, _usage(state, job, stats)))
        yield "data: [DONE]\n\n"
    finally:
        state.worker.leave(job)  # the client went away (or we are done): its sequences stop
