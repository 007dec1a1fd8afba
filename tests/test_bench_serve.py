"""`specdec bench serve` against our own server at a tiny size: every field is there and the counts add up."""

from __future__ import annotations

import json

import pytest

from specdec.bench.serve import parse_spec_counters, spec_delta, summarize, RequestResult
from tests.server_tiny_model import shared_server

N, MAX_TOKENS, LEVELS = 6, 12, (1, 2)


@pytest.fixture(scope="module")
def server():
    return shared_server("--speculation", "3")  # a fixed K: it drafts, whatever the policy would say


def test_bench_serve_against_our_server(server, tmp_path, capsys):
    from specdec.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"turns": ["why is the cat fast"]}\n{"prompt": "hello what is the draft"}\none two three\n')
    board = tmp_path / "SCOREBOARD.md"
    assert main(["bench", "serve", "--base-url", server.url + "/v1", "--prompts", str(prompts),
                 "--concurrency", ",".join(map(str, LEVELS)), "--n", str(N), "--max-tokens", str(MAX_TOKENS),
                 "--ignore-eos", "--label", "tiny-test", "--change", "none", "--out-dir", str(tmp_path),
                 "--scoreboard", str(board)]) == 0
    assert "bench serve" in capsys.readouterr().out
    result = json.loads(next(tmp_path.glob("serve-*.json")).read_text())
    (served,) = result["servers"]
    assert served["model"] == "tiny" and result["label"] == "tiny-test" and served["server_speculation"]["k"] == 3
    assert [run["concurrency"] for run in served["runs"]] == list(LEVELS)
    for run in served["runs"]:
        assert run["completed"] + run["failed"] == run["num_prompts"] == N
        assert run["failed"] == 0, run["errors"]
        assert run["total_output_tokens"] == N * MAX_TOKENS  # ignore_eos: every request runs to max_tokens
        for metric in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("mean", "median", "p90", "p99"):
                assert run[f"{stat}_{metric}_ms"] >= 0
        assert run["median_ttft_ms"] <= run["p99_ttft_ms"] and run["output_throughput"] > 0
        spec = run["spec_decode"]
        assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"] >= 0 and spec["num_drafts"] > 0
        assert 0 <= spec["acceptance_rate"] <= 1 and 1 <= spec["mean_acceptance_length"] <= 4
        assert run["controller"] is None  # an auto server's summary; a fixed K has none
    rows = [line for line in board.read_text().splitlines() if "(serve, c=" in line]
    assert len(rows) == len(LEVELS) and "tiny-test" in rows[0]


def test_bench_serve_compares_servers_side_by_side(server, tmp_path):
    from specdec.cli import main

    board = tmp_path / "SCOREBOARD.md"
    assert main(["bench", "serve", "--server", f"spec={server.url}", "--server", f"plain={server.url}/v1",
                 "--concurrency", "1,3", "--n", "3", "--max-tokens", "6", "--ignore-eos", "--out-dir", str(tmp_path),
                 "--scoreboard", str(board)]) == 0
    result = json.loads(next(tmp_path.glob("serve-*.json")).read_text())
    assert [s["label"] for s in result["servers"]] == ["spec", "plain"] and result["baseline"] == "plain"
    spec, plain = result["servers"]
    assert all(r["speedup"] == 1.0 for r in plain["runs"])
    for mine, base in zip(spec["runs"], plain["runs"]):
        assert mine["speedup"] == pytest.approx(mine["output_throughput"] / base["output_throughput"])
    assert (tmp_path / result["plot"].rsplit("/", 1)[-1]).stat().st_size > 0
    rows = [line for line in board.read_text().splitlines() if "(serve, c=" in line]
    assert len(rows) == 4 and any(line.count("plain: ") for line in rows)


def test_a_server_flag_without_a_label_is_one_clear_error(capsys):
    from specdec.cli import main

    assert main(["bench", "serve", "--server", "http://127.0.0.1:1"]) == 2
    assert "LABEL=URL" in capsys.readouterr().err


def test_failed_requests_are_counted_not_timed():
    ok = RequestResult(ok=True, output_tokens=5, ttft=0.1, latency=0.5, itls=[0.1] * 4, chunks=5)
    bad = RequestResult(error="HTTP 503")
    s = summarize([ok, bad], duration=1.0, concurrency=2)
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (1, 1, 5)
    assert s["mean_tpot_ms"] == pytest.approx(100.0) and s["errors"] == ["HTTP 503"]


def test_vllm_counters_are_read_too():
    text = ("# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total 10\n"
            "# TYPE vllm:spec_decode_num_draft_tokens counter\nvllm:spec_decode_num_draft_tokens_total 40\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens counter\nvllm:spec_decode_num_accepted_tokens_total 30\n")
    after = parse_spec_counters(text)
    delta = spec_delta({"spec_decode_num_drafts": 0, "spec_decode_num_draft_tokens": 0,
                        "spec_decode_num_accepted_tokens": 0, "per_pos": {}}, after)
    assert delta["acceptance_rate"] == 0.75 and delta["mean_acceptance_length"] == 4.0
    assert parse_spec_counters("# TYPE x counter\nx_total 1\n") is None


def test_speedups_compare_runs_at_the_same_concurrency():
    from specdec.bench.serve import add_speedups

    run = lambda c, tps: {"concurrency": c, "output_throughput": tps}  # noqa: E731
    result = {"servers": [{"label": "plain", "runs": [run(1, 100.0), run(4, 300.0), run(16, 800.0)]},
                          {"label": "alone", "runs": [run(1, 90.0), run(16, 100.0)]},  # fewer levels
                          {"label": "k4", "runs": [run(1, 200.0), run(32, 50.0)]}]}  # one plain lacks
    assert add_speedups(result) == "plain"
    speedups = {s["label"]: [r["speedup"] for r in s["runs"]] for s in result["servers"]}
    assert speedups == {"plain": [1.0, 1.0, 1.0], "alone": [0.9, 0.125], "k4": [2.0, None]}
