import pytest

from specdec import best_k, expected_speedup, expected_tokens_per_round


def test_tau_closed_form_matches_sum_of_powers():
    for alpha in (0.0, 0.3, 0.8):
        for k in (1, 4, 8):
            assert expected_tokens_per_round(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)))


def test_perfect_draft_emits_k_plus_one():
    assert expected_tokens_per_round(1.0, 5) == 6


def test_speedup_formula_example():
    # alpha 0.8, K 4, c 0.05: tau = (1 - 0.8^5) / 0.2 = 3.3616, speedup = 3.3616 / 1.2
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)


def test_free_draft_wants_more_k_than_costly_draft():
    assert best_k(0.9, 0.0, 16).k > best_k(0.9, 0.3, 16).k


def test_bad_alpha_or_k_refused():
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.5, 2)
    with pytest.raises(ValueError):
        expected_tokens_per_round(0.5, 0)
