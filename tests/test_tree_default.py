"""Trees on the embedded default model with the shipped head: greedy output is plain decoding's, and
sampled output follows the target (chi-square over the first two tokens at temperature 1, top-k 4)."""

import itertools

import pytest
import torch

from specdec.drafters import NoDrafter, make_drafter
from specdec.drafters.combined import shipped_head_for, shipped_heads
from specdec.engine import GenerationConfig
from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.models.slots import slot_model_for
from specdec.runtime import build_runtime
from specdec.sampling import SamplingParams, warp_logits
from tests.test_exactness import goodness_of_fit

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not shipped_heads(), reason="no shipped head in this checkout")]

PROMPTS = ["What is the capital of France?", "Write a short poem about the sea."]
WARM = dict(temperature=1.0, top_k=4)
SAMPLES = 800


@pytest.fixture(scope="module")
def runtime():
    return build_runtime("default", "lookup", device="cpu")


def tree_drafter(runtime, spec: str = "lookup+head"):
    return make_drafter(f"tree:4x3x3:{spec}:{shipped_head_for(runtime.target)}", runtime.target)


def test_greedy_trees_with_the_shipped_head_give_plain_decoding(runtime):
    plain = runtime.with_drafter(NoDrafter(torch.device("cpu")))
    spec = runtime.with_drafter(tree_drafter(runtime))
    config = GenerationConfig(max_new_tokens=24, k=10)
    for prompt in PROMPTS:
        ids = runtime.encode(prompt)
        gen = spec.engine.generate(ids, config)
        assert gen.token_ids == plain.engine.generate(ids, config).token_ids
        assert gen.stats.accepted > 0


def exact_first_two(model, ids: list[int], params: SamplingParams) -> dict:
    """P(first two tokens) under the warped target, by enumeration of the top-k support."""
    first = warp_logits(model.prefill(torch.tensor(ids))[-1], params)
    out = {}
    for a in first.nonzero().flatten().tolist():
        second = warp_logits(model.prefill(torch.tensor(ids + [a]))[-1], params)
        for b in second.nonzero().flatten().tolist():
            out[(a, b)] = first[a].item() * second[b].item()
    model.reset()
    return out


def sampled_counts(runtime, ids: list[int]) -> dict[tuple, int]:
    model = runtime.target.model
    slots = slot_model_for(model, max_slots=32, max_length=len(ids) + 8)
    prototype = tree_drafter(runtime, "head").for_batch(32, len(ids) + 8)
    engine = BatchedEngine(slots, prototype.fork, config=BatchConfig(prefill_chunk=len(ids)))
    handles = [engine.submit(ids, GenerationConfig(max_new_tokens=2, k=6, sampling=SamplingParams(**WARM, seed=i)))
               for i in range(SAMPLES)]
    engine.run()
    counts: dict[tuple, int] = {}
    for h in handles:
        counts[tuple(h.token_ids)] = counts.get(tuple(h.token_ids), 0) + 1
    assert sum(h.stats.drafted for h in handles) > 0
    return counts


def test_sampled_trees_follow_the_target(runtime):
    """At temperature 1 the head draws its trees' children (without replacement, the multi-step rule)."""
    ids = runtime.encode(PROMPTS[1])
    counts = sampled_counts(runtime, ids)
    assert goodness_of_fit(counts, exact_first_two(runtime.target.model, ids, SamplingParams(**WARM))) > 1e-3
