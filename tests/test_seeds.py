"""Seeds: every one of the 64 bits counts, and a seed reproduces its draws."""

import pytest
import torch

from specdec.sampling import SamplingParams, sample

PROBS = torch.full((64,), 1 / 64)


def draws(seed: int, n: int = 32) -> list[int]:
    gen = SamplingParams(temperature=1.0, seed=seed).make_generator()
    return [int(sample(PROBS, gen)) for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 5, 2**32 - 1, 2**40 + 3, 2**32 * 5])
def test_seeds_that_differ_only_in_high_bits_draw_differently(seed):
    for other in (seed + 2**63, seed + 2**32):
        differing = sum(a != b for a, b in zip(draws(other), draws(seed)))
        assert differing > 16  # two unrelated streams, not one that differs in a draw or two


@pytest.mark.parametrize("seed", [0, 7, 2**32 + 7, 2**63 + 7, 2**64 - 1])
def test_a_seed_reproduces_its_draws(seed):
    assert draws(seed) == draws(seed)


def test_a_negative_seed_draws_as_two_to_the_64_plus_it():
    assert draws(-3) == draws(2**64 - 3)


def test_a_seed_below_two_to_the_32_draws_as_torch_seeds_it():
    gen = torch.Generator().manual_seed(12345)
    assert draws(12345) == [int(sample(PROBS, gen)) for _ in range(32)]


def test_the_generator_reports_the_whole_seed():
    assert SamplingParams(temperature=1.0, seed=2**63 + 9).make_generator().initial_seed() == 2**63 + 9
