"""The auto policy's throughput guard: drafting stays allowed at a batch size only while it pays."""

import random
import statistics

import pytest

from specdec.batching import BatchConfig, BatchedEngine
from specdec.engine import GenerationConfig
from specdec.errors import InvalidRequestError
from specdec.guard import HeldLoad, ThroughputGuard
from specdec.models.slots import LoopSlots
from specdec.speculation import SpeculationPolicy, VerifyCostTable
from tests.test_batching import make_drafter, plain

WINDOW = 4


class Served:
    """What the simulated steps emitted, and in how many seconds."""
    tokens = 0
    seconds = 0.0


def run_windows(guard: ThroughputGuard, batch: int, windows: int, open_rate: float, closed_rate: float = 1.0,
                plain_step: float = 0.01, served: Served | None = None, noise: random.Random | None = None,
                sigma: float = 0.0, switch_steps: dict | None = None) -> list[str]:
    """Feed `windows` windows of steps whose realized tokens per second are open_rate (or closed_rate)
    times plain decoding's predicted rate, as the guard's mode asks; the mode of each window. With
    `noise`, each window's rate is off by a log-normal factor of spread sigma (load moving under it).
    switch_steps: by mode, the plain steps' seconds that the first step after a window of the other
    mode takes on top (a draft model catching up on the text of the plain steps before)."""
    modes, served = [], served or Served()
    for _ in range(windows):
        mode = "open" if guard.is_open(batch) else "closed"
        switch = (switch_steps or {}).get(mode, 0) * plain_step if modes and modes[-1] != mode else 0.0
        modes.append(mode)
        rate = (open_rate if mode == "open" else closed_rate) * (noise.lognormvariate(0, sigma) if noise else 1.0)
        tokens = 2 * batch if mode == "open" else batch  # drafting steps emit more tokens, and take longer
        scored = guard.summary
        while guard.summary is scored:  # until the window ends (the summary is replaced then)
            seconds = tokens / (rate * batch / plain_step) + switch
            switch = 0.0
            guard.record(batch, batch, tokens, seconds, plain_step)
            served.tokens += tokens
            served.seconds += seconds
    return modes


# The guard's mechanics (leading, exploring, switching) are tested with no margin, its scores compared
# as they are; the margin has tests of its own.

def test_it_tries_both_modes_then_closes_where_drafting_loses():
    guard = ThroughputGuard(window=WINDOW, margin=0.0)
    modes = run_windows(guard, 16, 80, open_rate=0.96)
    assert modes[:2] == ["open", "closed"]
    assert 2 <= modes[2:].count("open") <= 12  # explored, rarely
    assert modes[-10:].count("closed") >= 8
    summary = guard.summary[0]
    assert summary["batch"] == 16 and summary["open_score"] == pytest.approx(0.96)
    assert summary["closed_score"] == pytest.approx(1.0)


def test_it_stays_open_where_drafting_wins_and_explores_less_the_further_ahead():
    closed_windows = []
    for rate in (1.1, 1.35, 2.0):
        guard = ThroughputGuard(window=WINDOW, margin=0.0)
        modes = run_windows(guard, 1, 200, open_rate=rate)
        assert modes[2:].count("open") >= 170
        closed_windows.append(modes[2:].count("closed"))
    assert closed_windows == sorted(closed_windows, reverse=True) and closed_windows[0] > closed_windows[-1]


def test_modes_level_with_each_other_take_turns():
    modes = run_windows(ThroughputGuard(window=WINDOW, margin=0.0), 4, 40, open_rate=1.0)
    assert modes.count("open") == modes.count("closed") == 20


@pytest.mark.parametrize("open_rate", [0.5, 0.75, 0.96, 1.02, 1.1, 1.35, 2.0])
def test_exploring_the_trailing_mode_costs_about_its_budget_once_learnt(open_rate):
    """Throughput of 400 windows over the better mode's own: within 1 % at the default budget of 0.5 %
    (plus the windows' unscored first steps). With no margin, so that the better mode leads."""
    guard, served = ThroughputGuard(window=32, margin=0.0), Served()
    run_windows(guard, 16, 10, open_rate)  # learning
    run_windows(guard, 16, 400, open_rate, served=served)
    realized = served.tokens / served.seconds / (16 / 0.01)  # over plain's predicted rate, as scored
    assert 0.99 * max(open_rate, 1.0) < realized <= max(open_rate, 1.0) * (1 + 1e-9)


@pytest.mark.parametrize("open_rate", [0.94, 0.97, 1.06])
def test_noisy_windows_still_keep_throughput_near_the_better_mode(open_rate):
    """Windows 5 % apart by chance (log-normal) and modes 3-6 % apart: over 300 windows, for each of 10
    seeds, throughput within 2 % of the better mode's, within 1.2 % on average. Medians of 8 windows
    hold that; choosing by the latest window of each mode falls below it at 0.94 and 0.97. (No margin.)"""
    realized = []
    for seed in range(10):
        served = Served()
        run_windows(ThroughputGuard(window=32, margin=0.0), 16, 300, open_rate, served=served,
                    noise=random.Random(seed), sigma=0.05)
        realized.append(served.tokens / served.seconds / (16 / 0.01) / max(open_rate, 1.0))
    assert min(realized) > 0.98 and statistics.mean(realized) > 0.988


@pytest.mark.parametrize("open_rate", [0.97, 1.0, 1.03])
def test_dear_switches_are_explored_rarely_between_modes_that_score_alike(open_rate):
    """A switch into the open mode costs 8 plain steps more (draft models catching up on the plain
    steps' text), into the closed one 1 (a step not queued ahead). Between modes within 3 % of each
    other the switches are most of what exploring costs: counted in its budget, throughput over 400
    windows stays within 1 % of the better mode's, switching 6-30 times; uncounted, it switched 36-399
    times and lost 2.5 %, 10 % and 6 % at these rates. (No margin.)"""
    guard, served, switch_steps = ThroughputGuard(window=32, margin=0.0), Served(), {"open": 8, "closed": 1}
    run_windows(guard, 16, 10, open_rate, switch_steps=switch_steps)  # learning
    modes = run_windows(guard, 16, 400, open_rate, served=served, switch_steps=switch_steps)
    realized = served.tokens / served.seconds / (16 / 0.01)
    assert realized > 0.99 * max(open_rate, 1.0)
    assert sum(a != b for a, b in zip(modes, modes[1:])) <= 40


def test_a_change_of_load_is_seen_by_exploring():
    """Drafting lost, then starts to win (the acceptance rose): the explored open windows find it."""
    guard = ThroughputGuard(window=WINDOW, memory=4, margin=0.0)
    assert run_windows(guard, 4, 40, open_rate=0.9)[-10:].count("closed") >= 9
    modes = run_windows(guard, 4, 60, open_rate=1.3)
    assert modes[-10:].count("open") >= 9


@pytest.mark.parametrize("switch_steps", [{}, {"open": 8, "closed": 1}])
def test_an_exploration_that_beats_the_leader_runs_on(switch_steps):
    """Drafting lost by 10 % long enough for its median to rest on several windows (a burst's tail),
    then wins by half: the first exploration of the open mode runs on until its median leads. Going
    back to plain steps after each explored window, the bucket needed four explorations, 290 windows,
    to turn (at 1 in flight on the H200 such waits held a run at 1.05x plain where K = 4 read 1.54x).
    While drafting still loses, each exploration goes back at once."""
    guard = ThroughputGuard(window=32)
    learnt = run_windows(guard, 1, 600, open_rate=0.9, switch_steps=switch_steps)
    assert guard.summary[0]["open_windows"] >= 3 and learnt[-1] == "closed"
    assert all(b == "closed" for a, b in zip(learnt[2:], learnt[3:]) if a == "open")
    modes = run_windows(guard, 1, 300, open_rate=1.5, switch_steps=switch_steps)
    turned = modes[modes.index("open"):]
    assert len(turned) > 200 and turned.count("open") >= 0.95 * len(turned)


@pytest.mark.parametrize("open_rate, drafts", [(1.0, False), (1.03, False), (1.08, True)])
def test_drafting_runs_only_where_its_windows_beat_plain_by_the_margin(open_rate, drafts):
    """Open windows score without the switches and prefill steps around them: a tie, or a lead
    within the margin (5 %), goes to plain steps. (Switching into drafting costs 8 plain steps.)"""
    modes = run_windows(ThroughputGuard(window=WINDOW, margin=0.05), 16, 60, open_rate=open_rate,
                        switch_steps={"open": 8, "closed": 1})
    assert (modes[-10:].count("open") >= 8) if drafts else (modes[-10:].count("closed") >= 8)


def test_at_a_tie_with_cheap_switches_drafting_is_explored_as_a_loss_of_the_margin():
    """Switches that cost nothing (a lookup drafter) and windows that score alike: with no margin the
    modes take turns; with one, the open mode is explored as a mode that trails by the margin."""
    modes = run_windows(ThroughputGuard(window=WINDOW, margin=0.05), 16, 200, open_rate=1.0)
    assert modes[2:].count("open") <= 20


def test_a_drafting_leader_whose_lead_shrinks_into_the_margin_hands_over_to_plain():
    """Drafting led by 40 %, then by 2 %: within the margin, and plain's lead past it (3 %) held
    for 8 windows pays for the switch into plain steps (a step not queued ahead)."""
    guard = ThroughputGuard(window=32, margin=0.05)
    switches = {"open": 8, "closed": 1}
    assert run_windows(guard, 16, 30, open_rate=1.4, switch_steps=switches)[-10:].count("open") >= 9
    assert run_windows(guard, 16, 60, open_rate=1.02, switch_steps=switches)[-10:].count("closed") >= 8


def test_buckets_decide_apart_and_a_batch_one_smaller_stays_in_its_bucket():
    assert [ThroughputGuard.bucket_of(n) for n in (1, 2, 3, 4, 5, 6, 12, 15, 16, 22, 23, 31, 32)] == \
        [1, 2, 4, 4, 4, 8, 16, 16, 16, 16, 32, 32, 32]
    guard = ThroughputGuard(window=WINDOW)
    run_windows(guard, 1, 12, open_rate=1.4)
    run_windows(guard, 16, 12, open_rate=0.9)
    assert guard.is_open(1) and not guard.is_open(16) and not guard.is_open(15)
    assert [row["batch"] for row in guard.summary] == [1, 16]


def test_a_windows_first_step_and_steps_with_no_sequences_or_no_time_are_not_scored():
    guard = ThroughputGuard(window=2)
    guard.record(0, 0, 0, 0.01, 0.01)
    guard.record(3, 3, 3, 0.0, 0.01)
    assert guard.summary == ()
    guard.record(4, 4, 400, 0.01, 0.01)  # the open window's first step: a switch's cost, unscored
    guard.record(4, 4, 8, 0.01, 0.01)
    guard.record(4, 4, 8, 0.01, 0.01)
    assert guard.summary[0]["open_score"] == pytest.approx(2.0) and not guard.is_open(4)
    guard.record(4, 4, 4, 0.1, 0.01)  # the closed window (1 step): its first step unscored, then one
    guard.record(4, 4, 4, 0.02, 0.01)
    assert guard.summary[0]["closed_score"] == pytest.approx(0.5) and guard.is_open(4)
    with pytest.raises(ValueError, match="window"):
        ThroughputGuard(window=0)
    with pytest.raises(ValueError, match="budget"):
        ThroughputGuard(budget=0)
    with pytest.raises(ValueError, match="margin"):
        ThroughputGuard(margin=-0.1)
    with pytest.raises(InvalidRequestError, match="guard_window"):
        SpeculationPolicy.auto(guard_window=-1)
    with pytest.raises(InvalidRequestError, match="load_hold"):
        SpeculationPolicy.auto(load_hold=0)


def test_the_held_load_keeps_a_dip_between_requests_and_sees_a_drop_or_a_pause():
    held, now = HeldLoad(span=4), 0.0

    def step(load: int, idle: float = 0.0, empties: bool = False) -> int:
        nonlocal now
        now += idle
        value = held.start(load, now)
        now += 0.01  # each step takes 10 ms
        held.end(now, empty=empties)
        return value

    assert [step(n) for n in (1, 16, 16, 3, 2, 16)] == [1, 16, 16, 16, 16, 16]  # a dip of two steps
    assert [step(2) for _ in range(5)] == [16, 16, 16, 2, 2]  # a drop: seen after 4 steps
    assert step(16) == 16 and step(3, idle=0.05) == 16  # 5 steps' time with sequences in: no pause
    assert step(16, empties=True) == 16 and step(1, idle=0.005) == 16  # empty for half a step: held
    step(1, empties=True)
    assert step(1, idle=0.05) == 1  # empty for 5 steps' time: the load before the pause is gone
    with pytest.raises(ValueError, match="span"):
        HeldLoad(span=0)


# ---- in the engine ---------------------------------------------------------------------------------

CHEAP_ROWS = VerifyCostTable.from_rows([(1, 1.0), (2, 1.01), (5, 1.02)])  # verify rows almost free: it drafts


def engine_with(tiny_target, guard_window: int, slots: int = 2, prefill_chunk: int = 64) -> BatchedEngine:
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=CHEAP_ROWS, guard_window=guard_window)
    return BatchedEngine(LoopSlots(tiny_target.with_own_cache, slots), lambda: make_drafter("lookup", None, None),
                         config=BatchConfig(prefill_chunk, policy))


PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 9, 10, 9, 10]]
CONFIG = GenerationConfig(max_new_tokens=40, ignore_eos=True)
# A short prompt and a long one: in chunks of 2 tokens, the long one prefills while the short one decodes.
FILLING = [PROMPTS[0][:3], [9, 10, 11] * 6]


def stepped(engine: BatchedEngine) -> list:
    """Run the engine to the end; its decision at every step."""
    decisions = []
    while engine.step():
        decisions.append(engine.last_decision)
    return decisions + [engine.last_decision]


def test_a_closed_guard_holds_its_batch_size_to_plain_steps_and_the_answers_stay(tiny_target):
    engine = engine_with(tiny_target, guard_window=64)
    run_windows(engine.guard, 2, 2, open_rate=0.5)  # drafting was seen to lose at 2 in flight
    handles = [engine.submit(p, CONFIG) for p in PROMPTS]
    decisions = stepped(engine)
    assert all(d.drafting == "closed" and not any(d.ks) for d in decisions if len(d.ks) == 2)
    assert all(h.stats.drafted == 0 for h in handles)
    assert [h.token_ids for h in handles] == [plain(tiny_target, p, CONFIG).token_ids for p in PROMPTS]


def test_the_engine_scores_its_decoding_steps_and_switches_without_changing_answers(tiny_target):
    engine = engine_with(tiny_target, guard_window=3)
    handles = [engine.submit(p, CONFIG) for p in PROMPTS]
    decisions = stepped(engine)
    assert [h.token_ids for h in handles] == [plain(tiny_target, p, CONFIG).token_ids for p in PROMPTS]
    row = next(r for r in engine.guard.summary if r["batch"] == 2)
    assert row["open_windows"] >= 1 and row["closed_windows"] >= 1
    assert row["open_score"] > 0 and row["closed_score"] > 0
    at_two = [d for d in decisions if len(d.ks) == 2]
    assert {d.drafting for d in at_two} == {"open", "closed"}
    assert any(any(d.ks) for d in at_two if d.drafting == "open")
    assert not any(any(d.ks) for d in at_two if d.drafting == "closed")


def test_no_guard_leaves_the_plans_to_the_model(tiny_target):
    engine = engine_with(tiny_target, guard_window=0)
    [engine.submit(p, CONFIG) for p in PROMPTS]
    decisions = stepped(engine)
    assert engine.guard is None and all(d.drafting is None for d in decisions)


def test_a_batch_still_filling_is_judged_at_its_load_not_at_its_few_decoding_sequences(tiny_target):
    """While newcomers prefill, the sequences already decoding are a step of the load they share it
    with: drafting for them would hold the newcomers' prefill up. Drafting pays alone here (load 1)
    and loses at load 2, so a sequence decoding beside one still prefilling decodes plainly."""
    engine = engine_with(tiny_target, guard_window=64, prefill_chunk=2)
    run_windows(engine.guard, 1, 2, open_rate=2.0)
    run_windows(engine.guard, 2, 2, open_rate=0.5)
    handles = [engine.submit(p, CONFIG) for p in FILLING]
    decisions = stepped(engine)
    filling = [d for d in decisions if d.batch_size == 2 and len(d.ks) == 1]  # the long one still prefilling
    assert len(filling) >= 4 and all(d.drafting == "closed" and d.ks == (0,) for d in filling)
    assert [h.token_ids for h in handles] == [plain(tiny_target, p, CONFIG).token_ids for p in FILLING]


@pytest.mark.parametrize("hold", [1, 6])
def test_a_sequence_left_alone_drafts_only_once_the_held_load_has_dropped(tiny_target, hold):
    """Drafting loses at 4 in flight and pays alone. Three of four sequences end together: the one
    left is held at the load of 4 for `hold` steps (a dip between requests would end by then), plain,
    then drafts; with no hold it drafts at once. Its answer is plain decoding's either way."""
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=CHEAP_ROWS, guard_window=64, load_hold=hold)
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), lambda: make_drafter("lookup", None, None),
                           config=BatchConfig(64, policy))
    run_windows(engine.guard, 1, 2, open_rate=2.0)
    run_windows(engine.guard, 4, 2, open_rate=0.5)
    short = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    handles = [engine.submit(p, short) for p in ([9, 10, 9, 10], [11, 12, 11], [13, 14, 13])]
    handles.append(engine.submit(PROMPTS[0], CONFIG))
    decisions = stepped(engine)
    alone = [d for d in decisions if d.batch_size == 1]
    assert all(d.drafting == "closed" and d.ks == (0,) for d in alone[:hold - 1])
    assert alone[hold - 1].drafting == "open" and any(any(d.ks) for d in alone[hold - 1:])
    assert all(not any(d.ks) for d in decisions if d.batch_size == 4)
    assert [h.token_ids for h in handles[3:]] == [plain(tiny_target, PROMPTS[0], CONFIG).token_ids]


def test_steps_with_prefill_chunks_are_not_scored(tiny_target, monkeypatch):
    """The guard scores decoding steps only: a pass that carries a prefill chunk is priced by the
    table's extrapolation, which would weigh in a window's score by how many such steps it holds."""
    recorded = []
    record = ThroughputGuard.record
    monkeypatch.setattr(ThroughputGuard, "record", lambda guard, *step: recorded.append(step) or record(guard, *step))
    engine = engine_with(tiny_target, guard_window=2, prefill_chunk=2)
    handles = [engine.submit(p, CONFIG) for p in FILLING]
    decisions = stepped(engine)
    decoding_only = [d for d in decisions if d.ks and len(d.ks) == d.batch_size]
    assert any(len(d.ks) < d.batch_size for d in decisions if d.ks)  # one decoded beside a prefill
    assert len(recorded) == len(decoding_only) > 0
    assert [h.token_ids for h in handles] == [plain(tiny_target, p, CONFIG).token_ids for p in FILLING]


def test_modes_that_score_alike_under_noise_do_not_change_leader_with_the_noise():
    """Level modes, windows 5 % apart by chance, and a switch into drafting that costs a whole
    window (draft models catching up): a leader changes only where its lead pays for the switch.
    Over 300 windows and 6 seeds it switched 7.8 times and kept 99.2 % of plain's throughput on
    average; changing leader with every sign of the lead, 14.2 times and 98.3 %."""
    realized, switches = [], []
    for seed in range(6):
        guard, served, dear = ThroughputGuard(window=32, margin=0.0), Served(), {"open": 32, "closed": 1}
        run_windows(guard, 16, 10, 1.0, switch_steps=dear, noise=random.Random(100 + seed), sigma=0.05)
        modes = run_windows(guard, 16, 300, 1.0, served=served, switch_steps=dear, noise=random.Random(seed),
                            sigma=0.05)
        realized.append(served.tokens / served.seconds / (16 / 0.01))
        switches.append(sum(a != b for a, b in zip(modes, modes[1:])))
    assert statistics.mean(realized) > 0.988 and statistics.mean(switches) < 12
