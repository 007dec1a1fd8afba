"""The rejection rule over a ragged batch: each sequence settles exactly as it would alone."""

from dataclasses import dataclass
from itertools import accumulate

import pytest
import torch
from scipy.stats import chisquare

from specdec.sampling import SamplingParams, warp_logits, warp_ragged
from specdec.verify import greedy_outcome, parse_ragged_round, ragged_outcome, ragged_round_values, sampled_outcome

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=1.0)
PARAMS = [GREEDY, SAMPLED, SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
          SamplingParams(temperature=0.9, min_p=0.1), SamplingParams(temperature=1.1, top_k=9, top_p=0.9, min_p=0.05)]
V = 16
NO_DRAFTS = torch.zeros(0, dtype=torch.long)


@dataclass
class Round:
    """One sequence's share of a ragged round: p [K+1, V], drafts [K], q [K, V] or None (one-hot)."""

    p: torch.Tensor
    drafts: torch.Tensor
    q: torch.Tensor | None = None
    params: SamplingParams = SAMPLED
    seed: int = 0


def one_hot(tokens: list[int], v: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), v).float()


def ragged_call(rounds: list[Round], generators: list[torch.Generator]):
    """Flatten the rounds into ragged_outcome's layout; returns (num_accepted [B], next_token [B], offsets)."""
    offsets = [0, *accumulate(r.drafts.shape[0] + 1 for r in rounds)]
    given = [r.q for r in rounds if r.q is not None]
    q = torch.cat(given) if given else None
    q_offsets = [0, *accumulate(0 if r.q is None else r.q.shape[0] for r in rounds)] if given else None
    drafts = torch.cat([r.drafts for r in rounds])
    num_accepted, next_token = ragged_outcome(torch.cat([r.p for r in rounds]), offsets, drafts, q, q_offsets,
                                              [r.params for r in rounds], generators)
    return num_accepted, next_token, offsets


def settle(rounds: list[Round], generators=None):
    """The host's view of one ragged round: [(Verdict, kept drafts)] per sequence."""
    generators = generators or [torch.Generator().manual_seed(r.seed) for r in rounds]
    num_accepted, next_token, offsets = ragged_call(rounds, generators)
    values = ragged_round_values(num_accepted, next_token, torch.cat([r.drafts for r in rounds]))
    return parse_ragged_round(values.tolist(), offsets)


def outcomes(rounds, generators=None) -> list[tuple[int, int]]:
    return [(v.num_accepted, v.next_token) for v, _ in settle(rounds, generators)]


def test_early_mismatch_greedy():
    rounds = [Round(one_hot([5, 9, 7, 1]), torch.tensor([5, 6, 7]), params=GREEDY),
              Round(one_hot([5, 6, 7, 1]), torch.tensor([5, 6, 7]), params=GREEDY)]
    (first, kept_first), (second, kept_second) = settle(rounds)
    assert (first.num_accepted, first.next_token, kept_first) == (1, 9, [5])
    assert (second.num_accepted, second.next_token, second.all_accepted, kept_second) == (3, 1, True, [5, 6, 7])


def test_sampled_early_mismatch_recovers_from_the_residual():
    """p puts nothing on the draft, so it is rejected whatever the draw; the residual has one token left."""
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    q = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    rounds = [Round(p, torch.tensor([2, 1]), q=q, seed=1),  # draft 0 kept (p = q there), draft 1 rejected
              Round(one_hot([2, 3, 0], 4), torch.tensor([2, 1]), seed=2)]  # one-hot q: rejected at 1, recovers 3
    assert outcomes(rounds) == [(1, 0), (1, 3)]


def test_all_accepted_gives_bonus_from_last_row():
    rounds = [Round(one_hot([1, 2, 0], 3), torch.tensor([1, 2]), seed=s) for s in range(3)]
    assert outcomes(rounds) == [(2, 0)] * 3


def test_no_draft_is_a_plain_step():
    rounds = [Round(one_hot([4]), NO_DRAFTS, params=GREEDY),
              Round(one_hot([7]), NO_DRAFTS),
              Round(one_hot([3, 6]), torch.tensor([3]), params=GREEDY)]
    assert outcomes(rounds) == [(0, 4), (0, 7), (1, 6)]
    assert outcomes(rounds[:2]) == [(0, 4), (0, 7)]  # no drafts in the whole batch


def test_q_equal_to_p_keeps_every_draft():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, V, generator=g), -1)
    for seed in range(50):
        drafts = torch.stack([torch.multinomial(p[i], 1, generator=g)[0] for i in range(3)])
        rounds = [Round(p, drafts, q=p[:3], seed=seed), Round(one_hot([9, 9]), torch.tensor([2]), seed=seed + 1)]
        assert [v.num_accepted for v, _ in settle(rounds)] == [3, 0]


def random_batch(g: torch.Generator, size: int) -> list[Round]:
    """Rounds of random K (0 included) and params: greedy, one-hot drafts and sampled drafts with q."""
    rounds = []
    for i in range(size):
        k = int(torch.randint(0, 6, (), generator=g))
        params = PARAMS[int(torch.randint(0, len(PARAMS), (), generator=g))]
        logits = torch.randn(k + 1, V, generator=g) * 2
        draft_logits = logits[:k] + torch.randn(k, V, generator=g)  # a draft that often agrees
        q = None
        if params.greedy or torch.rand((), generator=g) < 0.5:  # argmax or lookup-like: one-hot q
            drafts = draft_logits.argmax(-1)
        else:
            q = warp_logits(draft_logits, params)
            drafts = torch.multinomial(q, 1, generator=g).reshape(k) if k else torch.zeros(0, dtype=torch.long)
        rounds.append(Round(logits, drafts, q, params, seed=int(torch.randint(0, 2**31, (), generator=g))))
    return rounds


def alone(r: Round, logits: torch.Tensor, generator: torch.Generator) -> tuple[int, int]:
    """Today's single-sequence rule on one sequence, as the engine calls it."""
    if r.params.greedy:
        n, token = greedy_outcome(logits.argmax(-1), r.drafts)
    else:
        n, token = sampled_outcome(warp_logits(logits, r.params), r.drafts, r.q, generator)
    return int(n), int(token)


def clone(generator: torch.Generator) -> torch.Generator:
    copy = torch.Generator()
    copy.set_state(generator.get_state())
    return copy


@pytest.mark.parametrize("seed", range(8))
def test_each_sequence_settles_as_it_would_alone(seed):
    """Same outcome and same draws (generator state after) as greedy_outcome / sampled_outcome alone."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(10):
        batch = random_batch(g, size=int(torch.randint(1, 9, (), generator=g)))
        logits = [r.p for r in batch]
        offsets = [0, *accumulate(x.shape[0] for x in logits)]
        p = warp_ragged(torch.cat(logits), offsets, [r.params for r in batch])
        rounds = [Round(p[lo:hi], r.drafts, r.q, r.params) for r, lo, hi in zip(batch, offsets, offsets[1:])]
        generators = [torch.Generator().manual_seed(r.seed) for r in batch]
        copies = [clone(gen) for gen in generators]
        assert outcomes(rounds, generators) == [alone(r, x, c) for r, x, c in zip(batch, logits, copies)]
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(generators, copies))


def test_outcome_does_not_depend_on_the_companions():
    g = torch.Generator().manual_seed(11)
    batch = random_batch(g, size=8)
    for r in batch:
        r.p = warp_logits(r.p, r.params)
    whole = outcomes(batch)
    assert outcomes(batch[::-1]) == whole[::-1]
    assert outcomes(batch[2:5]) == whole[2:5]
    assert [outcomes([r])[0] for r in batch] == whole


def test_same_seed_same_outcomes():
    g = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(4, V, generator=g), -1)
    q = torch.softmax(torch.randn(3, V, generator=g), -1)
    rounds = [Round(p, torch.tensor([1, 2, 3]), q=q), Round(p, torch.tensor([4, 5, 6])), Round(p[:1], NO_DRAFTS)]

    def run(seed):
        generators = [torch.Generator().manual_seed(seed + i) for i in range(3)]
        return [outcomes(rounds, generators) for _ in range(30)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_ragged_outcome_reads_nothing_and_the_reader_reads_once(count_reads):
    rounds = [Round(one_hot([5, 9, 7, 1]), torch.tensor([5, 6, 7]), params=GREEDY),
              Round(torch.full((3, V), 1.0 / V), torch.tensor([1, 2]), q=torch.full((2, V), 1.0 / V)),
              Round(torch.full((2, V), 1.0 / V), torch.tensor([4]))]
    before = count_reads()  # building one-hot rows reads their range
    num_accepted, next_token, offsets = ragged_call(rounds, [torch.Generator() for _ in rounds])
    assert count_reads() == before
    values = ragged_round_values(num_accepted, next_token, torch.cat([r.drafts for r in rounds]))
    parse_ragged_round(values.tolist(), offsets)
    assert count_reads() == before + 1


def test_layout_errors_say_what_is_wrong():
    rounds = [Round(one_hot([1, 2]), torch.tensor([1])), Round(one_hot([3]), NO_DRAFTS)]
    shared = torch.Generator()
    with pytest.raises(ValueError, match="Generator of its own"):
        ragged_call(rounds, [shared, shared])
    with pytest.raises(ValueError, match="q_offsets"):
        ragged_outcome(one_hot([1, 2, 3]), [0, 2, 3], torch.tensor([1]), torch.ones(2, V) / V, [0, 2, 2],
                       [SAMPLED, SAMPLED], [torch.Generator(), torch.Generator()])
    with pytest.raises(ValueError, match="offsets"):
        ragged_outcome(one_hot([1, 2, 3]), [0, 2], torch.tensor([1]), None, None, [SAMPLED], [None])


# The chi-square test: sequences sharing every batch, each with its own p, q and kind of draft.
P = torch.tensor([0.40, 0.05, 0.20, 0.10, 0.15, 0.10])
Q = torch.tensor([0.10, 0.40, 0.20, 0.05, 0.15, 0.10])


def test_emitted_tokens_follow_p_for_sequences_sharing_a_batch():
    g = torch.Generator().manual_seed(0)
    p_random = torch.softmax(torch.randn(3, 6, generator=g) * 2, -1)
    shared = [Round(torch.stack([P, Q, P]), None, q=torch.stack([Q, P])),  # sampled draft, K = 2
              Round(p_random, torch.tensor([2, 0])),  # one-hot draft: a fixed guess
              Round(p_random[:1], NO_DRAFTS),  # K = 0: the bonus from p
              Round(torch.stack([Q, P]), None, q=Q[None]),  # q = p: every draft kept, the bonus from p[1]
              Round(one_hot([1, 4, 2], 6), torch.tensor([1, 3]), params=GREEDY)]
    generators = [torch.Generator().manual_seed(10 + i) for i in range(len(shared))]
    counts = torch.zeros(4, 6)
    n = 6000
    for _ in range(n):
        shared[0].drafts = torch.multinomial(shared[0].q, 1, generator=g).reshape(2)
        shared[3].drafts = torch.multinomial(Q, 1, generator=g)
        for i, (verdict, kept) in enumerate(settle(shared, generators)[:4]):
            emitted = kept + [verdict.next_token]
            counts[i, emitted[-1] if i == 3 else emitted[0]] += 1
    for i, expected in enumerate([P, p_random[0], p_random[0], P]):
        assert chisquare(counts[i].numpy(), (expected * n).numpy()).pvalue > 1e-3
