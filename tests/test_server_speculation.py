"""`specdec serve --speculation auto|K|request` (auto by default): the server's K policy reaches the
batched engine, answers stay the target's (greedy: the same text as a server of each request's own k),
and /metrics shows each step's K."""

from __future__ import annotations

import re

import httpx
import pytest

from specdec.engine.controller import Auto, FixedK, RequestK

from tests.server_tiny_model import build_tiny_models, shared_server, tiny_root

openai = pytest.importorskip("openai")

PROMPT = "hello what is the draft token"


def greedy(server, **extra) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0,
                                    extra_body={"ignore_eos": True, **extra})
    return out.choices[0].text, out.usage.model_extra["speculative"]


@pytest.mark.parametrize("flags, mode, k", [((), "auto", 4), (("--speculation", "3"), "fixed", 3)])
def test_a_server_policy_keeps_the_greedy_answer_and_decides_k(flags, mode, k):
    """auto by default, or a fixed K: the greedy answer of a server that keeps each request's k."""
    reference, policy = shared_server("--speculation", "request"), shared_server(*flags)
    card = httpx.get(policy.url + "/v1/models").json()["data"][0]["specdec"]
    assert (card["speculation"], card["k"]) == (mode, k)
    text, spec = greedy(policy, k=7)  # a request's own k is not used under a server policy
    assert text == greedy(reference)[0]
    assert spec["k"] == k and spec["drafted"] <= k * spec["rounds"]


def metrics_decision(url: str) -> tuple[float, list[float]]:
    """/metrics' speculation gauges: the latest pass's batch size, and K by place in the batch."""
    text = httpx.get(url + "/metrics").text
    batch = re.search(r'^specdec:speculation_batch_size\{model_name="tiny"\} (\S+)$', text, re.M)
    ks = re.findall(r'^specdec:speculation_k\{model_name="tiny",sequence="(\d+)"\} (\S+)$', text, re.M)
    assert batch, "no specdec:speculation_batch_size in /metrics"
    return float(batch.group(1)), [float(k) for _, k in sorted(ks, key=lambda pair: int(pair[0]))]


def test_metrics_show_the_latest_steps_batch_and_k_per_sequence():
    server = shared_server("--speculation", "3")
    greedy(server)
    batch, ks = metrics_decision(server.url)
    assert batch >= 1
    assert ks and all(0 <= k <= 3 for k in ks)


@pytest.mark.parametrize("flag, policy", [(None, Auto(3)), ("2", FixedK(2)), ("request", RequestK(3))])
def test_the_flag_reaches_the_batched_engine(flag, policy):
    from specdec.cli import build_parser
    from specdec.commands.serve import build_state

    target, _ = build_tiny_models(tiny_root())
    argv = ["serve", "--target", str(target), "--draft", "lookup", "-k", "3", "--max-num-seqs", "2", "--threads", "1"]
    state = build_state(build_parser().parse_args(argv + (["--speculation", flag] if flag else [])))
    assert state.engine.config.speculation == policy and state.engine.controller.name == policy.name


@pytest.mark.parametrize("value", ["0", "-1", "fast", "2.5"])
def test_a_bad_speculation_flag_is_one_line(capsys, value):
    from specdec.cli import main

    assert main(["serve", "--target", "none-needed", "--speculation", value]) == 2
    err = capsys.readouterr().err.strip()
    assert "--speculation must be auto, request or a whole number" in err and "\n" not in err


def test_the_speculation_endpoint_shows_what_the_metrics_show():
    server = shared_server("--speculation", "3")
    greedy(server)
    decision = httpx.get(server.url + "/speculation").json()
    batch, ks = metrics_decision(server.url)
    assert decision["mode"] == "fixed" and decision["batch_size"] == batch >= 1 and decision["ks"] == ks
    assert decision["reason"] == "fixed K = 3" and decision["controller"] == {}  # a summary is auto's only


def test_the_auto_servers_bandit_is_in_the_endpoint_and_the_metrics():
    """After a long answer (several 32-step windows at one in flight) auto has scored its caps at load
    1, and /speculation and /metrics say where it stands."""
    server = shared_server()  # auto: the default
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=120, temperature=0,
                              extra_body={"ignore_eos": True})
    decision = httpx.get(server.url + "/speculation").json()
    assert decision["mode"] == "auto" and decision["reason"].startswith("auto: cap ")
    row = next(r for r in decision["controller"]["buckets"] if r["load"] == 1)
    scored = {cap: s for cap, s in row["scores"].items() if s is not None}
    assert row["windows"] >= 2 and len(scored) >= 2 and row["arm"] in (0, 2, 4)
    text = httpx.get(server.url + "/metrics").text
    shown = re.search(r'^specdec:speculation_auto_cap\{load="1",model_name="tiny"\} (\S+)$', text, re.M)
    assert shown and float(shown.group(1)) == row["arm"]
    cap, value = next(iter(scored.items()))
    score = re.search(rf'^specdec:speculation_auto_score\{{cap="{cap}",load="1",model_name="tiny"\}} (\S+)$',
                      text, re.M)
    assert score and float(score.group(1)) == pytest.approx(value)
