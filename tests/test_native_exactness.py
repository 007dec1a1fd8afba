"""The core exactness tests, run again with the native backend as target and draft.

The greedy-identity tests of test_engine_greedy are imported here, so they are collected a second
time with this module's tiny_target / tiny_draft fixtures: the same tiny Llama weights, but run by
NativeLlama on the fixed-shape path that CUDA graphs replay (emulated on CPU).
"""

import pytest

from specdec.drafters import ModelDrafter
from specdec.engine import Engine
from specdec.models.native_llama import NativeLlama
from tests.conftest import tiny_llama
from tests.test_engine_greedy import (  # noqa: F401  (collected again with the fixtures below)
    test_cache_invariant_after_generation,
    test_eos_stops_generation,
    test_greedy_identity_with_every_drafter,
    test_speculation_really_happens,
    test_stats_add_up,
)
from tests.test_exactness import HOT, V, exact_joint, goodness_of_fit, sampled_joint


def native(hf_model, name: str) -> NativeLlama:
    return NativeLlama.from_hf(hf_model.model, name, max_length=128, cuda_graphs=True)


@pytest.fixture(scope="module")
def tiny_target() -> NativeLlama:
    return native(tiny_llama(0, layers=2, scale=8.0), "native-target")


@pytest.fixture(scope="module")
def tiny_draft() -> NativeLlama:
    return native(tiny_llama(1, layers=1, scale=8.0), "native-draft")


def test_output_follows_target_distribution_on_native_pair():
    """Sampled output has the target's joint distribution (chi-square against enumeration)."""
    target = native(tiny_llama(20, layers=1, hidden=16, vocab=V, scale=30.0), "t")
    draft = native(tiny_llama(21, layers=1, hidden=16, vocab=V, scale=30.0), "d")
    engine = Engine(target, ModelDrafter(draft, V))
    counts = sampled_joint(engine, HOT, k=1, samples=1500, n_tokens=2)
    assert goodness_of_fit(counts, exact_joint(target, HOT, n_tokens=2)) > 1e-3
