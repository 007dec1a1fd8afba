"""One side of an audit: an OpenAI-compatible server, asked with bounded concurrency and a timeout.

A request ends in one of three ways: a Completion (text, and the tokens with their top logprobs when
the server returns them), a Completion whose `error` says why the server refused it (an HTTP error
for that one request: compared as an answer that differs), or ServerStopped (the server cannot be
reached any more, or no longer answers in time), which ends the audit with a partial report.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx

from specdec.audit.prompts import AuditInputError, Prompt


@dataclass(frozen=True)
class SideConfig:
    name: str  # "reference" or "candidate"
    url: str  # the server's root, with or without a trailing /v1
    api_key: str | None = None
    model: str | None = None  # None: the first model the server lists
    extra_body: dict = field(default_factory=dict)  # merged into every request


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: tuple[str, ...] | None = None  # from logprobs, when returned
    top_logprobs: tuple[dict[str, float], ...] | None = None  # per token: {token: logprob}
    finish_reason: str | None = None
    error: str | None = None  # the server refused this request: "HTTP 500: ..."


class ServerStopped(Exception):
    """A side stopped answering: connection refused or dropped, or no answer within the timeout."""


class Side:
    """The client of one server. `logprobs` turns off for good once the server rejects the field."""

    def __init__(self, config: SideConfig, concurrency: int, timeout: float, top_logprobs: int):
        self.config = config
        self.root = config.url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self.slots = asyncio.Semaphore(concurrency)
        self.top_logprobs = top_logprobs
        self.logprobs = top_logprobs > 0
        self.model = config.model
        self.sent = 0  # requests answered (with a completion or a per-request error)
        self.returned_tokens = False  # whether any answer came with tokens (logprobs)

    async def close(self) -> None:
        await self.http.aclose()

    async def prepare(self) -> str:
        """Check that the server answers and learn the model id; a bad URL or key is bad input."""
        name, url = self.config.name, self.root + "/v1/models"
        try:
            reply = await self.http.get(url)
        except httpx.HTTPError as exc:
            raise AuditInputError(f"cannot reach the {name} server at {self.root} ({_why(exc)}); "
                                  "is it running, and is the URL right?") from None
        if reply.status_code in (401, 403):
            raise AuditInputError(f"the {name} server refused the API key (HTTP {reply.status_code}); "
                                  f"pass --{name}-api-key")
        if reply.status_code != 200:
            raise AuditInputError(f"the {name} server's {url} answered HTTP {reply.status_code}; "
                                  "is this an OpenAI-compatible server?")
        if self.model is None:
            models = [m.get("id") for m in _json(reply).get("data", []) if isinstance(m, dict)]
            if not models or not models[0]:
                raise AuditInputError(f"the {name} server lists no model at {url}; pass --model")
            self.model = str(models[0])
        return self.model

    async def complete(self, prompt: Prompt, params: dict) -> Completion:
        """One completion of `prompt` with sampling `params` (temperature, max_tokens, seed, ...)."""
        async with self.slots:
            reply = await self._post(prompt, params, self.logprobs)
            if reply.status_code >= 400 and self.logprobs and "logprob" in reply.text.lower():
                self.logprobs = False  # a server that cannot give logprobs: compare text from now on
                reply = await self._post(prompt, params, False)
        self.sent += 1
        if reply.status_code != 200:
            return Completion("", error=f"HTTP {reply.status_code}: {_error_message(reply)}")
        completion = _parse_choice(_json(reply), prompt.chat)
        self.returned_tokens |= completion.tokens is not None
        return completion

    async def _post(self, prompt: Prompt, params: dict, logprobs: bool) -> httpx.Response:
        body = {"model": self.model, **prompt.body(), **params, **self.config.extra_body}
        if logprobs:
            body.update({"logprobs": True, "top_logprobs": self.top_logprobs} if prompt.chat
                        else {"logprobs": self.top_logprobs})
        path = "/v1/chat/completions" if prompt.chat else "/v1/completions"
        try:
            return await self.http.post(self.root + path, json=body)
        except httpx.HTTPError as exc:
            raise ServerStopped(f"the {self.config.name} server at {self.root} stopped answering after "
                                f"{self.sent} requests ({_why(exc)})") from None


def _why(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "no answer within the timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _json(reply: httpx.Response) -> dict:
    try:
        data = reply.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _error_message(reply: httpx.Response) -> str:
    error = _json(reply).get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:200]
    return (reply.text or reply.reason_phrase)[:200]


def _parse_choice(data: dict, chat: bool) -> Completion:
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return Completion("", error="the answer has no choices")
    choice = choices[0]
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    tokens, tops = _parse_logprobs(choice.get("logprobs"), chat)
    return Completion(text or "", tokens, tops, choice.get("finish_reason"))


def _parse_logprobs(logprobs, chat: bool) -> tuple[tuple[str, ...] | None, tuple[dict, ...] | None]:
    """Token strings and per-token top logprobs, from either wire format (None where absent)."""
    if not isinstance(logprobs, dict):
        return None, None
    if chat:  # {"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]}
        content = logprobs.get("content")
        if not isinstance(content, list) or not content:
            return None, None
        tokens = tuple(str(t.get("token", "")) for t in content)
        tops = tuple({str(e["token"]): float(e["logprob"]) for e in t.get("top_logprobs") or []} for t in content)
        return tokens, (tops if any(tops) else None)
    tokens = logprobs.get("tokens")  # completions: {"tokens": [...], "top_logprobs": [{tok: lp}]}
    if not isinstance(tokens, list) or not tokens:
        return None, None
    tops = tuple({str(k): float(v) for k, v in (t or {}).items()} for t in logprobs.get("top_logprobs") or [])
    return tuple(str(t) for t in tokens), (tops if any(tops) else None)
