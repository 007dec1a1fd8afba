"""Bad input gets OpenAI-shaped errors with the right status, never a 5xx."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server_tiny_model import build_tiny_models, shared_server, tiny_root, torch_threads

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hello"}]
LONG_PROMPT = " ".join(["the cat"] * 200)  # 400 tokens: past the tiny model's 160-token context

# (name, path, body (dict or raw text), status, param named in the error)
CASES = [
    ("bad json", CHAT, '{"messages": [', 400, None),
    ("non-object body", CHAT, "[1, 2, 3]", 400, None),
    ("string body", COMP, '"hello"', 400, None),
    ("missing messages", CHAT, {"model": "tiny"}, 400, "messages"),
    ("missing prompt", COMP, {"model": "tiny"}, 400, "prompt"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ("empty prompt", COMP, {"prompt": ""}, 400, "prompt"),
    ("negative max_tokens", CHAT, {"messages": MSG, "max_tokens": -5}, 400, "max_tokens"),
    ("zero max_completion_tokens", CHAT, {"messages": MSG, "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("huge max_tokens", COMP, {"prompt": "hello", "max_tokens": 10**12}, 400, "max_tokens"),
    ("max_tokens not a number", COMP, {"prompt": "hello", "max_tokens": "many"}, 400, "max_tokens"),
    ("temperature too high", CHAT, {"messages": MSG, "temperature": 7}, 400, "temperature"),
    ("negative temperature", CHAT, {"messages": MSG, "temperature": -1}, 400, "temperature"),
    ("top_p zero", COMP, {"prompt": "hello", "top_p": 0}, 400, "top_p"),
    ("n zero", CHAT, {"messages": MSG, "n": 0}, 400, "n"),
    ("n past the limit", COMP, {"prompt": "hello", "n": 17}, 400, "n"),
    ("n past the queue", COMP, {"prompt": "hello", "n": 11}, 400, "n"),  # 8 slots + 2 waiting
    ("logprobs past 20", COMP, {"prompt": "hello", "logprobs": 21}, 400, "logprobs"),
    ("top_logprobs without logprobs", CHAT, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    ("stop of the wrong type", COMP, {"prompt": "hello", "stop": 5}, 400, "stop"),
    ("k zero", COMP, {"prompt": "hello", "k": 0}, 400, "k"),
    ("unknown draft", COMP, {"prompt": "hello", "draft": "psychic"}, 400, "draft"),
    ("token id out of range", COMP, {"prompt": [1, 2, 10**6]}, 400, "prompt"),
    ("prompt batch", COMP, {"prompt": ["a", "b"]}, 400, "prompt"),
    ("over-long prompt", COMP, {"prompt": LONG_PROMPT, "max_tokens": 4}, 400, "prompt"),
    ("prompt plus max_tokens too long", CHAT, {"messages": MSG, "max_tokens": 159}, 400, "max_tokens"),
    ("unknown model", CHAT, {"model": "gpt-9", "messages": MSG}, 404, "model"),
]


@pytest.fixture(scope="module")
def server():
    return shared_server("--max-queue", "2")


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    return error


@pytest.mark.parametrize("name,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_malformed_request_gets_openai_error(server, name, path, body, status, param):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    assert_openai_error(r, status, param)


def test_unknown_fields_are_ignored_and_neutral_sampling_fields_accepted(server):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "logit_bias": {}, "user": "x",
            "frequency_penalty": 0, "presence_penalty": 0.0, "response_format": {"type": "text"}, "best_of": 1,
            "some_future_field": [1, 2]}
    assert httpx.post(server.url + COMP, json=body, timeout=30).status_code == 200


REFUSED = [  # (path, field, a value that would change sampling)
    (COMP, "presence_penalty", 0.5), (CHAT, "frequency_penalty", 1), (COMP, "logit_bias", {"5": 1}),
    (CHAT, "bad_words", ["the"]), (COMP, "best_of", 2), (COMP, "echo", True),
    (COMP, "repetition_penalty", 1.2), (CHAT, "tools", [{"type": "function", "function": {"name": "f"}}]),
    (COMP, "min_tokens", 4), (CHAT, "stop_token_ids", [5]), (COMP, "suffix", "end"),
]


@pytest.mark.parametrize("path,field,value", REFUSED, ids=[r[1] for r in REFUSED])
def test_fields_that_change_sampling_are_refused_by_name(server, path, field, value):
    body = {"max_tokens": 2, field: value, **({"messages": MSG} if path == CHAT else {"prompt": "hello"})}
    error = assert_openai_error(httpx.post(server.url + path, json=body, timeout=30), 400, field)
    assert error["code"] == "unsupported_parameter" and error["message"].startswith(field)


def test_unknown_route_is_openai_shaped_404(server):
    assert_openai_error(httpx.get(server.url + "/v1/nothing"), 404, None)


@pytest.fixture(scope="module")
def keyed_app():
    """The app in process with an API key (no second server process needed for auth checks)."""
    from fastapi.testclient import TestClient

    from specdec.runtime import build_runtime
    from specdec.server.app import ServerConfig, ServerState, create_app

    target, _ = build_tiny_models(tiny_root())
    state = ServerState(ServerConfig("tiny", "lookup", 3, api_key="s3cret", max_queue=1),
                        build_runtime(str(target), "lookup"))
    with torch_threads(1), TestClient(create_app(state)) as client:
        yield client


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer s3cret-but-longer", "Basic s3cret", "s3cret"])
def test_missing_or_wrong_api_key_is_401(keyed_app, header):
    headers = {"authorization": header} if header else {}
    r = keyed_app.post(COMP, json={"prompt": "hello", "max_tokens": 2}, headers=headers)
    assert_openai_error(r, 401, None)
    assert_openai_error(keyed_app.get("/v1/models", headers=headers), 401, None)


def test_right_api_key_is_served(keyed_app):
    r = keyed_app.post(COMP, json={"prompt": "hello", "max_tokens": 2}, headers={"authorization": "Bearer s3cret"})
    assert r.status_code == 200 and r.json()["usage"]["speculative"]["draft"] == "lookup"
    assert keyed_app.get("/health").status_code == 200  # health and metrics stay open, as in vLLM


def test_schema_fuzzing_finds_no_server_error(server):
    """schemathesis draws bodies that fit the server's OpenAPI schema and bodies that break it; plus
    arbitrary JSON. None may get a 5xx, and every error has the OpenAI shape."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    cases = st.one_of(*[schema[path]["POST"].as_strategy(generation_mode=mode)
                        for path in (COMP, CHAT) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)])
    any_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                            max_leaves=8)
    raw = st.tuples(st.sampled_from([COMP, CHAT]), any_json)

    def bounded(body):
        if isinstance(body, dict) and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            return {**body, "max_tokens": 8}  # bounded generations keep the fuzzing quick
        return body

    def check_response(status: int, text: str, sent) -> None:
        assert status < 500, (sent, text)
        if status >= 400:
            assert set(json.loads(text)["error"]) == {"message", "type", "param", "code"}

    with httpx.Client(base_url=server.url, timeout=60) as http:
        @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.one_of(cases, raw))
        def check(case):
            if isinstance(case, tuple):  # arbitrary JSON
                path, body = case
                r = http.post(path, content=json.dumps(bounded(body)), headers={"content-type": "application/json"})
                check_response(r.status_code, r.text, body)
            else:  # a schemathesis case: it serializes its own body (sometimes deliberately not JSON)
                case.body = bounded(case.body)
                r = case.call(base_url=server.url, timeout=60)
                check_response(r.status_code, r.text, case.body)

        check()
