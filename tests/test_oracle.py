"""The oracle drafter: acceptance alpha by construction, output still the target's own."""

import pytest
import torch

from specdec.drafters.none import NoDrafter
from specdec.drafters.oracle import OracleDrafter, record_greedy
from specdec.engine import Engine, GenerationConfig
from specdec.sampling import SamplingParams

PROMPT = [3, 14, 15, 9, 26, 5]


def test_alpha_one_accepts_everything(tiny_target, tiny_draft):
    oracle = OracleDrafter(tiny_target, alpha=1.0, draft_model=tiny_draft, horizon=64)
    config = GenerationConfig(max_new_tokens=30, k=4, ignore_eos=True)
    spec = Engine(tiny_target, oracle).generate(PROMPT, config)
    plain = Engine(tiny_target, NoDrafter(tiny_target.device)).generate(PROMPT, config)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate == 1.0
    assert spec.stats.rounds == 6  # 5 tokens a round


@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_corruption_rate_and_exact_output(tiny_target, alpha):
    oracle = OracleDrafter(tiny_target, alpha=alpha, horizon=100, seed=1)
    config = GenerationConfig(max_new_tokens=80, k=1, ignore_eos=True)
    spec = Engine(tiny_target, oracle).generate(PROMPT, config)
    assert spec.token_ids == record_greedy(tiny_target, PROMPT, 80)
    assert abs(spec.stats.acceptance_rate - alpha) < 0.2


def test_sampled_q_is_what_it_draws_from(tiny_target):
    oracle = OracleDrafter(tiny_target, alpha=0.7, horizon=4)
    tiny_target.reset()
    oracle.begin(PROMPT)
    draft = oracle.propose(PROMPT, 6, SamplingParams(temperature=1.0), None)
    assert draft.q.shape == (6, tiny_target.vocab_size)
    torch.testing.assert_close(draft.q.sum(-1), torch.ones(6))
    recorded = record_greedy(tiny_target, PROMPT, 4)
    assert draft.q[torch.arange(4), recorded].tolist() == pytest.approx([0.7] * 4)


def test_in_the_registry_as_a_prefixed_kind():
    from specdec.drafters.registry import find_kind

    kind, arg = find_kind("oracle:0.7:some-model")
    assert kind.syntax == "oracle:ALPHA[:DRAFT]" and arg == "0.7:some-model"


def test_choices_drawn_once_per_generation(tiny_target):
    """A round only slices the choices begin() drew: a position proposed again (its first proposal
    never judged) gets the same token, and proposing draws nothing more from the generator."""
    oracle = OracleDrafter(tiny_target, alpha=0.5, horizon=20, seed=3)
    tiny_target.reset()
    oracle.begin(PROMPT)
    state = oracle.generator.get_state()
    greedy = SamplingParams(temperature=0.0)
    first = oracle.propose(PROMPT, 6, greedy, None).tokens
    again = oracle.propose(PROMPT + [1, 2], 4, greedy, None).tokens
    assert again.tolist() == first[2:].tolist()
    assert torch.equal(oracle.generator.get_state(), state)
    truth = record_greedy(tiny_target, PROMPT, 20)
    kept = sum(int(a == b) for a, b in zip(oracle.propose(PROMPT, 20, greedy, None).tokens.tolist(), truth))
    assert 0 < kept < 20  # corrupted at some positions, not all


def test_proposals_past_the_recording(tiny_target):
    oracle = OracleDrafter(tiny_target, alpha=1.0, horizon=3, seed=0)
    tiny_target.reset()
    oracle.begin(PROMPT)
    draft = oracle.propose(PROMPT + [7] * 2, 8, SamplingParams(temperature=1.0), None)
    assert draft.tokens.shape == (8,)
    assert draft.q[0].max().item() == 1.0  # position 2 was recorded: alpha 1 on its truth
    torch.testing.assert_close(draft.q[1:], torch.full((7, tiny_target.vocab_size), 1.0 / tiny_target.vocab_size))


def test_forks_draw_their_own_wrong_positions(tiny_target):
    """Each sequence's oracle (a fork) corrupts its own positions: with one seed for all, every sequence
    would find the same positions wrong, and what the auto policy learns from one would be all's luck."""
    greedy, truth = SamplingParams(temperature=0.0), record_greedy(tiny_target, PROMPT, 40)

    def kept_pattern(oracle):
        tiny_target.reset()
        oracle.begin(PROMPT)
        return [a == b for a, b in zip(oracle.propose(PROMPT, 40, greedy, None).tokens.tolist(), truth)]

    prototype = OracleDrafter(tiny_target, alpha=0.5, horizon=40, seed=3)
    forks = [prototype.fork() for _ in range(3)]
    patterns = [kept_pattern(f) for f in forks]
    assert len({tuple(p) for p in patterns}) == 3
    again = OracleDrafter(tiny_target, alpha=0.5, horizon=40, seed=3)
    assert [kept_pattern(again.fork()) for _ in range(3)] == patterns  # the same seed, the same forks: reproducible
