"""Structured output through the server, in process: response_format on chat, vLLM's structured_outputs
and guided_* fields on both endpoints, and a 400 that says what is wrong with a bad schema."""

import json
import re

import jsonschema
import pytest

from tests.server_tiny_model import torch_threads
from tests.test_structured_cli import toy_dir  # noqa: F401 - the fixture

COMP, CHAT = "/v1/completions", "/v1/chat/completions"
SCHEMA = {"type": "object", "properties": {"a": {"enum": ["ab", "c"]}, "b": {"type": "integer", "maximum": 1}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def app(toy_dir):  # noqa: F811
    from fastapi.testclient import TestClient

    from specdec.runtime import build_runtime
    from specdec.server.app import ServerConfig, ServerState, create_app

    state = ServerState(ServerConfig("toy", "lookup", 3, max_queue=4), build_runtime(toy_dir, "lookup"))
    with torch_threads(1), TestClient(create_app(state)) as client:
        yield client


def post(app, path, **fields):
    body = {"max_tokens": 30, "temperature": 0, **fields}
    body.update({"messages": [{"role": "user", "content": "ab"}]} if path == CHAT else {"prompt": "ab"})
    return app.post(path, json=body)


def text_of(response) -> str:
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("path, fields", [
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}),
    (CHAT, {"structured_outputs": {"json": SCHEMA}}),
    (COMP, {"structured_outputs": {"json": json.dumps(SCHEMA)}}),
    (COMP, {"guided_json": SCHEMA}),
])
def test_json_schema_output_validates(app, path, fields):
    jsonschema.validate(json.loads(text_of(post(app, path, **fields))), SCHEMA)


def test_json_object_gives_an_object(app):
    out = post(app, CHAT, response_format={"type": "json_object"}, max_tokens=60)
    if out.json()["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text_of(out)), dict)
    else:
        assert text_of(out).startswith("{")


@pytest.mark.parametrize("fields, pattern", [
    ({"structured_outputs": {"regex": "(ab|c)+0"}}, "(ab|c)+0"),
    ({"guided_regex": "(ab|c)+0"}, "(ab|c)+0"),
    ({"structured_outputs": {"choice": ["abc", "ba"]}}, "abc|ba"),
    ({"guided_choice": ["abc", "ba"]}, "abc|ba"),
    ({"guided_grammar": 'start: "{" ("a" | "b")+ "}"'}, r"\{[ab]+\}"),
])
def test_regex_choice_and_grammar_on_both_endpoints(app, fields, pattern):
    for path in (COMP, CHAT):
        out = post(app, path, **fields)
        assert re.fullmatch(pattern, text_of(out)) or out.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("fields, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}},
     "response_format", "invalid"),
    ({"response_format": {"type": "xml"}}, "response_format", "type must be"),
    ({"response_format": {"type": "json_schema"}}, "response_format", '"schema"'),
    ({"guided_regex": "(ab"}, "guided_regex", "regex cannot be used"),
    ({"structured_outputs": {"regex": "a", "json": SCHEMA}}, "structured_outputs", "exactly one"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "send one"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
])
def test_a_bad_constraint_is_a_400_naming_the_field(app, fields, param, words):
    r = post(app, CHAT, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_text_response_format_is_no_constraint(app):
    assert post(app, CHAT, response_format={"type": "text"}, max_tokens=3).status_code == 200


def test_streamed_chat_under_a_schema_validates(app):
    body = {"max_tokens": 30, "temperature": 0, "stream": True, "messages": [{"role": "user", "content": "ab"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    text = ""
    with app.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    jsonschema.validate(json.loads(text), SCHEMA)
    assert text == text_of(post(app, CHAT, response_format=body["response_format"]))
