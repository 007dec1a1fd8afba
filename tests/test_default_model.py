"""The embedded default model (SmolLM2-135M-Instruct): speculative greedy output equals plain greedy output.

The reference is transformers' own `generate()` (greedy), independent of our engine.
"""

import pytest
import torch

from specdec.engine import GenerationConfig
from specdec.runtime import build_runtime

pytestmark = pytest.mark.slow

PROMPTS = [
    "Rename the variable x to count in: x = 0\nfor item in items:\n    x += 1\nprint(x)",  # copies its input
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",  # open answer, few lookup matches
    "Zebra quantum marmalade?",  # nothing to look up at first
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def runtime():
    before = torch.get_num_threads()
    yield build_runtime("default", "lookup", device="cpu", backend="hf", threads=2)  # a real model: both cores
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def references(runtime):
    """transformers' greedy continuation of each prompt (up to and including EOS)."""
    model, out = runtime.target.model.model, {}
    for prompt in PROMPTS:
        ids = runtime.encode(prompt)
        seq = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=runtime.tokenizer.eos_token_id)
        out[prompt] = seq[0, len(ids):].tolist()
    return out


@pytest.mark.parametrize("k", [2, 5])
def test_lookup_greedy_identical_to_transformers_generate(runtime, references, k):
    accepted = 0
    for prompt in PROMPTS:
        gen = runtime.engine.generate(runtime.encode(prompt), GenerationConfig(max_new_tokens=NEW_TOKENS, k=k))
        assert gen.token_ids == references[prompt], prompt
        accepted += gen.stats.accepted
    assert accepted > 0  # the copy prompts really exercised speculation
