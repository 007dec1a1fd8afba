"""Issue 58's holes, closed: bounded stop lists, chat bodies refused from counts before templating,
no silently ignored field, errors that name what was wrong, HEAD /health, Retry-After on 503.

Over HTTP against the shared tiny-model server (context 160), and `prep.prepare` in process.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from specdec.server import prep
from specdec.server.protocol import APIError
from specdec.stops import MAX_STOP_CHARS, MAX_STOPS
from tests.server_tiny_model import shared_server

COMP = "/v1/completions"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server():
    return shared_server("--max-queue", "2")


def post(server, path: str, body) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=60)


def error_of(r: httpx.Response, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and (param is None or error["message"].startswith(param)), error
    return error


def body_for(path: str, **fields) -> dict:
    return {"max_tokens": 2, **({"messages": MSG} if path == CHAT else {"prompt": "hello"}), **fields}


# ---- 1. stop lists are bounded --------------------------------------------------------------------


@pytest.mark.parametrize("stop,limit", [(["x"] * (MAX_STOPS + 1), MAX_STOPS),
                                        (["y" * (MAX_STOP_CHARS + 1)], MAX_STOP_CHARS),
                                        ("z" * (MAX_STOP_CHARS + 1), MAX_STOP_CHARS)], ids=["count", "length", "one"])
def test_a_stop_list_past_its_bounds_is_refused_naming_the_limit(server, stop, limit):
    error = error_of(post(server, COMP, body_for(COMP, stop=stop)), 400, "stop")
    assert str(limit) in error["message"]


def test_a_stop_list_within_its_bounds_is_served(server):
    r = post(server, COMP, body_for(COMP, stop=["q" * MAX_STOP_CHARS] * MAX_STOPS))
    assert r.status_code == 200, r.text


# ---- 2. bodies are refused from counts, before validation or templating --------------------------


class NoTemplate:
    """A tokenizer that must not be reached."""

    all_special_tokens = ()

    def apply_chat_template(self, *args, **kwargs):
        raise AssertionError("templated a body that its counts refuse")

    __call__ = apply_chat_template


@pytest.fixture
def in_process():
    prep.install_here(prep.PrepSettings(NoTemplate(), "tiny", max_model_len=100, longest_token_chars=10,
                                        vocab_size=1000))


@pytest.mark.parametrize("chat,body,param", [
    (True, {"messages": [{"role": "user", "content": ""}] * 101}, "messages"),
    (True, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a" * 1001}]}]}, "messages"),
    (False, {"prompt": list(range(101))}, "prompt"),
    (False, {"prompt": "b" * 1001}, "prompt"),
], ids=["messages", "characters", "token-ids", "prompt-characters"])
def test_a_body_that_cannot_fit_is_refused_before_it_is_templated(in_process, chat, body, param):
    with pytest.raises(APIError) as refused:
        prep.prepare(json.dumps(body).encode(), chat)
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, param, "context_length_exceeded")


def test_a_body_of_many_messages_gets_400_over_http(server):
    error = error_of(post(server, CHAT, {"messages": [{"role": "user", "content": ""}] * 2000}), 400, "messages")
    assert error["code"] == "context_length_exceeded" and "2000 messages" in error["message"]


# ---- 4. no field is silently ignored -------------------------------------------------------------

REFUSED = [(CHAT, "best_of", 2), (CHAT, "echo", True), (COMP, "top_logprobs", 2),
           (CHAT, "truncate_prompt_tokens", 5), (COMP, "include_stop_str_in_output", True),
           (CHAT, "skip_special_tokens", False), (CHAT, "add_generation_prompt", False),
           (CHAT, "continue_final_message", True), (CHAT, "chat_template", "{{ messages }}"),
           (CHAT, "chat_template_kwargs", {"enable_thinking": False}), (COMP, "typical_p", 0.5),
           (CHAT, "repeat_penalty", 1.1), (COMP, "mirostat", 2), (COMP, "tfs_z", 0.9), (CHAT, "top_a", 0.2),
           (COMP, "dry_multiplier", 0.8), (CHAT, "xtc_probability", 0.5), (COMP, "dynatemp_range", 0.5),
           (COMP, "epsilon_cutoff", 0.01), (CHAT, "eta_cutoff", 0.01), (COMP, "penalty_alpha", 0.6),
           (CHAT, "no_repeat_ngram_size", 3)]


@pytest.mark.parametrize("path,field,value", REFUSED, ids=[f"{p.split('/')[-1]}-{f}" for p, f, _ in REFUSED])
def test_a_field_this_server_does_not_honour_is_refused_by_name(server, path, field, value):
    error = error_of(post(server, path, body_for(path, **{field: value})), 400, field)
    assert error["code"] == "unsupported_parameter"


@pytest.mark.parametrize("path,fields", [
    (CHAT, {"best_of": 1, "echo": False, "skip_special_tokens": True, "add_generation_prompt": True,
            "typical_p": 1.0, "mirostat": 0, "chat_template_kwargs": {}}),
    (COMP, {"user": "u1", "metadata": {"a": "b"}, "store": False, "service_tier": "auto", "top_logprobs": None}),
], ids=["neutral", "ignored"])
def test_neutral_values_and_ignored_fields_are_served(server, path, fields):
    assert post(server, path, body_for(path, **fields)).status_code == 200


def test_max_completion_tokens_bounds_a_completion(server):
    r = post(server, COMP, {"prompt": "hello", "max_completion_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_stream_options_without_stream_is_refused(server):
    error_of(post(server, CHAT, body_for(CHAT, stream_options={"include_usage": True})), 400, "stream_options")


# ---- 6. errors say what was wrong ----------------------------------------------------------------


@pytest.mark.parametrize("path,body,param,words", [
    (CHAT, body_for(CHAT, stream=True, stream_options="x"), "stream_options", "must be an object, got a string"),
    (CHAT, {"messages": ["hello"]}, "messages", "messages.0: must be an object, got a string"),
    (CHAT, {"messages": [MSG[0], 5]}, "messages", "messages.1: must be an object, got an integer"),
], ids=["stream_options", "message-string", "message-number"])
def test_a_value_that_is_no_object_is_named(server, path, body, param, words):
    assert words in error_of(post(server, path, body), 400, param)["message"]


def test_a_5000_digit_integer_gets_a_clear_400_with_a_code(server):
    r = post(server, COMP, '{"prompt": "hello", "seed": ' + "9" * 5000 + "}")
    error = error_of(r, 400, None)
    assert error["code"] == "integer_too_long" and "digits" in error["message"]


def test_head_health_answers_200(server):
    r = httpx.head(server.url + "/health", timeout=30)
    assert r.status_code == 200 and r.content == b""


@pytest.fixture(scope="module")
def one_slot_server():
    return shared_server("--max-queue", "0", "--max-num-seqs", "1")


def test_a_503_says_when_to_retry(one_slot_server):
    url = one_slot_server.url
    started = threading.Event()

    def hold_the_slot() -> None:
        body = {"prompt": "hello", "max_tokens": 150, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + COMP, json=body, timeout=120) as r:
            for _ in r.iter_lines():
                started.set()

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    assert started.wait(60)
    r = httpx.post(url + COMP, json={"prompt": "hello", "max_tokens": 2}, timeout=60)
    holder.join(120)
    error_of(r, 503, None)
    assert int(r.headers["retry-after"]) >= 1
