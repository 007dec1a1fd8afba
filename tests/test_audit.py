"""`specdec audit` against real `specdec serve` processes: a correct server passes, each fault is caught.

The target is a tiny model over a dozen words with peaked logits, so that 100 samples resolve its
first tokens; the draft is the same model with logits three times sharper, so q is far from p where p
is uncertain, which is where the sampling bugs show. Each candidate server runs with one fault of
specdec.faults injected by the harness (tests/serve_with_fault.py). What each fault does here:
resample-from-p and softmax-as-q change the distribution (the sampled tests see it); skip-rollback
leaves the draft's cache out of step, and unmapped-draft-ids lets in a GPT-2 draft with another,
smaller tokenizer: both make the candidate fail (HTTP 500) on requests the reference serves.
The reference is the correct server's plain engine (`draft: none` in each request, a specdec extension);
it requires an API key, so every audit also checks that keys go to their own side.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time

import httpx
import pytest

from specdec.audit import stats
from specdec.audit.client import _parse_choice
from specdec.audit.prompts import load_prompts
from specdec.cli import main
from tests.helpers_tiny import assert_png, tiny_model_dir, tiny_tokenizer
from tests.server_tiny_model import ServerProcess

WORDS = "the a cat dog sun sea tree house one two three four".split()
PROMPTS = [{"id": "dog", "category": "chat", "messages": [{"role": "user", "content": "a dog"}]},
           {"id": "cat", "category": "chat", "messages": [{"role": "user", "content": "the cat"}]}]
KEY = "reference-secret"
FAULTS = ["resample-from-p", "skip-rollback", "softmax-as-q", "unmapped-draft-ids"]


def _foreign_draft(path):
    """A GPT-2 (another family) over another, smaller vocabulary: a draft the vocabulary check refuses."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = tiny_tokenizer("x y z".split())
    torch.manual_seed(5)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    target = str(tiny_model_dir(root / "target", seed=0, layers=1, scale=10.0, words=WORDS))
    draft = str(tiny_model_dir(root / "draft", seed=0, layers=1, scale=30.0, words=WORDS))
    return root, target, draft, str(_foreign_draft(root / "foreign"))


def start(root, target: str, fault: str, *args: str) -> ServerProcess:
    # A fixed K: auto (the default) drafts for no seeded sample, and the audit's samples are seeded.
    return ServerProcess(["--target", target, *args, "-k", "4", "--speculation", "4", "--served-model-name", "tiny",
                          "--threads", "1"],
                         root / f"{fault}-{len(list(root.glob('*.log')))}.log",
                         launcher=("-m", "tests.serve_with_fault", fault))


@pytest.fixture(scope="module")
def servers(models):
    """The correct server (also the reference, with `draft: none` a request) and one server a fault."""
    root, target, draft, foreign = models
    procs = {"correct": start(root, target, "none", "--draft", draft, "--api-key", KEY),
             "unmapped-draft-ids": start(root, target, "unmapped-draft-ids", "--draft", foreign),
             **{f: start(root, target, f, "--draft", draft) for f in FAULTS if f != "unmapped-draft-ids"},
             "doomed": start(root, target, "none", "--draft", draft)}  # killed by the mid-run test
    try:  # started together, so that they load side by side
        yield {name: proc.wait_ready(timeout=600) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.stop()


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return str(path)


def audit_args(reference: str, candidate: str, prompts: str, report) -> list[str]:
    """The plain engine of the correct server is the reference: `draft: none` in each of its requests."""
    return ["audit", "--reference", reference, "--reference-body", '{"draft": "none"}', "--candidate", candidate,
            "--prompts", prompts, "--reference-api-key", KEY, "--max-tokens", "16", "--json", str(report)]


def audit(reference: str, candidate: str, prompts: str, out, *extra: str) -> tuple[int, dict]:
    report = out / "report.json"
    code = main(audit_args(reference, candidate, prompts, report) + list(extra))
    return code, (json.loads(report.read_text()) if report.exists() else {})


def test_correct_server_is_consistent(servers, prompts_file, tmp_path):
    url = servers["correct"].url
    code, data = audit(url, url, prompts_file, tmp_path, "--candidate-api-key", KEY)
    assert code == 0 and data["verdict"] == "consistent"
    greedy = data["greedy"]["prompts"]
    assert [g["status"] for g in greedy] == ["identical", "identical"]
    assert all(g["reference_deterministic"] and g["candidate_deterministic"] for g in greedy)
    assert data["greedy"]["per_category"]["chat"]["rate"] == 1.0
    sampled = data["sampled"]["prompts"]
    assert len(sampled) == 2 and not any(s["fails"] for s in sampled)
    assert all(s["n_reference"] == s["n_candidate"] == 100 for s in sampled)
    assert 0 < data["sampled"]["min_detectable_tv"] < 1
    assert sum(sampled[0]["reference_first"].values()) == 100


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_is_reported_as_a_difference(servers, prompts_file, tmp_path, fault, capsys):
    # The distribution faults change the odds only where a draft is rejected: 300 samples a prompt see
    # them whatever the seeded draws, where 100 did for some streams of draws and not for others.
    extra = ("--samples", "300") if fault in ("resample-from-p", "softmax-as-q") else ()
    code, data = audit(servers["correct"].url, servers[fault].url, prompts_file, tmp_path, *extra)
    assert code == 1 and data["verdict"] == "different"
    assert "verdict: DIFFERENT" in capsys.readouterr().out
    sampled = data["sampled"]["prompts"]
    if fault in ("resample-from-p", "softmax-as-q"):  # a changed distribution, seen by the tests
        failing = [s for s in sampled if s["fails"]]
        assert failing and all(s["candidate_errors"] == 0 for s in sampled)
        assert min(min(s["first_p_adjusted"], s["prefix_p_adjusted"]) for s in failing) < 0.05
        for s in failing:
            assert_png(s["plot"])
    else:  # a broken engine: it refuses requests the reference serves, or answers otherwise
        greedy = data["greedy"]["prompts"]
        assert any(s["fails"] for s in sampled) or any(g["status"] != "identical" for g in greedy)


def test_unreachable_server_is_bad_input(servers, prompts_file, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    code, _ = audit(servers["correct"].url, dead, prompts_file, tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach the candidate server" in err and len(err.strip().splitlines()) == 1


def test_wrong_api_key_is_bad_input(servers, prompts_file, tmp_path, capsys):
    code = main(["audit", "--reference", servers["correct"].url, "--candidate", servers["correct"].url,
                 "--prompts", prompts_file, "--reference-api-key", "wrong", "--json", str(tmp_path / "r.json")])
    assert code == 2 and "refused the API key" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [("{not json\n", "not JSON"), ('{"text": "hi"}\n', "prompt"),
                                               ("", "no prompts"), (None, "cannot read")])
def test_bad_prompts_file_is_bad_input(servers, tmp_path, capsys, content, message):
    path = tmp_path / "prompts.jsonl"
    if content is not None:
        path.write_text(content)
    code, _ = audit(servers["correct"].url, servers["correct"].url, str(path), tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_server_that_dies_mid_run_gives_a_partial_report(servers, prompts_file, tmp_path):
    doomed = servers["doomed"]
    report = tmp_path / "partial.json"
    cmd = [sys.executable, "-m", "specdec.cli", *audit_args(servers["correct"].url, doomed.url, prompts_file, report)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_answers(doomed.url, 30)
        doomed.proc.kill()  # mid-run: the greedy stage is done, the sampled one under way
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    data = json.loads(report.read_text())
    assert proc.returncode == 2 and data["verdict"] == "incomplete" and "Traceback" not in out + err
    assert "stopped answering" in data["stopped"] and "the report is partial" in " ".join(out.split())
    assert len(data["greedy"]["prompts"]) == 2 and data["unfinished"]


def _wait_for_answers(url: str, n: int, timeout: float = 120.0) -> None:
    """Until the server's /metrics counts n finished requests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=5).text
        done = sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("specdec:request_success_total"))
        if done >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the server did not answer {n} requests in {timeout}s")


# ---- pieces, without servers ---------------------------------------------------------------------


def test_builtin_prompts_cover_every_category():
    categories = {p.category for p in load_prompts()}
    assert categories == {"chat", "code", "math", "summarization", "rewriting", "extraction"}


def test_chi2_pools_rare_outcomes_and_sees_a_shift():
    same = [("a",)] * 50 + [("b",)] * 50 + [("c",), ("d",)]
    p_value, columns = stats.chi2_homogeneity(same, list(reversed(same)))
    assert p_value > 0.9 and columns == 2
    assert stats.chi2_homogeneity([("a",)] * 80 + [("b",)] * 20, [("a",)] * 20 + [("b",)] * 80)[0] < 1e-6


def test_permutation_test_sees_a_later_token_and_not_noise():
    a = [("x", "y")] * 50 + [("x", "z")] * 50
    assert stats.permutation_test(a, [("x", "y")] * 90 + [("x", "z")] * 10, m=2, permutations=500) < 0.01
    assert stats.permutation_test(a, list(reversed(a)), m=2, permutations=500) > 0.5


def test_corrections_match_their_definitions():
    p = [0.01, 0.04, 0.03, 0.5]
    assert stats.adjust(p, "holm") == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert stats.adjust(p, "bh") == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5])


def test_detectable_distance_shrinks_with_more_samples():
    small, large = stats.min_detectable_tv(100, 100, 0.05 / 4), stats.min_detectable_tv(400, 400, 0.05 / 4)
    assert 0 < large < small < 1 and large == pytest.approx(small / 2)


def test_logprobs_are_read_from_both_wire_formats():
    chat = {"choices": [{"message": {"content": "hi"}, "finish_reason": "length", "logprobs": {"content": [
        {"token": "hi", "logprob": -0.1, "top_logprobs": [{"token": "hi", "logprob": -0.1}]}]}}]}
    done = _parse_choice(chat, chat=True)
    assert done.tokens == ("hi",) and done.top_logprobs == ({"hi": -0.1},)
    plain = {"choices": [{"text": "a b", "logprobs": {"tokens": ["a", " b"], "top_logprobs": [{"a": -1.0}, None]}}]}
    done = _parse_choice(plain, chat=False)
    assert done.tokens == ("a", " b") and done.top_logprobs[0] == {"a": -1.0}
    assert _parse_choice({"choices": [{"text": "x", "logprobs": None}]}, chat=False).tokens is None


def test_greedy_compares_tokens_where_both_sides_give_them():
    from specdec.audit.client import Completion
    from specdec.audit.greedy import compare_greedy
    from specdec.audit.prompts import Prompt

    prompt = Prompt("p", "chat", None, "hi")
    tops = ({"a": -0.1}, {" b": -0.2}, {" c": -0.3})
    ref = Completion("a b c", ("a", " b", " c"), tops)
    miss = compare_greedy(prompt, [ref, ref], [Completion("a b d", ("a", " b", " d"), tops)] * 2, 0.05)
    assert miss.status == "different" and miss.unit == "token" and miss.first_difference == 2
    assert miss.reference_around.endswith(" c") and miss.candidate_around.endswith(" d")
    drift = ({"a": -0.1}, {" b": -2.0}, {" c": -0.3})  # same tokens, another distribution at position 1
    assert compare_greedy(prompt, [ref, ref], [Completion("a b c", ref.tokens, drift)] * 2, 0.05).status == "different"
    assert compare_greedy(prompt, [ref, ref], [ref, ref], 0.05).status == "identical"
    other = Completion("a x", ("a", " x"), tops[:2])
    varies = compare_greedy(prompt, [ref, other], [ref, ref], 0.05)
    assert varies.status == "reference varies" and not varies.reference_deterministic


def test_logprob_drift_counts_only_beyond_the_references_own_spread():
    from specdec.audit.client import Completion
    from specdec.audit.sampled import _first_logprob_tv

    def answer(p_a: float) -> Completion:
        return Completion("a", tokens=("a",), top_logprobs=({"a": math.log(p_a), "b": math.log(1 - p_a)},))

    steady = [answer(0.6)] * 3
    assert _first_logprob_tv(steady, [answer(0.6)]) == 0.0
    assert abs(_first_logprob_tv(steady, [answer(0.5)]) - 0.1) < 1e-9  # a real difference is seen
    wobbly = [answer(0.6), answer(0.54)]  # the reference itself moves by 0.06 between requests
    assert abs(_first_logprob_tv(wobbly, [answer(0.55)]) - 0.0) < 1e-9
    assert abs(_first_logprob_tv(wobbly, [answer(0.4)]) - 0.14) < 1e-9
