"""The OpenAI wire format: request models (validated by pydantic), response builders, error bodies.

Unknown request fields are ignored, as OpenAI-compatible servers do, except those that would change
the output (penalties, `logit_bias`, `response_format`, ...: fields.py lists them): a value other
than their neutral one gets a 400 naming the field, never a silent "no". Two extension fields, `k` and `draft`,
let one request choose K and the drafter (among those the server was started with).
Types are strict (no "8" for 8, no true for 1, no "yes" for true; an integer is a number), numbers
finite, and text valid Unicode, so that a wrong request gets a 400 naming its field, never a guess.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from specdec.stops import stop_list_problem

MAX_K = 64
MAX_N = 16  # choices per request (each a sequence of the batch)
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI allows for chat
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes (negative s acts as 2**64 + s)
STRICT = ConfigDict(extra="ignore", strict=True)


def _valid_unicode(text: str) -> str:
    """JSON's \\uD800-style escapes can carry half a surrogate pair, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone surrogate {ascii(text[exc.start])} at character {exc.start}; "
                         "send valid Unicode (escape a character outside the BMP as a surrogate pair)") from None
    return text


def _seed_in_range(seed: int | None) -> int | None:
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise ValueError(f"must be a 64-bit integer, from -2**63 to 2**64 - 1, got {seed}")
    return seed


def _stops_within_bounds(stop: str | list[str] | None) -> str | list[str] | None:
    problem = stop_list_problem((stop,) if isinstance(stop, str) else tuple(stop or ()))
    if problem:
        raise ValueError(problem)
    return stop


Text = Annotated[str, AfterValidator(_valid_unicode)]
Seed = Annotated[Union[int, None], AfterValidator(_seed_in_range)]
Stop = Annotated[Union[Text, list[Text], None], AfterValidator(_stops_within_bounds)]


def Number(default: float, **bounds) -> float:  # noqa: N802 - a Field, spelled like a type
    return Field(default=default, allow_inf_nan=False, **bounds)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = STRICT

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, description="as max_tokens; it wins when both are set")
    temperature: float = Number(1.0, ge=0.0, le=2.0)
    top_p: float = Number(1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # -1 and 0 both mean off (vLLM uses -1)
    min_p: float = Number(0.0, ge=0.0, lt=1.0)
    seed: Seed = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_N, description="choices: n sequences of the batch, choice i with seed + i")
    ignore_eos: bool = False
    k: int | None = Field(default=None, ge=1, le=MAX_K, description="extension: draft tokens per round")
    draft: str | None = Field(default=None, description="extension: which drafter (see /v1/models)")

    # Structured output (response_format, structured_outputs, guided_*): read by server/structured.py.
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    @property
    def top_logprobs_count(self) -> int | None:
        """How many alternatives each token's logprobs list (None: no logprobs asked for)."""
        return None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    # A string, a one-element list of strings, or a list of token ids (batches are not served).
    prompt: Union[Text, list[Text], list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS,
                                 description="each token's log-probability under p, and this many alternatives")

    @property
    def top_logprobs_count(self) -> int | None:
        return self.logprobs


class ContentPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[Text, list[ContentPart], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @property
    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# ---- errors --------------------------------------------------------------------------------------

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
               503: "service_unavailable_error"}
JSON_TYPES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array",
              dict: "an object", type(None): "null"}


class APIError(Exception):
    """An error the client caused (or a full queue): becomes the OpenAI error body with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers  # e.g. Allow on a 405

    def __reduce__(self):  # it crosses from the worker process that reads request bodies (server/prep.py)
        return APIError, (self.status, self.message, self.param, self.code, self.headers)

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def validation_error(errors: list[dict]) -> APIError:
    """pydantic's error list -> one 400 that names the first offending field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    # Of a union's failed members, the one that got deepest into the value says what was wrong.
    first = max((e for e in errors if _path(e)[:1] == _path(first)[:1]), key=lambda e: len(_path(e)), default=first)
    loc = _path(first)
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('msg')}", None, "invalid_json")
    if not loc:
        return APIError(400, "the request body must be a JSON object", None, "invalid_body")
    if kind in ("model_attributes_type", "dict_type", "model_type"):
        got = JSON_TYPES.get(type(first.get("input")), "another type")
        return APIError(400, f"{'.'.join(loc)}: must be an object, got {got}", loc[0], "invalid_value")
    param = loc[0]
    message = str(first.get("msg", "")).removeprefix("Value error, ")
    if kind.endswith("_type") and "input" in first:  # strict types: say what came instead
        message += f", got {JSON_TYPES.get(type(first['input']), 'another type')}"
    return APIError(400, f"{'.'.join(loc)}: {message}", param, "invalid_value")


def _path(error: dict) -> list[str]:
    return [str(part) for part in error.get("loc", ()) if part != "body" and not _union_tag(part)]


def _union_tag(part) -> bool:
    """pydantic puts the union member it tried into loc ('str', 'list[int]', 'function-after[...]');
    a user wants only field names and indices."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "none")
                                      or part[:1].isupper())


# ---- responses -----------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, speculative: dict) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "speculative": speculative}


def completion_choice(index: int, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def chat_choice(index: int, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish}


def completion_response(rid: str, model: str, choices: list[dict], usage_: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": now(), "model": model, "choices": choices,
            "usage": usage_}


def chat_response(rid: str, model: str, choices: list[dict], usage_: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": now(), "model": model, "choices": choices,
            "usage": usage_}


def completion_chunk(rid: str, model: str, index: int, text: str, finish: str | None, extra: dict | None,
                     logprobs: dict | None = None) -> dict:
    choice = completion_choice(index, text, finish, logprobs)
    if extra:
        choice["specdec"] = extra
    return {"id": rid, "object": "text_completion", "created": now(), "model": model, "choices": [choice]}


def chat_chunk(rid: str, model: str, index: int, delta: dict, finish: str | None, extra: dict | None,
               logprobs: dict | None = None) -> dict:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    if extra:
        choice["specdec"] = extra
    return {"id": rid, "object": "chat.completion.chunk", "created": now(), "model": model,
            "choices": [choice]}


def usage_chunk(rid: str, model: str, obj: str, usage_: dict) -> dict:
    return {"id": rid, "object": obj, "created": now(), "model": model, "choices": [], "usage": usage_}


# ---- logprobs, from the token records of server/streams.py ({"id", "logprob", "top_logprobs": [[id, lp]]}) --


def chat_logprobs(tokens: list[dict], text_of) -> dict:
    """Chat's logprobs object: per token its text, log-probability, UTF-8 bytes and alternatives."""
    def entry(token_id: int, logprob: float) -> dict:
        text = text_of(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = [{**entry(t["id"], t["logprob"]), "top_logprobs": [entry(i, lp) for i, lp in t["top_logprobs"]]}
               for t in tokens]
    return {"content": content, "refusal": None}


def completion_logprobs(tokens: list[dict], text_of, offset: int = 0) -> dict:
    """The completions (legacy) logprobs object; text_offset counts characters from `offset`."""
    texts = [text_of(t["id"]) for t in tokens]
    offsets = [offset + sum(len(x) for x in texts[:i]) for i in range(len(texts))]
    return {"tokens": texts, "token_logprobs": [t["logprob"] for t in tokens],
            "top_logprobs": [{text_of(i): lp for i, lp in t["top_logprobs"]} for t in tokens],
            "text_offset": offsets}
