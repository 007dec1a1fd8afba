"""Sampled output follows the target's distribution exactly, end to end, and each classic bug is caught.

The first three emitted tokens span several rounds (K=2), so accepted, recovered and bonus tokens
all occur. Their joint distribution is compared with exact probabilities computed from the target
by a chi-square goodness-of-fit test.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from specdec import faults
from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.sampling import SamplingParams, warp_logits
from tests.conftest import tiny_llama
from tests.markov import MarkovLM

V, PROMPT, N_TOKENS, SAMPLES = 5, [1, 2, 1, 3], 3, 3000
HOT = SamplingParams(temperature=1.0)
WARPED = SamplingParams(temperature=0.9, top_k=4, top_p=0.9)


def next_logits(target, context: list[int]) -> torch.Tensor:
    if isinstance(target, MarkovLM):
        return target.next_logits(context)
    return target.prefill(torch.tensor(context))[-1]  # a real model: run the whole context afresh


def exact_joint(target, params: SamplingParams, n_tokens: int = N_TOKENS) -> dict[tuple, float]:
    """P(first n_tokens emitted tokens) under the warped target, by enumeration."""
    out = {}
    for seq in itertools.product(range(V), repeat=n_tokens):
        prob, context = 1.0, list(PROMPT)
        for t in seq:
            prob *= warp_logits(next_logits(target, context), params)[t].item()
            context.append(t)
        out[seq] = prob
    return out


def sampled_joint(engine: Engine, params: SamplingParams, k: int = 2, samples: int = SAMPLES,
                  n_tokens: int = N_TOKENS) -> dict:
    counts: dict[tuple, int] = {}
    for i in range(samples):
        config = GenerationConfig(max_new_tokens=n_tokens, k=k, sampling=SamplingParams(
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=i))
        seq = tuple(engine.generate(PROMPT, config).token_ids)
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def goodness_of_fit(counts: dict, exact: dict) -> float:
    """p-value of a chi-square test; cells expected below 5 are pooled; an impossible outcome gives 0."""
    total = sum(counts.values())
    if any(exact.get(seq, 0.0) == 0.0 for seq in counts):
        return 0.0
    big = [s for s in exact if exact[s] * total >= 5]
    small = [s for s in exact if 0 < exact[s] * total < 5]
    observed = [counts.get(s, 0) for s in big] + [sum(counts.get(s, 0) for s in small)]
    expected = torch.tensor([exact[s] for s in big] + [sum(exact[s] for s in small)], dtype=torch.float64)
    if not small:
        observed, expected = observed[:-1], expected[:-1]
    expected = expected / expected.sum() * total  # the enumeration's float sum is 1 only to ~1e-7
    return chisquare(observed, expected.numpy()).pvalue


def make_engine(kind: str) -> Engine:
    target = MarkovLM(V, seed=0, name="target")
    drafter = {
        "model": lambda: ModelDrafter(MarkovLM(V, seed=1, name="draft"), V),
        "lookup": lambda: LookupDrafter(torch.device("cpu"), max_ngram=1),
        "none": lambda: NoDrafter(torch.device("cpu")),
    }[kind]()
    return Engine(target, drafter)


@pytest.mark.parametrize("kind, params", [("model", HOT), ("model", WARPED), ("lookup", HOT), ("none", WARPED)],
                         ids=["model-t1", "model-topk-topp", "lookup-t1", "none-topk-topp"])
def test_output_follows_target_distribution(kind, params):
    engine = make_engine(kind)
    counts = sampled_joint(engine, params)
    assert goodness_of_fit(counts, exact_joint(engine.target, params)) > 1e-3


def test_output_follows_target_distribution_on_tiny_llama_pair():
    """The same test through real transformer models (fewer samples: they are slower)."""
    target = tiny_llama(20, layers=1, hidden=16, vocab=V, scale=30.0)
    draft = tiny_llama(21, layers=1, hidden=16, vocab=V, scale=30.0)
    engine = Engine(target, ModelDrafter(draft, V))
    counts = sampled_joint(engine, HOT, k=1, samples=1500, n_tokens=2)
    assert goodness_of_fit(counts, exact_joint(target, HOT, n_tokens=2)) > 1e-3


def test_all_origins_occur_in_the_distribution_test():
    engine = make_engine("model")
    origins = set()
    for i in range(50):
        gen = engine.stream(PROMPT, GenerationConfig(max_new_tokens=N_TOKENS, k=2, sampling=SamplingParams(
            temperature=1.0, seed=i)))
        origins |= {t.origin.value for t in gen}
    assert origins == {"accepted", "recovered", "bonus"}


@pytest.mark.parametrize("fault", ["resample-from-p", "softmax-as-q"])
def test_distribution_test_catches_fault(fault):
    engine = make_engine("model")
    with faults.inject(fault):
        counts = sampled_joint(engine, HOT)
    assert goodness_of_fit(counts, exact_joint(engine.target, HOT)) < 1e-4


def plain_greedy(target: MarkovLM, prompt: list[int], n: int) -> list[int]:
    context = list(prompt)
    for _ in range(n):
        context.append(int(target.next_logits(context).argmax()))
    return context[len(prompt):]


def greedy_identical(engine: Engine, k: int = 3) -> bool:
    prompts = [[1, 2, 1, 3], [4, 4, 0], [2]]
    return all(engine.generate(p, GenerationConfig(max_new_tokens=30, k=k)).token_ids
               == plain_greedy(engine.target, p, 30) for p in prompts)


def test_greedy_identity_on_markov_pair():
    assert greedy_identical(make_engine("model")) and greedy_identical(make_engine("lookup"))


def test_greedy_identity_catches_skipped_rollback():
    with faults.inject("skip-rollback"):
        assert not greedy_identical(make_engine("lookup"))


def test_seeded_determinism():
    engine = make_engine("model")
    config = GenerationConfig(max_new_tokens=40, k=3, sampling=SamplingParams(temperature=1.0, seed=123))
    first = engine.generate(PROMPT, config).token_ids
    assert engine.generate(PROMPT, config).token_ids == first
    other = GenerationConfig(max_new_tokens=40, k=3, sampling=SamplingParams(temperature=1.0, seed=124))
    assert engine.generate(PROMPT, other).token_ids != first
