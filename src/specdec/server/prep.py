"""Request bodies to validated requests and prompt ids, in a worker process of their own.

`prepare(body, chat)` reads the JSON (no integer past Python's 4300 digits), refuses from cheap
counts what cannot fit the context (messages, characters, token ids) before any validation or
templating, validates the request model, refuses fields this server does not honour (fields.py),
checks the model name, then runs the chat template and the tokenizer. It raises APIError (400, 404)
for the client's mistakes.

It runs in a process, not on the event loop or a thread: JSON parsing, validation and templating
hold the GIL for tens of milliseconds on a 2 MB body, which on a thread would stall the engine
thread's every step and /health with it. `Preparer` bounds the work in flight: one worker process,
at most MAX_PENDING bodies waiting for it (more get 503 with Retry-After), at a lower CPU priority
than the server's (NICENESS): a flood of bodies takes the CPU the engine leaves, not the engine's.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from specdec.errors import SpecdecError
from specdec.server import protocol as P
from specdec.server.chat import encode_chat, encode_text, special_token_texts
from specdec.server.fields import refused_field

MAX_PENDING = 64  # bodies waiting for the worker process; past this, 503
NICENESS = 10  # the worker process yields the CPU to the engine: decoding first, reading bodies after


@dataclass(frozen=True)
class PrepSettings:
    """What preparing a request needs to know about the server (sent to the worker process once)."""

    tokenizer: Any
    model_name: str
    max_model_len: int  # a slot's positions: no prompt may have as many tokens
    longest_token_chars: int | None  # characters of the vocabulary's longest token (None: unknown)
    vocab_size: int


@dataclass(frozen=True)
class Prepared:
    request: P.SamplingFields
    prompt_ids: list[int]


class Preparer:
    """Runs `prepare` in one worker process; `await preparer(body, chat)` gives a Prepared or raises APIError.

    Bodies wait their turn smallest first: a flood of 2 MB bodies delays a normal request by at most
    the one body being read, not by the whole queue of them."""

    def __init__(self, settings: PrepSettings, max_pending: int = MAX_PENDING):
        self._settings = settings
        self._pool = self._start()
        self._pool.submit(_ready).result()  # start it now (imports take seconds), not at the first request
        self.max_pending, self.pending = max_pending, 0
        self._turns: list[tuple[int, int, asyncio.Future]] = []  # (body bytes, arrival, its turn) heap
        self._arrivals = itertools.count()
        self._busy = False

    async def __call__(self, body: bytes, chat: bool) -> Prepared:
        if self.pending >= self.max_pending:
            raise P.APIError(503, f"{self.pending} requests are being read; retry later", None, "queue_full")
        self.pending += 1
        turn = asyncio.get_running_loop().create_future()
        heapq.heappush(self._turns, (len(body), next(self._arrivals), turn))
        try:
            self._next()
            await turn
            return await asyncio.wrap_future(self._pool.submit(prepare, body, chat))
        except BrokenProcessPool:  # the worker died (killed, or a crash in a tokenizer): a new one for the next
            self._pool = self._start()
            raise P.APIError(503, "the process that reads requests stopped; retry", None, "worker_restarted") from None
        finally:
            self.pending -= 1
            if turn.done() and not turn.cancelled():  # it had the worker: hand it on
                self._busy = False
            self._next()

    def _next(self) -> None:
        """Give the worker to the smallest waiting body, if it is free (skipping clients that left)."""
        while not self._busy and self._turns:
            turn = heapq.heappop(self._turns)[2]
            if not turn.done():
                turn.set_result(None)
                self._busy = True

    def _start(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")  # no fork of a process with torch's threads running
        return ProcessPoolExecutor(1, mp_context=context, initializer=_install, initargs=(self._settings,))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_SETTINGS: PrepSettings | None = None
_SPECIALS: tuple[str, ...] = ()


def _install(settings: PrepSettings) -> None:
    """The worker process's start."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle (it drains)
    os.nice(NICENESS)
    install_here(settings)


def _ready() -> bool:
    return _SETTINGS is not None


def install_here(settings: PrepSettings) -> None:
    """What `prepare` reads, in this process (the worker's; tests call `prepare` directly)."""
    global _SETTINGS, _SPECIALS
    _SETTINGS, _SPECIALS = settings, special_token_texts(settings.tokenizer)


def prepare(body: bytes, chat: bool) -> Prepared:
    """The request a body holds and its prompt's token ids, or an APIError saying what is wrong."""
    settings = _SETTINGS
    obj = parse_body(body)
    check_counts(obj, chat, settings)
    model = P.ChatCompletionRequest if chat else P.CompletionRequest
    try:
        request = model.model_validate(obj)
    except ValidationError as exc:
        raise P.validation_error(list(exc.errors())) from None
    refused = refused_field(obj, chat)
    if refused:
        name, neutral = refused
        keep = "leave it out" + ("" if neutral is None else f" or send {json.dumps(neutral)}")
        raise P.APIError(400, f"{name}: not supported by this server (it would change the output, and no "
                              f"field is silently ignored); {keep}", name, "unsupported_parameter")
    if request.model is not None and request.model != settings.model_name:
        raise P.APIError(404, f"model {request.model!r} does not exist; this server serves {settings.model_name!r}",
                         "model", "model_not_found")
    ids = _chat_ids(request, settings) if chat else _completion_ids(request, settings)
    return Prepared(request, ids)


def parse_body(body: bytes) -> dict:
    """The body's JSON object; 400 for bad JSON, a body that is no object, an integer too long to be a value."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise P.APIError(400, f"the body is not valid JSON: {exc}", None, "invalid_json") from None
    except ValueError:  # the one other ValueError of json.loads: an integer past Python's digit limit
        raise P.APIError(400, f"the body has an integer of more than {sys.get_int_max_str_digits()} digits; "
                              "no field takes one", None, "integer_too_long") from None
    if not isinstance(obj, dict):
        raise P.APIError(400, "the request body must be a JSON object", None, "invalid_body")
    return obj


def check_counts(obj: dict, chat: bool, settings: PrepSettings) -> None:
    """Refuse, from counts alone, a prompt that cannot fit: more messages or token ids than the
    context has tokens (a message takes at least one token in any template that marks turns), or
    more characters than the context's tokens can cover."""
    limit = settings.max_model_len
    if chat:
        messages = obj.get("messages")
        if isinstance(messages, list) and len(messages) > limit:
            raise P.APIError(400, f"messages: {len(messages)} messages cannot fit the context of {limit} tokens "
                                  "(each takes at least one)", "messages", "context_length_exceeded")
        if isinstance(messages, list):
            check_chars(sum(map(_content_chars, messages)), "messages", settings)
        return
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and len(prompt) > limit and isinstance(prompt[0], int):
        raise P.APIError(400, f"prompt: {len(prompt)} tokens cannot fit the context of {limit} tokens",
                         "prompt", "context_length_exceeded")
    if isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str):
        raise P.APIError(400, "prompt: give one string (batches of prompts are not served)", "prompt", "invalid_value")
    if isinstance(prompt, str):
        check_chars(len(prompt), "prompt", settings)


def check_chars(chars: int, param: str, settings: PrepSettings) -> None:
    """400 for text with more characters than the context can hold (each token covers at most the longest's)."""
    if settings.longest_token_chars is not None and chars > settings.max_model_len * settings.longest_token_chars:
        raise P.APIError(400, f"{param}: {chars} characters cannot fit the context of {settings.max_model_len} "
                              f"tokens (a token covers at most {settings.longest_token_chars} characters here)",
                         param, "context_length_exceeded")


def _content_chars(message: object) -> int:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part["text"]) for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return 0


def _chat_ids(request: P.ChatCompletionRequest, settings: PrepSettings) -> list[int]:
    if not request.messages:
        raise P.APIError(400, "messages: give at least one message", "messages", "invalid_value")
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    return _encoded(lambda: encode_chat(settings.tokenizer, messages, _SPECIALS), "messages")


def _completion_ids(request: P.CompletionRequest, settings: PrepSettings) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        vocab = settings.vocab_size
        if any(not 0 <= x < vocab for x in prompt):
            raise P.APIError(400, f"prompt: token ids must be in [0, {vocab})", "prompt", "invalid_value")
        return list(prompt)
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise P.APIError(400, "prompt: give one string (batches of prompts are not served)", "prompt",
                             "invalid_value")
        prompt = prompt[0]
    return _encoded(lambda: encode_text(settings.tokenizer, prompt), "prompt")


def _encoded(encode, param: str) -> list[int]:
    try:
        ids = encode()
    except (SpecdecError, ValueError, TypeError) as exc:  # empty text, no chat template, ...
        raise P.APIError(400, f"{param}: {exc}", param, "invalid_value") from None
    if not ids:
        raise P.APIError(400, f"{param}: the prompt is empty", param, "invalid_value")
    return ids
