"""Tensor parallelism on the CPU: 2 ranks over gloo (spawned processes), the native tiny Llama in fp32.

Greedy tokens equal the unsharded target's (TP 1) for plain decoding and every drafter, and
speculative output under TP equals plain decoding under TP; sampled output has the target's
distribution; a rank that dies mid-run is named in an error on rank 0; a size that does not
divide the KV heads is refused before any process starts.
"""

import functools
import json
import multiprocessing
import os
import signal

import pytest
import torch

from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.drafters.head import DraftHead, HeadDrafter, config_for_target, target_parts
from specdec.engine import Engine, GenerationConfig
from specdec.errors import InvalidRequestError
from specdec.models.native_llama import NativeLlama, NativeOptions, net_from_hf
from specdec.parallel.launch import open_tensor_parallel
from specdec.parallel.group import TensorParallelError
from tests.conftest import tiny_llama
from tests.helpers_tiny import tiny_model_dir
from tests.test_exactness import HOT, V, exact_joint, goodness_of_fit, sampled_joint

MAX_LENGTH = 96
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [40, 3, 17]]


def tiny_net(seed: int, **arch):
    """The recipe every rank calls: the whole tiny net, plain fp32 matrices (picklable by name)."""
    hf = tiny_llama(seed, **arch).model
    return net_from_hf(hf, MAX_LENGTH + 32), f"tiny-{seed}", MAX_LENGTH


def unsharded(recipe) -> NativeLlama:
    net, name, max_length = recipe()
    return NativeLlama(net, name, max_length, options=NativeOptions(graphs=False))


@pytest.fixture(scope="class")
def pair():
    """(TP 1, TP 2) of one target: 2 layers, 4 query heads, 2 KV heads."""
    recipe = functools.partial(tiny_net, 0, layers=2, scale=8.0)
    sharded = open_tensor_parallel(recipe, 2, timeout_s=30)
    yield unsharded(recipe), sharded
    sharded.close()


def drafters(kind: str, target):
    cpu = torch.device("cpu")
    if kind == "head":  # untrained, reading layer 0 and the last layer (forward_with_hidden under TP)
        config = config_for_target(tiny_llama(0, layers=2).model, 64, (0,))  # the target's shape
        torch.manual_seed(5)
        return HeadDrafter(DraftHead(config), target_parts(target))
    if kind == "model":
        return ModelDrafter(unsharded(functools.partial(tiny_net, 1, layers=1, scale=8.0)), 128)
    return {"none": NoDrafter, "lookup": LookupDrafter}[kind](cpu)


class TestAgainstTp1:
    """Against one TP 2 target, open for this class only (a process holds one at a time)."""

    def test_sharded_logits_match_the_whole_model(self, pair):
        whole, sharded = pair
        tokens = torch.tensor(PROMPTS[0])
        torch.testing.assert_close(sharded.prefill(tokens), whole.prefill(tokens), rtol=1e-5, atol=1e-5)
        logits, features = sharded.forward_with_hidden(torch.tensor([6, 7]), (0,))
        want_logits, want_features = whole.forward_with_hidden(torch.tensor([6, 7]), (0,))
        torch.testing.assert_close((logits, features), (want_logits, want_features), rtol=1e-5, atol=1e-5)
        sharded.rollback(3)
        torch.testing.assert_close(sharded.forward(tokens[3:5]), whole.prefill(tokens[:5])[3:], rtol=1e-5, atol=1e-5)

    @pytest.mark.parametrize("kind", ["none", "lookup", "model", "head"])
    def test_greedy_tokens_equal_tp1_and_plain_tp(self, pair, kind):
        whole, sharded = pair
        config = GenerationConfig(max_new_tokens=24, k=3, ignore_eos=True)
        for prompt in PROMPTS:
            tp1 = Engine(whole, drafters(kind, whole)).generate(prompt, config).token_ids
            tp2 = Engine(sharded, drafters(kind, sharded)).generate(prompt, config)
            plain_tp2 = Engine(sharded, NoDrafter(torch.device("cpu"))).generate(prompt, config).token_ids
            assert tp2.token_ids == plain_tp2 == tp1
            assert sharded.cache_len == 0  # the sequence gave its slot (the target's own cache, every rank's) back
            assert kind == "none" or tp2.stats.drafted > 0
            if kind == "lookup" and prompt is PROMPTS[1]:
                assert tp2.stats.accepted > 0  # speculation really happened (an untrained head accepts little)


def test_sampled_output_follows_the_target_distribution_under_tp():
    recipe = functools.partial(tiny_net, 20, layers=1, hidden=16, vocab=V, scale=30.0)
    target = open_tensor_parallel(recipe, 2, timeout_s=30)
    try:
        draft = unsharded(functools.partial(tiny_net, 21, layers=1, hidden=16, vocab=V, scale=30.0))
        counts = sampled_joint(Engine(target, ModelDrafter(draft, V)), HOT, k=1, samples=1000, n_tokens=2)
        assert goodness_of_fit(counts, exact_joint(target, HOT, n_tokens=2)) > 1e-3
    finally:
        target.close()


class KillsRankOne(LookupDrafter):
    """A lookup drafter that kills rank 1 at its third round: a rank dying in mid-generation."""

    def __init__(self, victim: int):
        super().__init__(torch.device("cpu"))
        self.victim, self.rounds = victim, 0

    def propose(self, context, k, params, generator):
        self.rounds += 1
        if self.rounds == 3:
            os.kill(self.victim, signal.SIGKILL)
        return super().propose(context, k, params, generator)


def test_a_dead_rank_is_named_on_rank_0():
    target = open_tensor_parallel(functools.partial(tiny_net, 0, layers=2, scale=8.0), 2, timeout_s=20)
    try:
        engine = Engine(target, KillsRankOne(target.worker_pids[0]))
        with pytest.raises(TensorParallelError, match=r"rank 1 \(exit code -9\) stopped"):
            engine.generate(PROMPTS[1], GenerationConfig(max_new_tokens=40, k=3, ignore_eos=True))
    finally:
        target.close()
    with pytest.raises(TensorParallelError, match="closed"):
        target.forward(torch.tensor([1]))


def test_a_size_that_does_not_divide_the_kv_heads_is_refused():
    with pytest.raises(InvalidRequestError, match="tensor parallel size 3 does not divide the target's 2 KV heads"):
        open_tensor_parallel(functools.partial(tiny_net, 0, layers=1), 3)


def generate_json(capsys, model_dir, *flags) -> dict:
    from specdec import cli

    argv = ["generate", "--target", str(model_dir), "--device", "cpu", "--raw", "--json", "--ignore-eos",
            "--max-new-tokens", "12", "--draft", "lookup", *flags, "the cat sat on the mat and the cat"]
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_generate_with_tensor_parallel_size_2(tmp_path, capsys):
    model_dir = tiny_model_dir(tmp_path / "tiny")
    tp2 = generate_json(capsys, model_dir, "--tensor-parallel-size", "2", "--compare")
    tp1 = generate_json(capsys, model_dir)
    assert tp2["tensor_parallel_size"] == 2
    assert tp2["compare"]["identical"] and tp2["token_ids"] == tp1["token_ids"]
    assert tp2["stats"]["accepted"] > 0
    assert not multiprocessing.active_children()  # every rank stopped


@pytest.mark.parametrize("command, error", [
    (["generate", "--tensor-parallel-size", "3", "hi"], "tensor parallel size 3 does not divide the target's 2 KV heads"),
    (["bench", "gpu", "--cpu", "--tensor-parallel-size", "2"], "--cpu benches one process"),
])
def test_cli_refuses_a_bad_tensor_parallel_size_in_one_line(tmp_path, capsys, command, error):
    from specdec import cli

    if command[0] == "generate":
        command = [*command[:-1], "--target", str(tiny_model_dir(tmp_path / "tiny")), "--device", "cpu", "--raw",
                   command[-1]]
    assert cli.main(command) == 2
    err = capsys.readouterr().err.strip()
    assert error in err and len(err.splitlines()) == 1
