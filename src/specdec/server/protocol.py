"""The OpenAI wire format: request models (validated by pydantic), response builders, error bodies.

Unknown request fields are ignored, as OpenAI-compatible servers do. Two extension fields, `k`
and `draft`, let one request choose K and the drafter (among those the server was started with).
"""

from __future__ import annotations

import time
import uuid
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

MAX_K = 64


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # -1 and 0 both mean off (vLLM uses -1)
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False
    k: int | None = Field(default=None, ge=1, le=MAX_K, description="extension: draft tokens per round")
    draft: str | None = Field(default=None, description="extension: which drafter (see /v1/models)")

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    # A string, a one-element list of strings, or a list of token ids (batches are not served).
    prompt: Union[str, list[str], list[int]]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1)


# ---- errors --------------------------------------------------------------------------------------

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               503: "service_unavailable_error"}


class APIError(Exception):
    """An error the client caused (or a full queue): becomes the OpenAI error body with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def validation_error(errors: list[dict]) -> APIError:
    """pydantic's error list -> one 400 that names the first offending field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('msg')}", None, "invalid_json")
    if not loc or kind in ("model_attributes_type", "dict_type"):
        return APIError(400, "the request body must be a JSON object", None, "invalid_body")
    # pydantic adds the union member (e.g. 'str', 'list[int]') to loc; the field is what a user wants.
    param = loc[0]
    return APIError(400, f"{'.'.join(loc)}: {first.get('msg')}", param, "invalid_value")


# ---- responses -----------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, speculative: dict) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "speculative": speculative}


def completion_response(rid: str, model: str, text: str, finish: str, usage_: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": now(), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": usage_}


def chat_response(rid: str, model: str, text: str, finish: str, usage_: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": now(), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish}],
            "usage": usage_}


def completion_chunk(rid: str, model: str, text: str, finish: str | None, extra: dict | None) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if extra:
        choice["specdec"] = extra
    return {"id": rid, "object": "text_completion", "created": now(), "model": model, "choices": [choice]}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None, extra: dict | None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if extra:
        choice["specdec"] = extra
    return {"id": rid, "object": "chat.completion.chunk", "created": now(), "model": model,
            "choices": [choice]}


def usage_chunk(rid: str, model: str, obj: str, usage_: dict) -> dict:
    return {"id": rid, "object": obj, "created": now(), "model": model, "choices": [], "usage": usage_}
