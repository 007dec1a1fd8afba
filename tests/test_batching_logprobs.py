"""Log-probabilities of emitted tokens from the batched engine: the target's own p, at no cost to the draws.

Each emitted token's logprob must equal log p(token) at its position, with p recomputed here from
the target alone over the emitted text (greedy: the untruncated softmax; sampled: warp_logits); the
alternatives are p's most likely tokens in order; asking for logprobs changes no token.
"""

import pytest
import torch

from specdec.engine.batched import BatchedEngine
from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.slots import LoopSlots
from specdec.sampling import SamplingParams, token_logprobs, warp_logits
from tests.conftest import VOCAB

CPU = torch.device("cpu")
PROMPTS = ([5, 9, 12, 5, 9, 12, 5, 9], [7, 3], [11] * 6, [2, 40, 41, 42, 40, 41])


def reference_logp(target, prompt: list[int], generated: list[int], params: SamplingParams) -> torch.Tensor:
    """[len(generated), V]: log p at each generated position, from one pass of the target alone."""
    model = target.with_own_cache()
    logits = model.prefill(torch.tensor(prompt + generated[:-1]))[len(prompt) - 1:]
    return torch.log_softmax(logits, -1) if params.greedy else warp_logits(logits, params).log()


def run(target, draft, params: SamplingParams, logprobs: int | None, seed: int = 0):
    engine = BatchedEngine(LoopSlots(target.with_own_cache, 3), lambda: NoDrafter(CPU))
    drafters = [LookupDrafter(CPU), ModelDrafter(draft.with_own_cache(), VOCAB), NoDrafter(CPU), LookupDrafter(CPU)]
    handles = []
    for i, (prompt, drafter) in enumerate(zip(PROMPTS, drafters)):
        sampling = SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed + i)
        config = GenerationConfig(max_new_tokens=12, k=3, sampling=sampling, ignore_eos=True, logprobs=logprobs)
        handles.append(engine.submit(prompt, config, drafter=drafter))
    return [list(h) for h in handles]


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=12, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_each_token_carries_its_log_probability_under_p(tiny_target, tiny_draft, params):
    for prompt, tokens in zip(PROMPTS, run(tiny_target, tiny_draft, params, logprobs=4)):
        ids = [t.token_id for t in tokens]
        logp = reference_logp(tiny_target, prompt, ids, params)
        for j, token in enumerate(tokens):
            assert token.logprob == pytest.approx(float(logp[j, token.token_id]), abs=1e-4)
            best = torch.topk(logp[j], 4)
            finite = [(i, v) for i, v in zip(best.indices.tolist(), best.values.tolist()) if v > float("-inf")]
            assert [i for i, _ in token.top_logprobs] == [i for i, _ in finite]
            assert [v for _, v in token.top_logprobs] == pytest.approx([v for _, v in finite], abs=1e-4)
        if params.greedy:  # the greedy token is p's most likely
            assert all(t.top_logprobs[0][0] == t.token_id for t in tokens)


def test_asking_for_logprobs_changes_no_token(tiny_target, tiny_draft):
    params = SamplingParams(temperature=1.0)
    plain = run(tiny_target, tiny_draft, params, logprobs=None, seed=11)
    scored = run(tiny_target, tiny_draft, params, logprobs=0, seed=11)
    assert [[t.token_id for t in seq] for seq in plain] == [[t.token_id for t in seq] for seq in scored]
    assert all(t.logprob is None and t.top_logprobs is None for seq in plain for t in seq)
    assert all(t.logprob <= 0 and t.top_logprobs == () for seq in scored for t in seq)


def test_token_logprobs_leaves_out_tokens_p_cannot_draw():
    logits = torch.tensor([[3.0, 2.0, 1.0, -5.0]])
    (chosen, top), = token_logprobs(logits, SamplingParams(temperature=1.0, top_k=2), [1], top=4)
    assert [i for i, _ in top] == [0, 1] and chosen == pytest.approx(float(torch.log_softmax(logits[0, :2], -1)[1]))


def test_the_single_sequence_engine_gives_the_batched_engines_logprobs(tiny_target):
    config = GenerationConfig(max_new_tokens=6, logprobs=2, ignore_eos=True)
    single = list(Engine(tiny_target, NoDrafter(CPU)).stream(PROMPTS[1], config))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 1), lambda: NoDrafter(CPU))
    batched = list(engine.submit(PROMPTS[1], config))
    assert single == batched and all(t.logprob is not None and len(t.top_logprobs) == 2 for t in single)
