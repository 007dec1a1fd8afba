"""The speculation controller boundary (specdec.engine.controller) and auto's bandit (specdec.engine.auto), and the
batched engine under them: a controller changes how many drafts are verified, never the output."""

import itertools
from dataclasses import dataclass

import pytest
import torch

from specdec.engine.auto import EXPLORE_COST, WINDOW, AutoController, bucket_of
from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.engine.controller import (Auto, FixedK, Plan, RequestK, SequenceView, StepRecord, StepTrace,
                                speculation_from_flag)
from specdec.drafters import ModelDrafter
from specdec.engine import GenerationConfig, Origin
from specdec.errors import InvalidRequestError
from specdec.models.slots import LoopSlots
from specdec.sampling import SamplingParams
from tests.markov import MarkovLM
from tests.test_batching import make_drafter, mixed_requests, plain, run_arriving
from tests.test_exactness import HOT, PROMPT, V, exact_joint, goodness_of_fit


def view(request_id=0, k=4, room=100, drafts=True, seeded_sample=False) -> SequenceView:
    return SequenceView(request_id, k, room, drafts, seeded_sample)


def record(controller: AutoController, load: int, tokens: int, seconds: float, prefill_rows: int = 0,
           views=None) -> StepTrace:
    """A step planned by controller now, as its trace comes back."""
    views = tuple(views or (view(),))
    plan = controller.plan(views, load)
    return StepTrace(plan, StepRecord(load, views, plan.budgets, (0,) * len(views), tokens, prefill_rows, 0.0,
                                      seconds))


def serve(controller: AutoController, load: int, steps: int, rate_of_cap) -> list[int]:
    """Run `steps` steps at one load where a step at cap c delivers rate_of_cap(c) tokens a second;
    the cap in force at each step."""
    caps = []
    for _ in range(steps):
        cap = controller.arm_at(load)
        caps.append(cap)
        controller.record(record(controller, load, 10, 10 / rate_of_cap(cap)))
    return caps


# ---- the three controllers' plans ----------------------------------------------------------------


def test_every_controller_caps_a_budget_by_room_and_gives_none_to_a_drafter_that_drafts_nothing():
    seqs = (view(0, k=2), view(1, k=6, room=3), view(2, k=5, drafts=False))
    assert RequestK().plan(seqs, 3).budgets == (2, 3, 0)
    assert FixedK(4).plan(seqs, 3).budgets == (4, 3, 0)
    assert AutoController(4).plan(seqs, 1).budgets == (4, 3, 0)  # a new bucket at load 1: the largest cap
    assert AutoController(4).plan(seqs, 3).budgets == (0, 0, 0)  # above load 1: plain steps first


def test_auto_never_drafts_for_a_seeded_sample():
    seqs = (view(0), view(1, seeded_sample=True))
    controller = AutoController(4)
    serve(controller, 2, 10 * WINDOW, {0: 100.0, 2: 120.0, 4: 150.0}.get)
    assert controller.arm_at(2) == 4 and controller.plan(seqs, 2).budgets == (4, 0)
    assert FixedK(4).plan(seqs, 2).budgets == (4, 4)  # a fixed K does not depend on the batch


def test_a_trees_node_budget_is_not_cut_to_its_room():
    chain = SequenceView(0, 16, room=3, drafts=True, seeded_sample=False)
    tree = SequenceView(0, 16, room=3, drafts=True, seeded_sample=False, tree=True)
    assert chain.capped(16) == 3 and tree.capped(16) == 16
    assert SequenceView(0, 16, room=0, drafts=True, seeded_sample=False, tree=True).capped(16) == 0


def test_auto_caps_are_zero_about_half_and_k():
    assert AutoController(4).arms == (0, 2, 4)
    assert AutoController(1).arms == (0, 1)
    assert AutoController(7).arms == (0, 3, 7)
    assert AutoController(16).arms == (0, 4, 8, 16)  # a tree's node budget: its smallest cap near a chain
    assert AutoController(64).arms == (0, 16, 32, 64)


def test_the_speculation_flag_resolves_to_a_controller_option():
    assert speculation_from_flag("request", 4) == RequestK(4)
    assert speculation_from_flag("auto", 6) == Auto(6)
    assert speculation_from_flag("2", 6) == FixedK(2)
    for bad in ("0", "x", "-1"):
        with pytest.raises(InvalidRequestError, match="auto, request or a whole number"):
            speculation_from_flag(bad, 6)
    with pytest.raises(InvalidRequestError):
        Auto(0)


# ---- auto's bandit -------------------------------------------------------------------------------


def test_load_buckets_are_the_next_power_of_two():
    assert [bucket_of(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 32)] == [1, 1, 2, 4, 4, 8, 8, 16, 16, 16, 32, 32]


@pytest.mark.parametrize("best", [0, 2, 4])
@pytest.mark.parametrize("lead", [1.05, 1.3, 2.0])
def test_auto_finds_the_cap_that_serves_most_and_exploring_costs_little(best, lead):
    rates = {0: 100.0, 2: 100.0, 4: 100.0}
    rates[best] = 100.0 * lead
    controller = AutoController(4)
    caps = serve(controller, 1, 400 * WINDOW, rates.get)
    settled = caps[40 * WINDOW:]
    assert controller.summary()["buckets"][0]["leader"] == best
    served = sum(rates[c] for c in settled) / len(settled)
    # Each of the two trailing arms may cost about EXPLORE_COST (with a switch step back each time).
    assert 1 - 2.5 * EXPLORE_COST <= served / rates[best] < 1


def test_above_load_one_the_walk_goes_up_from_plain_and_stops_at_the_first_arm_that_does_not_lead():
    controller = AutoController(16)  # caps 0, 4, 8, 16
    caps = serve(controller, 8, 60 * WINDOW, {0: 100.0, 4: 120.0, 8: 110.0, 16: 50.0}.get)
    assert caps[:WINDOW] == [0] * WINDOW
    assert 16 not in caps and controller.summary()["buckets"][0]["leader"] == 4
    rising = AutoController(16)
    serve(rising, 8, 60 * WINDOW, {0: 100.0, 4: 120.0, 8: 130.0, 16: 140.0}.get)
    assert rising.summary()["buckets"][0]["leader"] == 16


def test_at_load_one_the_walk_goes_down_from_the_largest_cap():
    controller = AutoController(16)
    caps = serve(controller, 1, 60 * WINDOW, {0: 50.0, 4: 120.0, 8: 130.0, 16: 140.0}.get)
    assert caps[:WINDOW] == [16] * WINDOW
    assert set(caps) == {8, 16} and controller.summary()["buckets"][0]["leader"] == 16


def test_a_short_burst_at_a_load_where_drafting_loses_is_served_near_plain():
    """The old walk (largest cap first) served this burst at 0.57 of plain; the walk up from plain
    pays one window of its smallest cap."""
    rates = {0: 100.0, 4: 90.0, 8: 70.0, 16: 40.0}
    caps = serve(AutoController(16), 8, 4 * WINDOW, rates.get)
    tokens_per_second = len(caps) / sum(1 / rates[c] for c in caps)
    assert set(caps) == {0, 4} and tokens_per_second >= 0.97 * rates[0]


def test_a_walk_stopped_early_goes_on_once_its_end_leads():
    controller = AutoController(16)
    serve(controller, 8, 20 * WINDOW, {0: 100.0, 4: 120.0, 8: 110.0, 16: 200.0}.get)
    assert controller.summary()["buckets"][0]["scores"]["16"] is None
    serve(controller, 8, 200 * WINDOW, {0: 100.0, 4: 120.0, 8: 150.0, 16: 200.0}.get)
    assert controller.summary()["buckets"][0]["leader"] == 16


def test_auto_turns_when_what_pays_changes():
    controller = AutoController(4)
    serve(controller, 1, 100 * WINDOW, {0: 100.0, 2: 110.0, 4: 150.0}.get)
    assert controller.arm_at(1) == 4
    caps = serve(controller, 1, 400 * WINDOW, {0: 100.0, 2: 80.0, 4: 60.0}.get)
    # Settled on plain steps; re-measuring the trailing arms (losses 0.2 and 0.4) takes about
    # 1 / 20 + 1 / 40 of the windows.
    assert controller.summary()["buckets"][0]["leader"] == 0
    assert caps[-50 * WINDOW:].count(0) > 0.85 * 50 * WINDOW


def test_each_load_bucket_learns_on_its_own():
    controller = AutoController(4)
    serve(controller, 1, 60 * WINDOW, {0: 100.0, 2: 120.0, 4: 150.0}.get)
    serve(controller, 16, 60 * WINDOW, {0: 100.0, 2: 90.0, 4: 70.0}.get)
    leaders = {b["load"]: b["leader"] for b in controller.summary()["buckets"]}
    assert leaders == {1: 4, 16: 0}
    assert controller.arm_at(13) == controller.arm_at(16)  # a batch that shrinks stays in its bucket


def test_steps_with_prefill_or_where_none_may_draft_teach_auto_nothing():
    controller = AutoController(4)
    for _ in range(5 * WINDOW):
        controller.record(record(controller, 1, 10, 1.0, prefill_rows=7))
        controller.record(record(controller, 1, 10, 1.0, views=[view(drafts=False), view(seeded_sample=True)]))
    assert controller.summary()["buckets"] == []


def test_steps_planned_before_a_switch_and_the_first_after_it_are_not_counted():
    controller = AutoController(2)  # caps 0, 1, 2: at load 1 the largest first
    serve(controller, 1, WINDOW - 1, lambda cap: 100.0)
    ahead = record(controller, 1, 10, 100.0)  # planned under cap 2, queued ahead of the window's end
    serve(controller, 1, 1, lambda cap: 100.0)
    assert controller.arm_at(1) == 1
    controller.record(ahead)
    controller.record(record(controller, 1, 10, 100.0))  # the switch's step: a catch-up's cost, say
    serve(controller, 1, WINDOW, lambda cap: 100.0)
    assert controller.summary()["buckets"][0]["scores"]["1"] == pytest.approx(100.0)


def test_planning_does_not_change_the_controller():
    controller = AutoController(4)
    serve(controller, 2, 3 * WINDOW, {0: 100.0, 2: 120.0, 4: 150.0}.get)
    before = controller.summary()
    for _ in range(100):
        controller.plan((view(),), 2)
    assert controller.summary() == before


# ---- the engine under a controller ---------------------------------------------------------------


@dataclass(frozen=True)
class Scripted:
    """A test option whose controller gives every sequence budgets[step % len(budgets)], recording
    each step it is told of."""

    budgets: tuple[int, ...]

    def controller(self):
        return ScriptedController(self.budgets)


class ScriptedController:
    name, k = "scripted", 4

    def __init__(self, budgets):
        self.budgets, self.records = budgets, []

    def plan(self, sequences, load):
        budget = self.budgets[len(self.records) % len(self.budgets)]
        return Plan(tuple(s.capped(budget) for s in sequences), f"step {len(self.records)}")

    def record(self, trace):
        self.records.append(trace.record)

    def summary(self):
        return {"steps": len(self.records)}


def test_greedy_output_under_changing_budgets_equals_plain_decoding(tiny_target, tiny_draft):
    """Mixed drafters and arrivals; budgets 0, 3, 1, 6 in turn, step by step."""
    requests = mixed_requests(16, seed=3)
    traces = []
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), None,
                           config=BatchConfig(8, Scripted((0, 3, 1, 6))), on_step=traces.append)
    drafters = [make_drafter(kind, tiny_target, tiny_draft) for _, _, kind, _ in requests]
    handles = run_arriving(engine, requests, drafters)
    for (prompt, config, kind, _), handle in zip(requests, handles):
        assert handle.token_ids == plain(tiny_target, prompt, config).token_ids, (kind, prompt, config)
    assert traces and traces[-1] is engine.last_step
    assert len(engine.controller.records) == len(traces)
    for trace in traces:
        rec = trace.record
        assert len(rec.sequences) == len(rec.drafted) == len(rec.accepted) == len(trace.plan.budgets) <= 4
        assert all(a <= d <= b for a, d, b in zip(rec.accepted, rec.drafted, trace.plan.budgets))
    budgets = [b for t in traces for b in t.plan.budgets]
    assert 0 in budgets and max(budgets) > 1


def test_the_hook_sees_every_token_once(tiny_target):
    traces: list[StepTrace] = []
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 3), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(speculation=FixedK(3)), on_step=traces.append)
    handles = [engine.submit([5, 6, 5, 6, 5, 6][: 2 + i], GenerationConfig(max_new_tokens=12)) for i in range(3)]
    engine.run()
    assert sum(t.record.emitted for t in traces) == sum(len(h.token_ids) for h in handles)
    assert sum(sum(t.record.accepted) for t in traces) == sum(h.stats.accepted for h in handles)
    assert all(t.plan.reason == "fixed K = 3" for t in traces)


def test_fixed_k_overrides_each_request_k(tiny_target):
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(speculation=FixedK(3)))
    engine.submit([5, 6, 5, 6, 5, 6], GenerationConfig(max_new_tokens=10, k=1))
    engine.step()  # the prefill
    engine.step()
    assert engine.last_step.plan.budgets == (3,)


def test_auto_keeps_a_seeded_sample_its_seeds_whatever_the_batch(tiny_target):
    """Auto drafts for greedy and unseeded sequences but not for a seeded sampled one: its sample is
    plain decoding's with that seed, alone or beside others (rule 6)."""
    seeded = GenerationConfig(max_new_tokens=16, ignore_eos=True, sampling=SamplingParams(1.0, seed=11))
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]

    def run(companions: int):
        engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), lambda: make_drafter("lookup", None, None),
                               config=BatchConfig(64, Auto(4)))
        for load in (1, 4):  # auto has learnt that drafting pays at both loads
            serve(engine.controller, load, 10 * WINDOW, {0: 100.0, 2: 120.0, 4: 150.0}.get)
        others = [engine.submit([9, 10, 9, 10, 9, 10], GenerationConfig(max_new_tokens=16, ignore_eos=True))
                  for _ in range(companions)]
        handle = engine.submit(prompt, seeded)
        engine.run()
        return handle, others

    alone, _ = run(0)
    beside, others = run(3)
    assert alone.token_ids == beside.token_ids == plain(tiny_target, prompt, seeded).token_ids
    assert alone.stats.drafted == beside.stats.drafted == 0 and all(o.stats.drafted > 0 for o in others)


def test_sampled_output_under_changing_budgets_follows_target_distribution(monkeypatch):
    """1500 unseeded 2-token answers in 8 slots with a Markov draft, budgets 0, 1, 2 in turn. Their
    "fresh entropy" is a counter here, so the test is repeatable."""
    entropy = itertools.count(1000)
    monkeypatch.setattr(SamplingParams, "make_generator",
                        lambda self, device="cpu": torch.Generator(device=device).manual_seed(next(entropy)))
    engine = BatchedEngine(LoopSlots(lambda: MarkovLM(V, seed=0), 8), lambda: ModelDrafter(MarkovLM(V, seed=1), V),
                           config=BatchConfig(speculation=Scripted((0, 1, 2))))
    handles = [engine.submit(PROMPT, GenerationConfig(max_new_tokens=2, sampling=SamplingParams(1.0)))
               for _ in range(1500)]
    engine.run()
    counts, origins = {}, set()
    for handle in handles:
        counts[tuple(handle.token_ids)] = counts.get(tuple(handle.token_ids), 0) + 1
        origins |= {t.origin for t in handle}
    assert goodness_of_fit(counts, exact_joint(MarkovLM(V, seed=0), HOT, n_tokens=2)) > 1e-3
    assert Origin.ACCEPTED in origins


def test_auto_in_the_engine_is_exact_and_learns_by_load(tiny_target):
    """Auto over a real engine: greedy tokens equal plain decoding's, and its bucket at the load it
    ran has scored caps."""
    prompts = [[7, 8, 7, 8, 7, 8][: 2 + i] for i in range(4)]
    config = GenerationConfig(max_new_tokens=160, ignore_eos=True)
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(speculation=Auto(4)))
    results = engine.generate(prompts, config)
    for prompt, result in zip(prompts, results):
        assert list(result.token_ids) == list(plain(tiny_target, prompt, config).token_ids)
    buckets = engine.controller.summary()["buckets"]
    assert buckets and any(s is not None for b in buckets for s in b["scores"].values())
