"""Pipelined plain steps (BatchConfig.pipeline, on by default for CUDA, forced on here on the CPU):
while every running sequence decodes plainly, the engine queues each step before reading the one
before. The tokens are those of one step at a time (greedy and sampled: the same draws from each
sequence's own generator in the same order); a sequence that stops at a token the next step was
already fed with leaves with its slot released; newcomers join as soon as the batch is read."""

import pytest
import torch

from specdec.batch_rule import StepRule
from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.drafters import LookupDrafter, NoDrafter
from specdec.engine import GenerationConfig
from specdec.models.native_slots import NativeSlots
from specdec.models.slots import LoopSlots
from specdec.sampling import SamplingParams

CPU = torch.device("cpu")
DECODE = lambda ids: " ".join(f"t{i}" for i in ids)  # noqa: E731  (a tokenizer's decode, for stop strings)
PROMPTS = [[7, 11, 13, 17, 19], [1, 2, 3, 4, 5, 1, 2, 3], [9], [40, 41, 42, 40, 41], [30, 31, 32]]
SAMPLINGS = [SamplingParams(), SamplingParams(temperature=1.0, seed=3),
             SamplingParams(temperature=0.8, top_k=8, top_p=0.9, seed=11)]


def engine(target, pipeline: bool, max_slots: int = 5, eos=(), slots=None) -> BatchedEngine:
    slots = slots or LoopSlots(target.with_own_cache, max_slots)
    return BatchedEngine(slots, lambda: NoDrafter(CPU), eos_token_ids=eos, decode=DECODE,
                         config=BatchConfig(prefill_chunk=4, pipeline=pipeline))


def configs(sampling: SamplingParams, stop: tuple[str, ...] = ()) -> list[GenerationConfig]:
    """Mixed lengths, so that sequences stop by length mid-batch; each its own seed."""
    return [GenerationConfig(max_new_tokens=n, stop=stop, sampling=SamplingParams(
        sampling.temperature, sampling.top_k, sampling.top_p, seed=None if sampling.seed is None else sampling.seed + i))
        for i, n in enumerate([20, 7, 13, 1, 16])]


def run_all(eng: BatchedEngine, prompts, cfgs) -> list[tuple[list[int], str | None]]:
    handles = [eng.submit(p, c) for p, c in zip(prompts, cfgs)]
    eng.run()
    return [(h.token_ids, h.finish_reason) for h in handles]


def record_order(eng: BatchedEngine, monkeypatch) -> list[str]:
    """Records each forward of the engine's target ("prefill" when it holds a prefill chunk) and each
    read of a step, in order."""
    events = []
    forward, read = eng.target.forward_ragged, StepRule.read

    def forwarded(slots, tokens, **kw):
        events.append("forward" if all(kw["logits"]) else "prefill")
        return forward(slots, tokens, **kw)

    def recorded(self):
        events.append("read")
        return read(self)

    monkeypatch.setattr(eng.target, "forward_ragged", forwarded)
    monkeypatch.setattr(StepRule, "read", recorded)
    return events


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "t1", "warped"])
def test_pipelined_steps_give_the_tokens_of_single_steps(tiny_target, sampling, monkeypatch):
    want = run_all(engine(tiny_target, pipeline=False), PROMPTS, configs(sampling))
    pipelined = engine(tiny_target, pipeline=True)
    events = record_order(pipelined, monkeypatch)
    assert run_all(pipelined, PROMPTS, configs(sampling)) == want
    assert "forward forward read" in " ".join(events)  # a step was queued before the one before it was read
    assert sorted(pipelined._free) == list(range(5)) and not pipelined.busy


def test_pipelining_is_off_by_default_on_the_cpu(tiny_target, monkeypatch):
    default = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: NoDrafter(CPU))
    events = record_order(default, monkeypatch)
    run_all(default, PROMPTS[:2], configs(SAMPLINGS[0])[:2])
    assert "forward forward" not in " ".join(events)


@pytest.mark.parametrize("sampling", SAMPLINGS[:2], ids=["greedy", "t1"])
def test_end_of_sequence_and_stop_strings_mid_batch_end_each_as_one_step_at_a_time(tiny_target, sampling):
    free = run_all(engine(tiny_target, pipeline=False), PROMPTS, configs(sampling))
    eos = free[0][0][5]  # the first sequence's sixth token ends every sequence that meets it
    stop = (f"t{free[4][0][3]}",)
    want = run_all(engine(tiny_target, pipeline=False, eos=[eos]), PROMPTS, configs(sampling, stop))
    pipelined = engine(tiny_target, pipeline=True, eos=[eos])
    assert run_all(pipelined, PROMPTS, configs(sampling, stop)) == want
    assert {reason for _, reason in want} == {"stop", "length"}
    assert sorted(pipelined._free) == list(range(5))
    assert all(pipelined.target.cache_len(s) == 0 for s in range(5))  # every extra row went with its slot


def test_a_sequence_arriving_while_others_pipeline_joins_and_stays_exact(tiny_target, monkeypatch):
    config = GenerationConfig(max_new_tokens=18, k=3)
    late = [([5, 6, 7, 8, 9, 10, 11], NoDrafter(CPU)), ([3, 4, 3, 4, 3, 4], LookupDrafter(CPU)), ([12], NoDrafter(CPU))]
    want = {}
    for prompt, _ in late + [(p, None) for p in PROMPTS[:2]]:
        want[tuple(prompt)] = run_all(engine(tiny_target, pipeline=False, max_slots=1), [prompt], [config])[0]
    pipelined = engine(tiny_target, pipeline=True, max_slots=4)
    events = record_order(pipelined, monkeypatch)
    first = [pipelined.submit(p, config) for p in PROMPTS[:2]]
    for _ in range(6):
        pipelined.step()
    assert "forward forward read" in " ".join(events)
    joined = []
    for prompt, drafter in late:  # one every other step, the second with a drafter that drafts
        joined.append(pipelined.submit(prompt, config, drafter=drafter))
        pipelined.step()
        pipelined.step()
    pipelined.run()
    for prompt, handle in zip(PROMPTS[:2] + [p for p, _ in late], first + joined):
        assert (handle.token_ids, handle.finish_reason) == want[tuple(prompt)]
    assert joined[1].stats.drafted > 0


def test_a_sequence_cancelled_while_a_step_is_queued_frees_its_slot(tiny_target):
    config = GenerationConfig(max_new_tokens=15)
    want = run_all(engine(tiny_target, pipeline=False), PROMPTS[:2], [config] * 2)[0]
    pipelined = engine(tiny_target, pipeline=True, max_slots=2)
    kept, cancelled = pipelined.submit(PROMPTS[0], config), pipelined.submit(PROMPTS[1], config)
    for _ in range(5):
        pipelined.step()
    assert pipelined._ahead is not None
    cancelled.cancel()
    waiting = pipelined.submit(PROMPTS[2], GenerationConfig(max_new_tokens=4))
    pipelined.run()
    assert (kept.token_ids, kept.finish_reason) == want and cancelled.finish_reason is None
    assert waiting.finish_reason == "length" and sorted(pipelined._free) == [0, 1]


def test_pipelined_steps_over_native_slots_equal_single_steps(tiny_target):
    def native():
        return NativeSlots.from_hf(tiny_target.model, "tiny slots", 3, 128)

    cfgs = configs(SAMPLINGS[1])[:3]
    want = run_all(engine(tiny_target, pipeline=False, slots=native()), PROMPTS[:3], cfgs)
    assert run_all(engine(tiny_target, pipeline=True, slots=native()), PROMPTS[:3], cfgs) == want


def test_a_pipelined_step_reads_the_device_once(tiny_target, count_reads):
    pipelined = engine(tiny_target, pipeline=True, max_slots=2)
    handles = [pipelined.submit([5], GenerationConfig(max_new_tokens=12)) for _ in range(2)]
    before = count_reads()
    steps = 0
    while pipelined.step():
        steps += 1
    assert count_reads() - before == steps + 1 and all(len(h.token_ids) == 12 for h in handles)


def test_no_step_is_queued_past_a_last_token_by_length(tiny_target, monkeypatch):
    pipelined = engine(tiny_target, pipeline=True, max_slots=1)
    events = record_order(pipelined, monkeypatch)
    alone = pipelined.submit(PROMPTS[0], GenerationConfig(max_new_tokens=6))
    pipelined.run()
    assert len(alone.token_ids) == 6 and events.count("forward") == 6


@pytest.mark.parametrize("budget, pipelined_expected", [(0, True), (4, False)], ids=["plain-by-controller", "drafting"])
def test_steps_the_controller_keeps_plain_are_pipelined_too(tiny_target, monkeypatch, budget, pipelined_expected):
    """Sequences with a drafter whose budget the controller sets to 0 decode like plain ones, queued
    ahead; once it drafts, steps go one at a time. The tokens are plain decoding's either way."""
    from tests.test_controller import Scripted

    auto = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 5), lambda: LookupDrafter(CPU), decode=DECODE,
                         config=BatchConfig(prefill_chunk=4, pipeline=True, speculation=Scripted((budget,))))
    events = record_order(auto, monkeypatch)
    want = run_all(engine(tiny_target, pipeline=False), PROMPTS, configs(SAMPLINGS[0]))
    assert run_all(auto, PROMPTS, configs(SAMPLINGS[0])) == want
    assert ("forward forward read" in " ".join(events)) == pipelined_expected
