"""The speculation policy: K per sequence per step from acceptance and the verify cost (choose_ks),
and the batched engine under it: K changes how many drafts are verified, never the output."""

import itertools

import numpy as np
import pytest
import torch

from specdec.batching import BatchConfig, BatchedEngine
from specdec.drafters import ModelDrafter
from specdec.drafters.oracle import OracleDrafter
from specdec.engine import GenerationConfig, Origin
from specdec.generation import SpecStats
from specdec.verify import Verdict
from specdec.errors import InvalidRequestError
from specdec.models.slots import LoopSlots
from specdec.sampling import SamplingParams
from specdec.speedup import expected_tokens_per_round
from specdec.guard import ThroughputGuard
from specdec.speculation import (AcceptancePool, DraftCost, SpeculationPolicy, StepCalibration, VerifyCostTable, choose_ks,
                                 measure_verify_cost, step_seconds)
from tests.markov import MarkovLM
from tests.test_batching import make_drafter, mixed_requests, plain, run_arriving
from tests.test_exactness import HOT, PROMPT, V, exact_joint, goodness_of_fit

CPU = torch.device("cpu")


def tokens_at(alpha: float, k: int) -> float:
    """tau from the formula, the reference the policy's sums of a^j are checked against (1 for k = 0)."""
    return 1.0 if k == 0 else expected_tokens_per_round(alpha, k)


# A GPU-like pass: flat in rows at batch 1, rows cost about as much as sequences at batch 32.
GPU_LIKE = VerifyCostTable((1, 32), (1, 2, 5, 9), ((10e-3, 10.1e-3, 10.3e-3, 10.6e-3), (12e-3, 24e-3, 60e-3, 108e-3)))


def test_batch_one_with_a_cheap_verify_and_high_acceptance_speculates():
    plan = choose_ks([0.8], [8], GPU_LIKE, draft_per_pass=0.2e-3)
    assert plan.ks[0] > 1
    assert plan.predicted_tokens_per_second > 2 * plan.plain_tokens_per_second


def test_steep_rows_at_high_batch_or_low_acceptance_pick_plain_steps():
    assert choose_ks([0.8] * 32, [8] * 32, GPU_LIKE, 0.2e-3).ks == (0,) * 32
    assert choose_ks([0.02], [8], GPU_LIKE, 0.2e-3).ks == (0,)
    expensive_drafter = choose_ks([0.8], [8], GPU_LIKE, draft_per_pass=20e-3)
    assert expensive_drafter.ks == (0,)


def test_each_sequence_gets_its_own_k_by_its_acceptance():
    cpu_like = VerifyCostTable.from_rows([(1, 1.0), (2, 1.25), (5, 2.0), (9, 3.0)])
    plan = choose_ks([0.95, 0.1, 0.6], [8, 8, 8], cpu_like, 0.0)
    assert plan.ks[0] > plan.ks[2] > plan.ks[1] == 0


def test_a_gain_below_the_margin_gives_way_to_plain():
    cost = VerifyCostTable.from_rows([(1, 1.0), (2, 1.45)])  # one draft at alpha 0.5: 1.5 tokens for 1.45 s
    assert choose_ks([0.5], [1], cost, 0.0).ks == (1,)
    held = choose_ks([0.5], [1], cost, 0.0, min_gain=0.05)
    assert held.ks == (0,) and held.predicted_tokens_per_second == held.plain_tokens_per_second


def test_caps_bound_k_and_prefill_rows_count_as_cost():
    assert choose_ks([0.99], [2], GPU_LIKE, 0.0).ks == (2,)
    alone = step_seconds(GPU_LIKE, [3], [], 0.0)
    assert step_seconds(GPU_LIKE, [3], [200], 0.0) > alone


def test_sequences_prefilling_in_the_pass_count_as_the_tokens_their_time_is_worth():
    """Drafting that pays for a sequence alone does not pay while its draft passes would hold up ten
    newcomers' prefill: each prefilling sequence counts as the token a plain step gives it."""
    assert choose_ks([0.8], [4], GPU_LIKE, draft_per_pass=3e-3).ks[0] > 0
    newcomers = choose_ks([0.8], [4], GPU_LIKE, draft_per_pass=3e-3, other_rows=[8] * 10)
    assert newcomers.ks == (0,) and newcomers.predicted_tokens == 1.0
    assert choose_ks([0.8], [4], GPU_LIKE, draft_per_pass=0.0, other_rows=[8] * 10).ks[0] > 0  # free drafts still pay


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.99])
@pytest.mark.parametrize("batch", [1, 3, 16, 64])
@pytest.mark.parametrize("draft_cost", [0.0, 1e-3, 10e-3])
def test_never_predicts_worse_than_plain_under_its_own_model(alpha, batch, draft_cost):
    plan = choose_ks([alpha] * batch, [6] * batch, GPU_LIKE, draft_cost)
    plain_seconds = step_seconds(GPU_LIKE, [0] * batch, [], draft_cost)
    assert plan.plain_seconds == pytest.approx(plain_seconds)
    assert plan.predicted_tokens_per_second >= batch / plain_seconds
    tokens = sum(tokens_at(alpha, k) for k in plan.ks)
    assert plan.predicted_tokens_per_second == pytest.approx(tokens / step_seconds(GPU_LIKE, plan.ks, [], draft_cost))


@pytest.mark.parametrize("seed", range(40))
def test_the_plan_is_the_best_of_every_split_under_the_model(seed):
    """Brute force over every K vector, with costs of any shape (on a CPU 5 rows may cost less than
    1), a drafter's fixed cost, a calibration and prefill chunks in the pass: no split beats
    choose_ks's, and choose_ks's prediction is its own split's."""
    import itertools
    import random

    rng = random.Random(seed)
    batch = rng.randint(1, 3)
    rows = (1, 2, 3, 5)
    cost = VerifyCostTable((1, 2, 3), rows, tuple(tuple(rng.uniform(1, 3) for _ in rows) for _ in range(3)))
    alphas = [rng.choice([0.0, rng.random(), 1.0]) for _ in range(batch)]
    caps = [rng.randint(0, 12 if batch == 1 else 4) for _ in range(batch)]  # one sequence: long plans too
    draft, fixed = rng.choice([0.0, 0.05, 0.3]), rng.choice([0.0, 0.2])
    factor, filling = rng.choice([1.0, 0.9, 1.3]), rng.choice([(), (7,), (3, 40)])
    plan = choose_ks(alphas, caps, cost, draft, filling, drafting_factor=factor, draft_fixed=fixed)

    def seconds(ks):
        return step_seconds(cost, ks, filling, draft, fixed) * (factor if any(ks) else 1.0)

    def decoded(ks):
        return sum(tokens_at(a, k) for a, k in zip(alphas, ks))

    def rate(ks):  # a prefill chunk's sequence counts as one token (choose_ks's doc)
        return (decoded(ks) + len(filling)) / seconds(ks)
    best = max(rate(ks) for ks in itertools.product(*(range(c + 1) for c in caps)))
    assert rate(plan.ks) == pytest.approx(best)
    assert plan.predicted_tokens_per_second == pytest.approx(decoded(plan.ks) / seconds(plan.ks))
    assert all(0 <= k <= c for k, c in zip(plan.ks, caps))


def test_one_unlucky_first_round_does_not_turn_speculation_off_where_it_is_cheap():
    """The prior weighs 4 pseudo-drafts: after 0 of 4 judged drafts accepted the estimate is 0.25, and at batch 1,
    where a verify costs about a step, drafting still pays (K = 0 would bring no new evidence)."""
    policy = SpeculationPolicy.auto(k_max=4)
    alpha = policy.acceptance(0, 4)
    assert alpha == pytest.approx(0.25)
    assert choose_ks([alpha], [4], GPU_LIKE, 0.1e-3, min_gain=policy.min_gain).ks[0] > 0
    assert choose_ks([policy.acceptance(0, 40)], [4], GPU_LIKE, 0.1e-3, min_gain=policy.min_gain).ks == (0,)


def test_the_draft_cost_is_a_recent_median_and_a_high_one_does_not_stick():
    from specdec.speculation import DraftCost

    cost = DraftCost(prior=0.0, window=8, memory=50)
    assert cost.per_pass == 0.0
    cost.record(2.0, 4)  # a step that captured a CUDA graph: 0.5 s a token
    assert choose_ks([0.8], [8], GPU_LIKE, cost.per_pass).ks == (0,)  # so high that nobody drafts now
    for _ in range(50):
        cost.tick()
    assert cost.per_pass == 0.5
    cost.tick()  # forgotten: drafting resumes and is timed again
    assert cost.per_pass == 0.0 and choose_ks([0.8], [8], GPU_LIKE, cost.per_pass).ks[0] > 1
    for seconds in (2.0, 0.004, 0.004, 0.0044):
        cost.record(seconds, 4)
    assert cost.per_pass == pytest.approx(0.001, rel=0.1)  # the outlier moves the median little


def test_drafting_steps_slower_than_predicted_make_the_policy_draft_less():
    """Steps that draft take twice what the model predicts, plain ones what it predicts: the factor
    reads 2, and a plan that pays at factor 1 gives way to plain decoding."""

    calibration = StepCalibration(window=8, memory=20)
    assert calibration.factor == 1.0
    for _ in range(8):
        calibration.record(observed=2.0, predicted=1.0, drafted=True)
        calibration.record(observed=1.1, predicted=1.0, drafted=False)
    assert calibration.factor == pytest.approx(2.0 / 1.1)
    cost = VerifyCostTable.from_rows([(1, 1.0), (2, 1.2), (5, 1.6)])
    assert choose_ks([0.6], [4], cost, 0.0).ks[0] > 0
    assert choose_ks([0.6], [4], cost, 0.0, drafting_factor=calibration.factor).ks == (0,)
    for _ in range(21):  # no drafting step for longer than its memory: the factor is forgotten
        calibration.record(observed=1.0, predicted=1.0, drafted=False)
    assert calibration.factor == 1.0


def test_the_cost_table_interpolates_and_refuses_bad_shapes():
    one, thirty_two, sixteen = (GPU_LIKE.costs(b, np.asarray([rows]))[0] for b, rows in ((1, 1), (32, 64), (16, 16)))
    assert one == pytest.approx(10e-3)
    assert thirty_two == pytest.approx(24e-3)
    assert 10e-3 < sixteen < 12e-3
    with pytest.raises(InvalidRequestError, match="increasing"):
        VerifyCostTable((2, 1), (1,), ((1.0,), (1.0,)))
    with pytest.raises(InvalidRequestError, match="mode"):
        SpeculationPolicy(mode="sometimes")
    with pytest.raises(InvalidRequestError, match="k must be >= 1"):
        SpeculationPolicy.auto(k_max=0)


def test_the_cost_table_describes_itself_in_milliseconds():
    table = VerifyCostTable((1, 32), (1, 5), ((4.4e-3, 4.6e-3), (5.6e-3, 11e-3)))
    assert table.describe().splitlines() == ["ms a pass of N sequences with R new rows each, R = 1 5",
                                             "  N =   1: 4.40 4.60", "  N =  32: 5.60 11.00"]


def test_acceptance_estimate_starts_at_the_prior_and_follows_the_counts():
    policy = SpeculationPolicy.auto()
    assert policy.acceptance(0, 0) == 0.5
    assert policy.acceptance(90, 100) > 0.85 and policy.acceptance(1, 100) < 0.05


def test_the_acceptance_estimate_counts_only_judged_drafts():
    """Rounds of K = 4 where each draft is kept with probability 0.8 until the first rejection: the
    estimate finds 0.8 (drafts after a rejection were never judged); accepted over drafted reads
    about 0.59, which would make K = 4 look worth 2.2 tokens a round instead of 3.4."""
    gen = torch.Generator().manual_seed(0)
    stats = SpecStats()
    for _ in range(2000):
        kept = 0
        while kept < 4 and torch.rand((), generator=gen).item() < 0.8:
            kept += 1
        stats.record_round(Verdict(kept, 0, 4), kept + 1)
    policy = SpeculationPolicy.auto(k_max=4)
    assert policy.acceptance(stats.accepted, stats.judged) == pytest.approx(0.8, abs=0.02)
    assert stats.accepted / stats.drafted == pytest.approx(0.59, abs=0.02)
    plain_round = Verdict(0, 0, 0)
    stats.record_round(plain_round, 1)  # a plain step judges nothing
    assert policy.acceptance(stats.accepted, stats.judged) == pytest.approx(0.8, abs=0.02)


def test_greedy_output_under_auto_equals_plain_decoding(tiny_target, tiny_draft):
    """Mixed drafters and arrivals; a cost table under which the policy mixes K = 0 and K > 0."""
    requests = mixed_requests(16, seed=3)
    costs = VerifyCostTable.from_rows([(1, 1.0), (2, 1.3), (5, 2.2), (9, 3.5)])
    policy = SpeculationPolicy.auto(k_max=6, verify_cost=costs)
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), None, config=BatchConfig(8, policy))
    seen, step = [], engine.step
    engine.step = lambda: (step(), seen.append(engine.last_decision))[0]
    drafters = [make_drafter(kind, tiny_target, tiny_draft) for _, _, kind, _ in requests]
    handles = run_arriving(engine, requests, drafters)
    for (prompt, config, kind, _), handle in zip(requests, handles):
        assert handle.token_ids == plain(tiny_target, prompt, config).token_ids, (kind, prompt, config)
    ks = [k for d in seen if d is not None for k in d.ks]
    assert 0 in ks and max(ks) > 1 and all(d.mode == "auto" for d in seen if d)
    assert all(len(d.ks) == len(d.request_ids) <= d.batch_size <= 4 for d in seen if d)


def test_a_step_whose_drafter_catches_up_is_not_timed(tiny_target, tiny_draft, monkeypatch):
    """A draft model's first draft reads the whole prompt: the draft cost and the calibration leave
    that step out (it times the catching up, not the drafting) and take every drafting step after."""
    costs = VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)])  # verify rows almost free: it drafts
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=costs)
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 1), None, config=BatchConfig(64, policy))
    timed, calibrated = [], []
    monkeypatch.setattr(engine._draft_cost, "record", lambda seconds, passes: timed.append(passes))
    monkeypatch.setattr(engine._calibration, "record", lambda o, p, drafted: calibrated.append(drafted))
    engine.submit(list(range(3, 43)), GenerationConfig(max_new_tokens=24, ignore_eos=True),
                  drafter=make_drafter("model", tiny_target, tiny_draft))
    decisions, busy = [], True
    while busy:
        busy = engine.step()
        decisions.append(engine.last_decision.ks)
    drafting = [ks for ks in decisions if any(ks)]
    assert len(drafting) >= 3
    assert len(timed) == len(drafting) - 1 and all(1 <= p <= 4 for p in timed)
    assert calibrated.count(True) == len(drafting) - 1


@pytest.mark.parametrize("drafting", [True, False])
def test_the_calibration_times_a_step_with_its_tokens_emitted(tiny_target, tiny_draft, monkeypatch, drafting):
    """A step's seconds for the calibration are those the guard reads: the whole call, the listeners
    that take its tokens included. A server's listeners feed its streams; read only up to the settle,
    a pipelined plain step missed the emitting of the step before (its pass ran meanwhile) and a
    drafting step its own, so drafting read dearer than plain against the model than it was. Two
    sequences, drafting (verify rows almost free) or plain and pipelined (rows dear)."""
    import time

    rows = [(1, 1.0), (2, 1.01), (5, 1.02)] if drafting else [(1, 1.0), (2, 3.0), (5, 9.0)]
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=VerifyCostTable.from_rows(rows))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), None,
                           config=BatchConfig(64, policy, pipeline=not drafting))
    observed, guarded = [], []
    monkeypatch.setattr(StepCalibration, "record", lambda self, o, p, drafted: observed.append((o, drafted)))
    monkeypatch.setattr(engine._guard, "record", lambda load, n, tokens, seconds, plain: guarded.append(seconds))
    slow_listener = 0.02  # seconds: far above a step of the tiny model
    for first in (3, 5):
        engine.submit(list(range(first, first + 40)), GenerationConfig(max_new_tokens=24, ignore_eos=True),
                      drafter=make_drafter("model", tiny_target, tiny_draft),
                      listener=lambda handle, tokens: time.sleep(slow_listener))
    engine.run()
    decoding = [seconds for seconds, _ in observed[1:]]  # the prompts' step emits nothing: no listener
    assert len(decoding) >= 3 and observed[0][0] < slow_listener
    assert all(seconds >= slow_listener for seconds in decoding)
    assert set(decoding) <= set(guarded)  # the seconds the guard scores (it also scores the catching up)
    assert any(drafted for _, drafted in observed) == drafting


def estimate(pool: AcceptancePool, accepted: float, judged: float) -> float:
    """One sequence's estimate under drafter "d"."""
    return pool.estimates([("d", accepted, judged)])[0]


def test_the_pool_explores_a_new_drafter_then_lends_its_mean_to_new_sequences():
    policy = SpeculationPolicy.auto(k_max=4)
    pool = AcceptancePool(policy, explore=32, memory=1000)
    assert pool.exploring("d") and estimate(pool, 0, 0) == 1.0  # plan as if all were kept: it drafts
    pool.add("d", 24, 30)
    assert pool.exploring("d")
    pool.add("d", 8, 10)  # 32 of 40 judged drafts kept
    assert not pool.exploring("d") and pool.exploring("other")
    assert estimate(pool, 0, 0) == pytest.approx(policy.acceptance(32, 40), abs=1e-9)  # a new sequence: the pool's
    assert estimate(pool, 0, 40) < 0.1  # its own evidence outweighs the prior's 4 pseudo-drafts
    assert estimate(pool, 0, 0) > 0.75 > policy.acceptance(0, 0)
    pool.add("d", 900, 990)  # past its memory: the counts halve (515 of 515 + ...), the mean holds
    assert pool._counts["d"] == [466.0, 515.0]


def test_a_good_drafter_is_found_from_a_prior_that_would_never_try_it(tiny_target):
    """At a = 0.5 (the neutral prior) this cost table makes drafting lose, at a = 1 it wins: without
    exploration the policy would never draft, so never learn. The oracle at alpha 1.0 (every draft
    kept): it explores, learns that drafting pays and drafts on; the next sequence starts from the pool."""
    costs = VerifyCostTable.from_rows([(1, 1.0), (2, 1.5), (3, 1.9), (5, 2.6)])
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=costs)
    assert choose_ks([policy.acceptance(0, 0)], [4], costs, 0.0, min_gain=policy.min_gain).ks == (0,)
    assert choose_ks([1.0], [4], costs, 0.0, min_gain=policy.min_gain).ks == (4,)
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 1), None, config=BatchConfig(64, policy))
    prompt = list(range(3, 23))
    config = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    for _ in range(2):
        oracle = OracleDrafter(tiny_target.with_own_cache(), alpha=1.0, horizon=64)
        handle = engine.submit(prompt, config, drafter=oracle)
        engine.run()
        assert handle.token_ids == plain(tiny_target, prompt, config).token_ids
        assert handle.stats.rounds < 20 and handle.stats.judged >= 32  # it drafted (48 tokens in < 20 rounds)


def simulated_tokens_per_step(policy: SpeculationPolicy, costs: VerifyCostTable, pool: AcceptancePool, alpha: float,
                              tokens: int, seed: int) -> float:
    """One sequence under the auto policy with the engine's estimate and fading, each draft kept with
    probability alpha: its tokens per second under the cost table."""
    from specdec.speculation import SequenceEvidence, fade_evidence

    rng, evidence, made, step, seconds = np.random.default_rng(seed), SequenceEvidence(), 0, 0, 0.0
    while made < tokens:
        step += 1
        fade_evidence(policy, step, [evidence])
        k = choose_ks([estimate(pool, evidence.accepted, evidence.judged)], [4], costs, 0.0,
                      min_gain=policy.min_gain).ks[0]
        kept = int(np.argmin(np.append(rng.random(k) < alpha, False)))  # drafts before the first rejection
        if k:
            evidence.add(kept, min(kept + 1, k))
        made += kept + 1
        seconds += float(costs.costs(1, np.asarray([1 + k]))[0])
    return made / seconds


def test_a_sequence_that_stopped_after_unlucky_rounds_drafts_again():
    """Where drafting pays from a = 0.7 (this cost table), a pool at 0.8 and 4 pseudo-drafts: one
    rejected first draft (0.64) turns a sequence plain. With lifelong counts (a half-life of a million
    steps) it stays plain, bringing no evidence to undo it; with its evidence fading it returns to the
    pool's mean and drafts again. 40 sequences of 200 tokens, each draft kept with probability 0.8: the
    gain over plain is 97 % of a fixed K = 4's with fading, 68 % without."""
    costs = VerifyCostTable.from_rows([(1, 1.0), (2, 1.62), (3, 2.09), (5, 2.64)])
    always = tokens_at(0.8, 4) / 2.64  # K = 4 every step, against plain's 1 token a step
    rates = {}
    for half_life in (16, 10**6):
        policy = SpeculationPolicy.auto(k_max=4, verify_cost=costs, evidence_half_life=half_life)
        pool = AcceptancePool(policy)
        pool.add("d", 800, 1000)
        assert choose_ks([estimate(pool, 0, 0)], [4], costs, 0.0, min_gain=policy.min_gain).ks == (4,)
        assert choose_ks([estimate(pool, 0, 1)], [4], costs, 0.0, min_gain=policy.min_gain).ks == (0,)
        rates[half_life] = np.mean([simulated_tokens_per_step(policy, costs, pool, 0.8, 200, seed) for seed in range(40)])
    gain = {half_life: (rate - 1) / (always - 1) for half_life, rate in rates.items()}  # of K = 4's over plain
    assert gain[16] > 0.9 and gain[10**6] < 0.8


def test_evidence_fades_to_nothing_and_stays_put_once_gone():
    from specdec.speculation import SequenceEvidence

    evidence = SequenceEvidence()
    evidence.add(3, 4)
    evidence.fade(0.5)
    assert (evidence.accepted, evidence.judged) == (1.5, 2.0)
    for _ in range(2):
        evidence.fade(0.5)
    assert (evidence.accepted, evidence.judged) == (0.375, 0.5)
    evidence.fade(0.5)
    assert (evidence.accepted, evidence.judged) == (0.0, 0.0)  # under half a judged draft: forgotten
    with pytest.raises(InvalidRequestError, match="evidence_half_life"):
        SpeculationPolicy.auto(evidence_half_life=1)


def test_the_calibration_is_read_to_two_percent_so_a_plain_stretch_reuses_its_plan():
    from specdec.speculation import StepCalibration

    readings = []
    for drafting in (1.3, 1.305, 1.33):
        calibration = StepCalibration(window=4)
        for _ in range(4):
            calibration.record(observed=drafting, predicted=1.0, drafted=True)
            calibration.record(observed=1.0, predicted=1.0, drafted=False)
        assert calibration.factor_to(0.02) == pytest.approx(calibration.factor, rel=0.01)
        readings.append(calibration.factor_to(0.02))
    assert readings[0] == readings[1] != readings[2]


def test_a_plain_stretch_looks_at_its_sequences_once_a_fade(tiny_target, monkeypatch):
    """Where drafting never pays (a verify costs its rows) four sequences decode plainly under auto: the
    policy looks at every sequence's evidence once per fade period (8 steps at a half-life of 16) and
    when the batch changes, not at every step; the output is plain decoding's."""
    costs = VerifyCostTable((1, 4), (1, 2, 3, 5), tuple(tuple(1e-3 * r * b for r in (1, 2, 3, 5)) for b in (1, 4)))
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=costs)
    looks = []
    estimates = AcceptancePool.estimates
    monkeypatch.setattr(AcceptancePool, "estimates", lambda pool, evidence: looks.append(1) or estimates(pool, evidence))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), None, config=BatchConfig(64, policy))
    config = GenerationConfig(max_new_tokens=64, ignore_eos=True)
    prompts = [list(range(3 + i, 13 + i)) for i in range(4)]
    handles = [engine.submit(p, config, drafter=OracleDrafter(tiny_target.with_own_cache(), 0.8, horizon=80))
               for p in prompts]
    engine.run()
    assert all(h.stats.drafted == 0 for h in handles)
    assert [h.token_ids for h in handles] == [plain(tiny_target, p, config).token_ids for p in prompts]
    assert engine._steps >= 64 and len(looks) <= engine._steps // 8 + 8  # + the steps where the batch changed


def test_auto_prices_no_step_where_no_sequence_can_draft(tiny_target, monkeypatch):
    """A --draft none server under auto (the default): plain steps, no look at any evidence, and no
    guard windows (steps where nothing could draft say nothing of drafting against plain steps)."""
    looks = []
    estimates = AcceptancePool.estimates
    monkeypatch.setattr(AcceptancePool, "estimates", lambda pool, evidence: looks.append(1) or estimates(pool, evidence))
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)]),
                                    guard_window=2)
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: make_drafter("none", None, None),
                           config=BatchConfig(64, policy))
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    handles = [engine.submit(p, config) for p in ([5, 6, 7], [9, 10])]
    decisions = []
    while engine.step():
        decisions.append(engine.last_decision)
    assert looks == [] and decisions and all(d.mode == "auto" and not any(d.ks) for d in decisions)
    assert engine.guard.summary == ()
    assert [h.token_ids for h in handles] == [plain(tiny_target, p, config).token_ids for p in ([5, 6, 7], [9, 10])]


def test_auto_keeps_a_seeded_sample_its_seeds_whatever_the_batch(tiny_target):
    """Where drafting pays, auto drafts for greedy and unseeded sequences but not for a seeded sampled
    one: its sample is plain decoding's with that seed, alone or beside others (rule 6)."""
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)]))
    seeded = GenerationConfig(max_new_tokens=16, ignore_eos=True, sampling=SamplingParams(1.0, seed=11))
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]

    def run(companions: int):
        engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), lambda: make_drafter("lookup", None, None),
                               config=BatchConfig(64, policy))
        others = [engine.submit([9, 10, 9, 10, 9, 10], GenerationConfig(max_new_tokens=16, ignore_eos=True))
                  for _ in range(companions)]
        handle = engine.submit(prompt, seeded)
        engine.run()
        return handle, others

    alone, _ = run(0)
    beside, others = run(3)
    assert alone.token_ids == beside.token_ids == plain(tiny_target, prompt, seeded).token_ids
    assert alone.stats.drafted == beside.stats.drafted == 0 and all(o.stats.drafted > 0 for o in others)


def test_fixed_mode_overrides_each_request_k(tiny_target):
    first = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: make_drafter("lookup", None, None),
                          config=BatchConfig(speculation=SpeculationPolicy.fixed(3)))
    first.submit([5, 6, 5, 6, 5, 6], GenerationConfig(max_new_tokens=10, k=1))
    first.step()  # the prefill
    first.step()
    assert first.last_decision.ks == (3,) and first.last_decision.predicted_tokens_per_second is None


@pytest.mark.parametrize("guard_window", [0, 2])
def test_sampled_output_under_auto_follows_target_distribution(guard_window, monkeypatch):
    """1500 unseeded 2-token answers in 8 slots with a Markov draft; the policy picks 0 or 1 draft, and
    with a guard its mode is switched every few steps (forced: almost every step here carries a
    newcomer's prefill, which the guard does not score). Unseeded, since auto drafts for no seeded
    sample; their "fresh entropy" is a counter here, so the test is repeatable."""
    entropy = itertools.count(1000)
    monkeypatch.setattr(SamplingParams, "make_generator",
                        lambda self, device="cpu": torch.Generator(device=device).manual_seed(next(entropy)))
    costs = VerifyCostTable.from_rows([(1, 1.0), (2, 1.2), (3, 1.9)])
    policy = SpeculationPolicy.auto(k_max=2, verify_cost=costs, guard_window=guard_window)
    engine = BatchedEngine(LoopSlots(lambda: MarkovLM(V, seed=0), 8), lambda: ModelDrafter(MarkovLM(V, seed=1), V),
                           config=BatchConfig(speculation=policy))
    modes = []  # the guard's mode at each look: closed for three steps, open for three
    monkeypatch.setattr(ThroughputGuard, "mode_at",
                        lambda guard, load: modes.append(("open", "closed")[engine._steps // 3 % 2]) or modes[-1])
    handles = [engine.submit(PROMPT, GenerationConfig(max_new_tokens=2, sampling=SamplingParams(1.0)))
               for _ in range(1500)]
    engine.run()
    counts, origins = {}, set()
    for handle in handles:
        counts[tuple(handle.token_ids)] = counts.get(tuple(handle.token_ids), 0) + 1
        origins |= {t.origin for t in handle}
    assert goodness_of_fit(counts, exact_joint(MarkovLM(V, seed=0), HOT, n_tokens=2)) > 1e-3
    assert Origin.ACCEPTED in origins
    if guard_window:
        assert modes.count("closed") >= 100 and modes.count("open") >= 100


def test_auto_measures_the_verify_cost_of_the_real_target(tiny_target):
    slots = LoopSlots(tiny_target.with_own_cache, 3)
    table = measure_verify_cost(slots, k_max=4, trials=1)
    assert table.batch_sizes == (1, 2, 3) and table.rows_per_seq == (1, 2, 3, 5)
    assert all(slots.cache_len(s) == 0 for s in range(3))
    engine = BatchedEngine(slots, lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(speculation=SpeculationPolicy.auto(k_max=4)))
    expected = plain(tiny_target, [7, 8, 7, 8], GenerationConfig(max_new_tokens=6)).token_ids
    assert list(engine.generate([[7, 8, 7, 8]], GenerationConfig(max_new_tokens=6))[0].token_ids) == list(expected)


def test_the_speculation_flag_resolves_to_a_policy():
    from specdec.speculation import policy_from_flag

    assert policy_from_flag("request", 4) == SpeculationPolicy()
    assert policy_from_flag("auto", 6) == SpeculationPolicy.auto(k_max=6)
    assert policy_from_flag("2", 6) == SpeculationPolicy.fixed(2)
    with pytest.raises(InvalidRequestError, match="auto, request or a whole number"):
        policy_from_flag("0", 6)


def test_pipelined_seeded_samples_under_auto_never_consult_the_policy(tiny_target, monkeypatch):
    """Seeded sampled sequences may not draft under auto, so whether the next step may be queued
    ahead needs no plan either: no look at any evidence, and the tokens of plain decoding."""
    looks = []
    estimates = AcceptancePool.estimates
    monkeypatch.setattr(AcceptancePool, "estimates", lambda pool, evidence: looks.append(1) or estimates(pool, evidence))
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)]))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(64, policy, pipeline=True))
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True, sampling=SamplingParams(1.0, seed=5))
    handles = [engine.submit(p, config) for p in ([5, 6, 7, 5, 6, 7], [9, 10, 9, 10])]
    engine.run()
    assert looks == [] and all(h.stats.drafted == 0 for h in handles)
    assert [h.token_ids for h in handles] == [plain(tiny_target, p, config).token_ids
                                              for p in ([5, 6, 7, 5, 6, 7], [9, 10, 9, 10])]


def test_auto_times_its_drafts_without_waiting_for_the_device(tiny_target, monkeypatch):
    """The draft cost is read from the drafting's span once the step has settled, never by a wait
    between drafting and the verify (on a GPU the host queues the verify while the drafts run)."""
    import specdec.batching as batching

    waits = []
    monkeypatch.setattr(batching, "_wait_for", lambda device: waits.append(device))
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)]))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(64, policy))
    handle = engine.submit([5, 6, 7, 5, 6, 7, 5, 6], GenerationConfig(max_new_tokens=24, ignore_eos=True))
    engine.run()
    assert handle.stats.drafted > 0 and handle.stats.rounds > 2
    assert len(waits) == 1  # the prompt's prefill-only step, whose seconds must be its own
    assert engine._draft_cost.per_pass > 0  # the drafting steps' spans were read all the same
    assert engine._draft_cost._per_unseen.median is not None  # the first draft caught up on the prompt


@pytest.mark.parametrize("dear_at, drafts", [(4, True), (32, True), (1, False)])
def test_the_draft_cost_is_kept_by_load(tiny_target, dear_at, drafts):
    """A drafting pass priced at a second at one load (as a burst at 32 in flight can teach) prices
    drafting at that load only: a lone sequence still drafts unless the dear price is load 1's."""
    from specdec.guard import ThroughputGuard

    policy = SpeculationPolicy.auto(k_max=4, verify_cost=VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)]))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(64, policy))
    dear = DraftCost(prior=0.0)
    dear.record(4.0, 4)
    engine._draft_costs[ThroughputGuard.bucket_of(dear_at)] = dear
    handle = engine.submit([5, 6, 7, 5, 6, 7, 5, 6], GenerationConfig(max_new_tokens=24, ignore_eos=True))
    engine.run()
    assert (handle.stats.drafted > 0) == drafts


# The H200's verify at batch 1 (ms, 1 / 2 / 3 / 5 rows) and its drafter at 1 in flight: a three-pass
# drafting step 4.14 ms, a four-pass one 4.88 (steps of 8.66 and 9.40 ms in all).
H200_BATCH_ONE = VerifyCostTable.from_rows([(1, 4.52e-3), (2, 4.51e-3), (3, 4.53e-3), (5, 4.55e-3)])


def test_the_draft_cost_splits_into_a_fixed_part_and_passes_and_the_fourth_draft_pays():
    cost = DraftCost(prior=0.0, min_samples=8)
    for _ in range(8):
        cost.record(4.14e-3, 3)
    assert cost.fixed == 0.0 and cost.per_pass == pytest.approx(1.38e-3)  # one pass count: seconds over passes
    assert choose_ks([0.8], [4], H200_BATCH_ONE, cost.per_pass, draft_fixed=cost.fixed).ks == (3,)
    for _ in range(7):
        cost.record(4.88e-3, 4)
    assert cost.fixed == 0.0  # seven steps at four passes: not yet a median to fit
    cost.record(4.88e-3, 4)
    assert cost.fixed == pytest.approx(1.92e-3) and cost.per_pass == pytest.approx(0.74e-3)
    assert cost.seconds(4) == pytest.approx(4.88e-3) and cost.seconds(0) == 0.0
    assert choose_ks([0.8], [4], H200_BATCH_ONE, cost.per_pass, draft_fixed=cost.fixed).ks == (4,)
    # Only four-pass steps from now on: the three-pass median is kept, and the line with it.
    for _ in range(100):
        cost.tick()
        cost.record(4.88e-3, 4)
    assert cost.per_pass == pytest.approx(0.74e-3)


def test_a_draft_cost_line_of_no_positive_cost_or_no_drafting_falls_back():
    cost = DraftCost(prior=1e-3, window=8, memory=20, min_samples=2)
    for seconds, passes in ((3e-3, 1), (3e-3, 1), (2e-3, 2), (2e-3, 2)):  # more passes, fewer seconds: noise
        cost.record(seconds, passes)
    assert cost.fixed == 0.0 and cost.per_pass == pytest.approx(2e-3)  # the median of seconds over passes
    for _ in range(21):  # no drafting step for `memory` steps: all forgotten
        cost.tick()
    assert cost.fixed == 0.0 and cost.per_pass == 1e-3
    cost.record(5e-3, 4)
    cost.record(5e-3, 4)
    assert cost.fixed == 0.0 and cost.per_pass == pytest.approx(1.25e-3)  # the old pass counts are gone


def test_catching_up_is_priced_per_token_beyond_the_passes():
    cost = DraftCost(prior=1e-3)
    assert cost.per_unseen_token == 0.0  # nothing seen: no entry costs
    cost.record(2e-3, 2)
    cost.record_catch_up(seconds=5e-3, passes=2, unseen=30)  # 3 ms beyond two passes of 1 ms
    assert cost.per_unseen_token == pytest.approx(1e-4) and cost.per_pass == pytest.approx(1e-3)


def test_a_sequence_that_must_catch_up_drafts_only_where_the_catch_up_pays():
    """Drafting now and then, a sequence pays its drafter's catch-up on the text it has not seen
    each time: an entry cost of the plan, so a marginal draft gives way to it while a caught-up
    sequence of the same batch still drafts, and a dear one keeps the sequence plain."""
    assert choose_ks([0.8, 0.8], [4, 4], GPU_LIKE, 1e-3).ks == (4, 4)
    assert choose_ks([0.8, 0.8], [4, 4], GPU_LIKE, 1e-3, entry=[0.0, 30e-3]).ks == (4, 0)
    assert choose_ks([0.8, 0.8], [4, 4], GPU_LIKE, 1e-3, entry=[30e-3, 30e-3]).ks == (0, 0)
    assert choose_ks([0.9, 0.5], [4, 4], GPU_LIKE, 1e-3, entry=[30e-3, 0.0]).ks == (0, 1)  # without the best one


@pytest.mark.parametrize("catch_up_per_token", [0.0, 10.0])
def test_the_engine_prices_catching_up_from_what_it_has_timed(tiny_target, monkeypatch, catch_up_per_token):
    """With catching up measured dear, a sequence whose drafter has read none of its text stays plain;
    measured free, it drafts (verify rows almost free here). The tokens are plain decoding's either way."""
    monkeypatch.setattr(DraftCost, "per_unseen_token", property(lambda cost: catch_up_per_token))
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)]))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(64, policy))
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    handle = engine.submit([5, 6, 7, 5, 6, 7, 5, 6], config)
    engine.run()
    assert (handle.stats.drafted == 0) == (catch_up_per_token > 0)
    assert handle.token_ids == plain(tiny_target, [5, 6, 7, 5, 6, 7, 5, 6], config).token_ids
