"""The rejection rule on hand-built vectors: each output token must follow p exactly."""

import pytest
import torch
from scipy.stats import chisquare

from specdec import SamplingParams, accept_or_fix, residual, verify_greedy, verify_sampled, warp_logits

# The six-token example: the draft over-weights token 1 and under-weights token 0.
P = torch.tensor([0.40, 0.05, 0.20, 0.10, 0.15, 0.10])
Q = torch.tensor([0.10, 0.40, 0.20, 0.05, 0.15, 0.10])
N = 20_000


def draw_accept_or_fix(p, q, n, seed=0, q_for_rule=None):
    """Sample d ~ q, settle it with the rule, count the emitted tokens."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros_like(p)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen)
    for d in drafts.tolist():
        token, _ = accept_or_fix(p, q if q_for_rule is None else q_for_rule, d, gen)
        counts[token] += 1
    return counts


def assert_follows(counts, p, alpha=1e-3):
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token with zero target probability"
    expected = p[support] * counts.sum()
    assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > alpha


def test_accept_or_fix_output_follows_p_on_six_token_example():
    assert_follows(draw_accept_or_fix(P, Q, N), P)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_accept_or_fix_output_follows_p_on_random_vectors(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(12, generator=g) * 2, 0)
    q = torch.softmax(torch.randn(12, generator=g) * 2, 0)
    assert_follows(draw_accept_or_fix(p, q, N, seed), p)


def test_accept_or_fix_with_top_k_and_top_p_warping():
    g = torch.Generator().manual_seed(7)
    target_logits, draft_logits = torch.randn(10, generator=g) * 2, torch.randn(10, generator=g) * 2
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.9)
    p, q = warp_logits(target_logits, params), warp_logits(draft_logits, params)
    assert (p == 0).sum() >= 4  # the warping really removed tokens
    assert_follows(draw_accept_or_fix(p, q, N), p)


def test_acceptance_rate_is_sum_of_min_p_q():
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(Q, N, replacement=True, generator=gen)
    kept = sum(accept_or_fix(P, Q, d, gen)[1] for d in drafts.tolist())
    alpha = torch.minimum(P, Q).sum().item()
    assert abs(kept / N - alpha) < 0.015


def test_one_hot_q_keeps_with_probability_p_of_d_and_follows_p():
    one_hot = torch.zeros(6)
    one_hot[2] = 1.0
    counts = draw_accept_or_fix(P, one_hot, N)
    assert_follows(counts, P)


def test_resampling_from_p_on_rejection_is_caught():
    """The classic bug: on rejection, draw from p instead of the residual. The test must see it."""
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for d in torch.multinomial(Q, N, replacement=True, generator=gen).tolist():
        if torch.rand((), generator=gen) * Q[d] < P[d]:
            counts[d] += 1
        else:
            counts[torch.multinomial(P, 1, generator=gen)] += 1
    expected = P * N
    assert chisquare(counts.numpy(), expected.numpy()).pvalue < 1e-6


def test_residual_is_normalised_positive_part():
    r = residual(P, Q)
    assert torch.allclose(r.sum(), torch.tensor(1.0))
    assert (r[Q >= P] == 0).all()
    assert torch.allclose(residual(P, P), P)  # degenerate: falls back to p


def test_verify_sampled_matches_rule_per_position():
    """Position by position over a K=3 round: the first emitted token must follow p[0]."""
    gen = torch.Generator().manual_seed(0)
    p = torch.stack([P, Q, P, Q])  # [K+1, V]
    q = torch.stack([Q, P, Q])  # [K, V]
    counts = torch.zeros(6)
    for _ in range(10_000):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(3)])
        verdict = verify_sampled(p, drafts, q, gen)
        first = drafts[0].item() if verdict.num_accepted > 0 else verdict.next_token
        counts[first] += 1
    assert_follows(counts, P)


def test_verify_sampled_all_kept_gives_bonus_from_last_row():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    verdict = verify_sampled(p, torch.tensor([1, 2]), None, torch.Generator().manual_seed(0))
    assert (verdict.num_accepted, verdict.next_token, verdict.all_accepted) == (2, 0, True)


def test_early_mismatch_greedy():
    verdict = verify_greedy(torch.tensor([5, 9, 7, 1]), torch.tensor([5, 6, 7]))
    assert (verdict.num_accepted, verdict.next_token) == (1, 9)


def test_greedy_all_match_gives_bonus():
    verdict = verify_greedy(torch.tensor([5, 6, 7, 1]), torch.tensor([5, 6, 7]))
    assert (verdict.num_accepted, verdict.next_token) == (3, 1)


def test_no_draft_is_a_plain_step():
    verdict = verify_greedy(torch.tensor([4]), torch.tensor([], dtype=torch.long))
    assert (verdict.num_accepted, verdict.next_token, verdict.num_drafted) == (0, 4, 0)


def test_same_seed_same_verdicts():
    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        p = torch.stack([P] * 5)
        return [verify_sampled(p, torch.tensor([1, 1, 1, 1]), torch.stack([Q] * 4), gen) for _ in range(50)]

    assert run(3) == run(3)
    assert run(3) != run(4)
