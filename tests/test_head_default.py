"""The shipped head on the embedded default model: exact greedy output, and `auto` picks it up."""

import pytest
import torch

from specdec.drafters import NoDrafter, make_drafter
from specdec.drafters.combined import LookupThenHead, shipped_head_for, shipped_heads
from specdec.engine import GenerationConfig
from specdec.models.cpu_matrix import packs_on_cpu
from specdec.models.loader import LoadedModel
from specdec.runtime import build_runtime

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not shipped_heads(), reason="no shipped head in this checkout")]

PROMPTS = ["What is the capital of France?", "Write a short poem about the sea."]


@pytest.fixture(scope="module")
def runtime():
    return build_runtime("default", "auto", device="cpu")


def test_auto_is_lookup_plus_shipped_head(runtime):
    assert isinstance(runtime.drafter, LookupThenHead)


def test_auto_finds_the_head_by_what_the_target_is_not_its_name(runtime):
    renamed = LoadedModel(runtime.target.model, runtime.target.tokenizer, name="my own name for it")
    assert shipped_head_for(renamed) is not None
    assert isinstance(make_drafter("auto", renamed), LookupThenHead)


@pytest.mark.parametrize("draft", ["head", "lookup+head"])
def test_greedy_identity_with_shipped_head(runtime, draft):
    plain = runtime.with_drafter(NoDrafter(torch.device("cpu")))
    spec = runtime.with_drafter(make_drafter(f"{draft}:{shipped_head_for(runtime.target)}", runtime.target))
    config = GenerationConfig(max_new_tokens=24, k=4)
    for prompt in PROMPTS:
        ids = runtime.encode(prompt)
        gen = spec.engine.generate(ids, config)
        assert gen.token_ids == plain.engine.generate(ids, config).token_ids
        assert gen.stats.accepted > 0  # the trained head's drafts do get kept


def test_auto_samples_with_the_head_alone_one_token_a_round(runtime):
    """At T=1 the embedded model rarely keeps lookup's copies: `auto` drafts with the head only, one
    token a round on a CPU (and greedy rounds still use lookup with up to K)."""
    from specdec.sampling import SamplingParams

    assert runtime.drafter.sampled == (False, 1)
    ids = runtime.encode("Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.")
    sampled = runtime.engine.generate(ids, GenerationConfig(max_new_tokens=16, k=4,
                                                            sampling=SamplingParams(temperature=1.0, seed=0)))
    assert sampled.stats.drafted > 0 and len([n for n in sampled.stats.drafted_per_position if n]) == 1
    greedy = runtime.engine.generate(ids, GenerationConfig(max_new_tokens=16, k=4))
    assert len([n for n in greedy.stats.drafted_per_position if n]) > 1  # lookup copied the repeated text


@pytest.mark.skipif(not packs_on_cpu(torch.bfloat16), reason="this CPU has no bf16 units")
def test_bf16_on_a_cpu_with_bf16_units_drafts_more_and_stays_exact():
    """Verify rows are nearly free there: `auto` drives the head without the fp32 caps, and the
    bf16 native path's greedy output is plain decoding's, token for token."""
    bf16 = build_runtime("default", "auto", device="cpu", dtype="bf16")
    assert bf16.target.model.cheap_verify_rows
    assert bf16.drafter.head_max is None and bf16.drafter.sampled == (False, 3)
    plain = bf16.with_drafter(NoDrafter(torch.device("cpu")))
    config = GenerationConfig(max_new_tokens=48, k=4)
    for prompt in PROMPTS:
        ids = bf16.encode(prompt)
        gen = bf16.engine.generate(ids, config)
        assert gen.token_ids == plain.engine.generate(ids, config).token_ids
        assert max(i for i, n in enumerate(gen.stats.drafted_per_position) if n) >= 2  # 3+ drafts in a round
