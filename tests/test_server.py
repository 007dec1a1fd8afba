"""`specdec serve` through real HTTP with the official openai client: a tiny random target and draft."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server_tiny_model import shared_server, tiny_root, torch_threads

openai = pytest.importorskip("openai")

PROMPT = "hello what is the draft token"


@pytest.fixture(scope="module")
def server():
    return shared_server("--max-queue", "2")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy_completion(client, prompt=PROMPT, **kw):
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, **kw)


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert card["specdec"]["k"] == 4 and "none" in card["specdec"]["drafters"]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_completion_reports_round_statistics():
    """On a server that drafts each round (auto may not, on the tiny pair)."""
    server = shared_server("--speculation", "request")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    out = greedy_completion(client, extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 24
    spec = out.usage.model_extra["speculative"]
    assert spec["rounds"] >= 24 / 5 and spec["drafted"] >= spec["accepted"] >= 0
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted"] / spec["drafted"])


def test_greedy_completion_matches_specdec_generate(client, capsys):
    from specdec.cli import main

    target, draft = tiny_root() / "target", tiny_root() / "draft"
    with torch_threads(1):
        assert main(["generate", "--target", str(target), "--draft", str(draft), "-k", "4", "--raw", "--json",
                     "--max-new-tokens", "24", "--ignore-eos", PROMPT]) == 0
    expected = json.loads(capsys.readouterr().out)
    out = greedy_completion(client, extra_body={"ignore_eos": True})
    assert out.choices[0].text == expected["text"]


def test_greedy_chat_matches_specdec_generate_and_plain_decoding(client, capsys):
    from specdec.cli import main

    target, draft = tiny_root() / "target", tiny_root() / "draft"
    with torch_threads(1):
        assert main(["generate", "--target", str(target), "--draft", str(draft), "-k", "4", "--json",
                     "--max-new-tokens", "20", PROMPT]) == 0
    expected = json.loads(capsys.readouterr().out)
    messages = [{"role": "user", "content": PROMPT}]
    spec = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    plain = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=20,
                                           temperature=0, extra_body={"draft": "none", "k": 2})
    assert spec.choices[0].message.content == expected["text"] == plain.choices[0].message.content
    assert plain.usage.model_extra["speculative"]["drafted"] == 0


def test_streaming_chat_with_usage_matches_non_streaming(client):
    messages = [{"role": "user", "content": "why is the cat fast"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    origins = {c.choices[0].model_extra["specdec"]["origin"] for c in chunks
               if c.choices and c.choices[0].delta.content}
    assert origins <= {"accepted", "recovered", "bonus"} and origins


def test_streamed_completion_ends_with_done(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_stop_string_cuts_the_text(client):
    full = greedy_completion(client, extra_body={"ignore_eos": True}).choices[0].text
    words = full.split()
    stop = words[len(words) // 2]
    cut = greedy_completion(client, stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]
    streamed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop,
                                         stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_seed_reproduces_a_sampled_answer(client):
    def sampled(seed):
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=1.0,
                                          seed=seed, extra_body={"ignore_eos": True}).choices[0].text

    assert sampled(7) == sampled(7)


def test_metrics_count_speculation_like_vllm(server, client):
    greedy_completion(client)
    text = httpx.get(server.url + "/metrics").text
    for name in ("specdec:spec_decode_num_drafts_total", "specdec:spec_decode_num_draft_tokens_total",
                 "specdec:spec_decode_num_accepted_tokens_total",
                 'specdec:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}',
                 "specdec:time_to_first_token_seconds_bucket", "specdec:inter_token_latency_seconds_bucket",
                 "specdec:num_requests_waiting", "specdec:request_success_total"):
        assert name in text, name
