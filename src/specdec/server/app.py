"""The FastAPI app: OpenAI-compatible endpoints, /health, /metrics, and the web view at `/`.

Request handling, in order: the body's size and read time (`limits.BodyLimit`: 413, 408), API key,
validation (pydantic, strict, mapped to OpenAI's 400 shape), model and drafter lookup, a prompt
length bound by characters, tokenization (on a thread, so the event loop and /health never wait on
it) and the context check, then admission to the engine's queue (503 when full or shutting down).
Only after all of that can a stream start, so every client error gets a proper status code.
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

from specdec.engine import GenerationConfig, SpecStats
from specdec.errors import SpecdecError
from specdec.runtime import Runtime
from specdec.sampling import SamplingParams
from specdec.server import protocol as P
from specdec.server.connection import BodyLimit
from specdec.server.limits import Limits
from specdec.server.metrics import ServerMetrics
from specdec.server.worker import DoneEvent, EngineWorker, ErrorEvent, Job, TokenEvent

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs to the context


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    default_draft: str
    k: int
    api_key: str | None = None
    max_queue: int = 16
    limits: Limits = Limits()


class ServerState:
    """What the endpoints share: one runtime per drafter (all on the same target), one engine worker."""

    def __init__(self, config: ServerConfig, runtimes: dict[str, Runtime]):
        self.config = config
        self.runtimes = runtimes
        self.metrics = ServerMetrics(config.model_name)
        self.worker = EngineWorker(config.max_queue, self.metrics)
        self.longest_token_chars = _longest_token_chars(self.default_runtime.tokenizer)

    @property
    def default_runtime(self) -> Runtime:
        return self.runtimes[self.config.default_draft]

    @property
    def max_model_len(self) -> int:
        return int(self.default_runtime.engine.target.max_length)

    @property
    def max_prompt_chars(self) -> int | None:
        """No text longer than this fits the context: each token covers at most the longest token's characters."""
        return None if self.longest_token_chars is None else self.max_model_len * self.longest_token_chars


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

    app = FastAPI(title="specdec", description="OpenAI-compatible server with exact speculative decoding",
                  lifespan=lifespan)
    app.state.specdec = state
    limits = state.config.limits
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s,
                       on_refuse=state.metrics.reject)
    _install_error_handlers(app, state)
    auth = Depends(_check_api_key(state.config.api_key, state.metrics))

    @app.get("/health")
    async def health() -> Response:
        if not state.worker.accepting:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok", "in_flight": state.worker.in_system})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[auth])
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(state)]}

    @app.post("/v1/completions", dependencies=[auth])
    async def completions(request: P.CompletionRequest, raw: Request):
        _check_model(state, request)
        return await _serve(state, request, await _completion_prompt(state, request), chat=False, raw=raw)

    @app.post("/v1/chat/completions", dependencies=[auth])
    async def chat_completions(request: P.ChatCompletionRequest, raw: Request):
        _check_model(state, request)
        return await _serve(state, request, await _chat_prompt(state, request), chat=True, raw=raw)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


# ---- errors and auth -----------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI, state: ServerState) -> None:
    def reply(error: P.APIError) -> JSONResponse:
        state.metrics.reject(error.status)
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

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
            "specdec": {"drafters": list(state.runtimes), "draft": c.default_draft, "k": c.k,
                        "max_k": P.MAX_K}}


async def _completion_prompt(state: ServerState, request: P.CompletionRequest) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        _check_prompt_size(state, len(prompt), "prompt", "tokens")
        vocab = state.default_runtime.engine.target.vocab_size
        if any(not 0 <= x < vocab for x in prompt):
            raise P.APIError(400, f"prompt: token ids must be in [0, {vocab})", "prompt", "invalid_value")
        return list(prompt)
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise P.APIError(400, "prompt: give one string (batches of prompts are not served)", "prompt",
                             "invalid_value")
        prompt = prompt[0]
    _check_prompt_size(state, len(prompt), "prompt", "characters")
    return await _tokenize(lambda: state.default_runtime.encode(prompt, chat=False), "prompt")


async def _chat_prompt(state: ServerState, request: P.ChatCompletionRequest) -> list[int]:
    if not request.messages:
        raise P.APIError(400, "messages: give at least one message", "messages", "invalid_value")
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    _check_prompt_size(state, sum(len(m["content"]) for m in messages), "messages", "characters")
    return await _tokenize(lambda: state.default_runtime.encode_messages(messages), "messages")


def _check_prompt_size(state: ServerState, size: int, param: str, unit: str) -> None:
    """Refuse a prompt that cannot fit before any tokenizing: `size` tokens, or characters (a bound)."""
    limit = state.max_model_len
    bound = limit if unit == "tokens" else state.max_prompt_chars
    if bound is not None and size > bound:
        why = "" if unit == "tokens" else f" (a token covers at most {state.longest_token_chars} characters here)"
        raise P.APIError(400, f"{param}: {size} {unit} cannot fit the context of {limit} tokens{why}",
                         param, "context_length_exceeded")


async def _tokenize(encode, param: str) -> list[int]:
    try:
        ids = await asyncio.to_thread(encode)  # a long prompt must not stall the event loop (and /health)
    except (SpecdecError, ValueError, TypeError) as exc:  # empty text, no chat template, ...
        raise P.APIError(400, f"{param}: {exc}", param, "invalid_value") from None
    if not ids:
        raise P.APIError(400, f"{param}: the prompt is empty", param, "invalid_value")
    return ids


def _check_model(state: ServerState, request: P.SamplingFields) -> None:
    name = state.config.model_name
    if request.model is not None and request.model != name:
        raise P.APIError(404, f"model {request.model!r} does not exist; this server serves {name!r}",
                         "model", "model_not_found")


def _make_job(state: ServerState, request: P.SamplingFields, prompt_ids: list[int], chat: bool) -> Job:
    c = state.config
    if request.n != 1:
        raise P.APIError(400, f"n: only n=1 is served, got {request.n}", "n", "invalid_value")
    draft = request.draft or c.default_draft
    if draft not in state.runtimes:
        raise P.APIError(400, f"draft: {draft!r} is not loaded; choose one of {list(state.runtimes)}",
                         "draft", "invalid_value")
    limit = state.max_model_len
    prompt_param = "messages" if chat else "prompt"
    if len(prompt_ids) >= limit:
        raise P.APIError(400, f"{prompt_param}: the prompt has {len(prompt_ids)} tokens; the context is {limit}",
                         prompt_param, "context_length_exceeded")
    max_tokens, param = _max_tokens(request, chat)
    if max_tokens is None:
        max_tokens = limit - len(prompt_ids) if chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, limit - len(prompt_ids))
    if len(prompt_ids) + max_tokens > limit:
        raise P.APIError(400, f"{param}: prompt ({len(prompt_ids)} tokens) + {param} ({max_tokens}) exceeds "
                              f"the context of {limit} tokens", param, "context_length_exceeded")
    try:
        sampling = SamplingParams(temperature=request.temperature, top_k=max(0, request.top_k),
                                  top_p=request.top_p, min_p=request.min_p, seed=request.seed)
        config = GenerationConfig(max_new_tokens=max_tokens, k=request.k or c.k, sampling=sampling,
                                  stop=request.stop_strings(), ignore_eos=request.ignore_eos)
    except ValueError as exc:
        raise P.APIError(400, str(exc), None, "invalid_value") from None
    return Job(state.runtimes[draft], prompt_ids, config)


def _max_tokens(request: P.SamplingFields, chat: bool) -> tuple[int | None, str]:
    if chat and getattr(request, "max_completion_tokens", None) is not None:
        return request.max_completion_tokens, "max_completion_tokens"
    return request.max_tokens, "max_tokens"


# ---- responses -----------------------------------------------------------------------------------


def _speculative(job: Job, stats: SpecStats) -> dict:
    return {"draft": job.runtime.drafter.name, "k": job.config.k, "rounds": stats.rounds,
            "drafted": stats.drafted, "accepted": stats.accepted, "acceptance_rate": stats.acceptance_rate,
            "tokens_per_round": stats.tokens_per_round, "tokens_per_second": stats.tokens_per_second}


def _usage(job: Job, stats: SpecStats) -> dict:
    return P.usage(len(job.prompt_ids), stats.generated, _speculative(job, stats))


async def _serve(state: ServerState, request: P.SamplingFields, prompt_ids: list[int], chat: bool, raw: Request):
    job = _make_job(state, request, prompt_ids, chat)
    events = state.worker.submit(job)  # 503 here, before any byte is sent
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    model = state.config.model_name
    if request.stream:
        return StreamingResponse(_sse(job, events, rid, model, chat, request.include_usage, state.worker.leave),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    watcher = asyncio.create_task(_cancel_on_disconnect(state, raw, job))
    try:
        async for event in events:
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, DoneEvent):
                build = P.chat_response if chat else P.completion_response
                return build(rid, model, event.text, event.finish_reason, _usage(job, event.stats))
    finally:
        watcher.cancel()
    raise P.APIError(503, "the request was dropped before it finished", None, "aborted")


async def _cancel_on_disconnect(state: ServerState, raw: Request, job: Job, every: float = 0.25) -> None:
    """A non-streamed request has no writes to fail on: poll for the client leaving."""
    while not job.cancelled.is_set():
        if await raw.is_disconnected():
            state.worker.leave(job)  # the engine thread stops after this round (or never starts it)
            return
        await asyncio.sleep(every)


def _sse_data(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _sse(job: Job, events: AsyncIterator[object], rid: str, model: str, chat: bool,
               include_usage: bool, leave: Callable[[Job], None]) -> AsyncIterator[str]:
    def chunk(text: str | None, finish: str | None, extra: dict | None) -> str:
        if chat:
            delta = {} if text is None else {"content": text}
            return _sse_data(P.chat_chunk(rid, model, delta, finish, extra))
        return _sse_data(P.completion_chunk(rid, model, text or "", finish, extra))

    try:
        if chat:
            yield _sse_data(P.chat_chunk(rid, model, {"role": "assistant", "content": ""}, None, None))
        async for event in events:
            if isinstance(event, TokenEvent):
                first = event.tokens[0] if event.tokens else {}
                yield chunk(event.text, None, {"origin": first.get("origin"), "round": first.get("round"),
                                               "tokens": event.tokens, "stats": event.stats})
            elif isinstance(event, ErrorEvent):
                yield _sse_data(event.error.body())
                break
            elif isinstance(event, DoneEvent):
                yield chunk(None, event.finish_reason, {"tokens": event.tokens} if event.tokens else None)
                if include_usage:
                    obj = "chat.completion.chunk" if chat else "text_completion"
                    yield _sse_data(P.usage_chunk(rid, model, obj, _usage(job, event.stats)))
        yield "data: [DONE]\n\n"
    finally:
        leave(job)  # the client went away (or we are done): stop after this round
