import pytest
import torch

from specdec import SamplingParams, sample, warp_logits


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    assert torch.equal(warp_logits(logits, SamplingParams()), torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_temperature_one_is_softmax():
    logits = torch.randn(2, 7)
    assert torch.allclose(warp_logits(logits, SamplingParams(temperature=1.0)), torch.softmax(logits, -1))


def test_top_k_keeps_k_tokens():
    probs = warp_logits(torch.arange(10.0), SamplingParams(temperature=1.0, top_k=3))
    assert (probs > 0).sum() == 3 and probs[-3:].sum() == pytest.approx(1.0)


def test_top_p_keeps_smallest_set_reaching_mass():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = warp_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


def test_min_p_drops_tokens_far_below_the_top():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.07, 0.03]))
    probs = warp_logits(logits, SamplingParams(temperature=1.0, min_p=0.1))
    assert probs[3] == 0 and probs[2] > 0


def test_tiny_top_p_keeps_the_most_likely_token():
    """A top_p too small for fp32 (it rounds to 0) still leaves the top token, not NaN (found by fuzzing)."""
    logits = torch.tensor([[0.5, 2.0, 1.0], [3.0, 3.0, 0.0]])
    probs = warp_logits(logits, SamplingParams(temperature=1.0, top_p=5e-324))
    assert torch.isfinite(probs).all()
    assert probs[0].tolist() == [0.0, 1.0, 0.0] and probs[1].sum().item() == 1.0 and probs[1].max().item() == 1.0


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(min_p=1.0)])
def test_bad_params_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_seeded_generator_reproduces():
    probs = torch.softmax(torch.randn(50), 0)
    a = [sample(probs, SamplingParams(seed=5).make_generator()).item() for _ in range(3)]
    b = [sample(probs, SamplingParams(seed=5).make_generator()).item() for _ in range(3)]
    assert a == b


def test_tiny_temperature_is_greedy_not_nan():
    logits = torch.tensor([1.0, 3.0, 2.0])
    probs = warp_logits(logits, SamplingParams(temperature=5e-324))
    assert torch.equal(probs, torch.tensor([0.0, 1.0, 0.0]))


def test_a_draw_follows_the_weights_of_its_row_and_never_takes_a_zero_weight():
    from scipy.stats import chisquare

    weights = torch.tensor([[0.0, 2.0, 0.0, 5.0, 3.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]])  # not normalised
    rows = weights.repeat(20000, 1)
    drawn = sample(rows, torch.Generator().manual_seed(0)).reshape(20000, 2)
    for j in range(2):
        counts = torch.bincount(drawn[:, j], minlength=6)
        assert counts[weights[j] == 0].sum() == 0
        live = weights[j] > 0
        expected = (weights[j][live] / weights[j].sum() * 20000).tolist()
        assert chisquare(counts[live].tolist(), expected).pvalue > 1e-3
