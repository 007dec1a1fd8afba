"""Exactness under batching: a sequence's tokens do not depend on which sequences share its batch,
how many rows they bring, or when they arrive (rule 6 of the design).

Greedy: every sequence's output equals its own batch-1 plain decoding through engine.Engine.
Sampled: a seed reproduces a sequence whatever its companions, and the first tokens follow the
target's distribution (chi-square, as in test_exactness.py).
"""

import random

import pytest
import torch

from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.drafters.head import DraftHead, HeadDrafter, config_for_target, target_parts
from specdec.drafters.oracle import OracleDrafter
from specdec.engine import Engine, GenerationConfig, Origin
from specdec.errors import InvalidRequestError
from specdec.models.slots import LoopSlots, SlotModel
from specdec.sampling import SamplingParams
from tests.conftest import VOCAB
from tests.markov import MarkovLM
from tests.test_exactness import HOT, PROMPT, V, exact_joint, goodness_of_fit

CPU = torch.device("cpu")
DECODE = lambda ids: " ".join(f"t{i}" for i in ids)  # noqa: E731  (a tokenizer's decode, for stop strings)
KINDS = ("none", "lookup", "model", "oracle", "head")


def make_drafter(kind: str, target, draft):
    """A fresh drafter of one kind for one sequence (a model drafter gets a cache of its own)."""
    if kind == "none":
        return NoDrafter(CPU)
    if kind == "lookup":
        return LookupDrafter(CPU)
    if kind == "model":
        return ModelDrafter(draft.with_own_cache(), VOCAB)
    if kind == "oracle":
        return OracleDrafter(target.with_own_cache(), alpha=0.8, horizon=32)
    torch.manual_seed(5)  # an untrained head: poor drafts, but its features path runs
    return HeadDrafter(DraftHead(config_for_target(target, draft_vocab=48)).eval(), target_parts(target))


def plain(target, prompt, config, eos=()):
    """The reference: the sequence alone, plain decoding through today's Engine."""
    return Engine(target, NoDrafter(CPU), eos_token_ids=eos, decode=DECODE).generate(prompt, config)


def batched(target, max_slots: int, chunk: int = 8, eos=()) -> BatchedEngine:
    return BatchedEngine(LoopSlots(target.with_own_cache, max_slots), lambda: NoDrafter(CPU), eos_token_ids=eos,
                         decode=DECODE, config=BatchConfig(prefill_chunk=chunk))


def mixed_requests(n: int, seed: int = 0):
    """n (prompt, config, drafter kind, arrival step): prompt lengths 1..30 (some repeating, so that
    lookup finds matches), K 1..6, 6..24 new tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.choice([1, 2, 5, 9, 17, 30])
        base = [rng.randrange(5, VOCAB) for _ in range(max(1, length // 2))]
        prompt = (base * 3)[:length]
        config = GenerationConfig(max_new_tokens=rng.randrange(6, 25), k=rng.randrange(1, 7))
        out.append((prompt, config, KINDS[i % len(KINDS)], rng.randrange(0, 12)))
    return out


def run_arriving(engine: BatchedEngine, requests, drafters):
    """Submit each request at its arrival step, then run to the end; the handles in request order."""
    handles = [None] * len(requests)
    step = 0
    while step <= max(r[3] for r in requests) or engine.busy:
        for i, (prompt, config, _, arrival) in enumerate(requests):
            if arrival == step:
                handles[i] = engine.submit(prompt, config, drafter=drafters[i])
        engine.step()
        step += 1
    return handles


def record_rows(engine: BatchedEngine, monkeypatch) -> list[list[int]]:
    """Records, for each forward_ragged call of the engine's target, how many tokens each sequence brings."""
    calls = []
    forward = engine.target.forward_ragged

    def recorded(slots, tokens, **kw):
        calls.append([len(t) for t in tokens])
        return forward(slots, tokens, **kw)

    monkeypatch.setattr(engine.target, "forward_ragged", recorded)
    return calls


def test_greedy_output_equals_plain_decoding_whatever_the_batch(tiny_target, tiny_draft, monkeypatch):
    requests = mixed_requests(40)
    engine = batched(tiny_target, max_slots=6)
    calls = record_rows(engine, monkeypatch)
    drafters = [make_drafter(kind, tiny_target, tiny_draft) for _, _, kind, _ in requests]
    handles = run_arriving(engine, requests, drafters)
    for (prompt, config, kind, _), handle in zip(requests, handles):
        expected = plain(tiny_target, prompt, config)
        assert handle.done and handle.token_ids == expected.token_ids, (kind, prompt, config)
        assert handle.finish_reason == expected.finish_reason == "length"
        stats = handle.stats
        assert stats.generated == len(handle.token_ids) and sum(stats.accepted_per_position) == stats.accepted
    drafted, accepted = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)
    for (_, _, kind, _), handle in zip(requests, handles):
        drafted[kind] += handle.stats.drafted
        accepted[kind] += handle.stats.accepted
    assert all(drafted[kind] > 0 for kind in KINDS[1:]) and drafted["none"] == 0  # the head read its features
    assert accepted["lookup"] > 0 and accepted["oracle"] > 0
    sizes = [len(rows) for rows in calls]
    assert max(sizes) == 6 and len(set(sizes)) > 3  # full batches (40 sequences queued for 6 slots) and ragged ones


def test_greedy_identity_under_batching_catches_a_skipped_rollback(tiny_target, monkeypatch):
    requests = mixed_requests(10, seed=1)
    engine = batched(tiny_target, max_slots=3)
    monkeypatch.setattr(LoopSlots, "rollback", lambda self, slot, length: None)
    handles = run_arriving(engine, requests, [LookupDrafter(CPU) for _ in requests])
    monkeypatch.undo()
    assert any(h.token_ids != plain(tiny_target, p, c).token_ids for (p, c, _, _), h in zip(requests, handles))


def test_eos_and_stop_strings_end_each_sequence_as_alone(tiny_target):
    prompts = [[7, 11, 13, 17, 19], [1, 2, 3, 4, 5, 1, 2, 3], [9], [40, 41, 42, 40, 41]]
    free = [plain(tiny_target, p, GenerationConfig(max_new_tokens=20)).token_ids for p in prompts]
    eos = free[0][5]
    configs = [GenerationConfig(max_new_tokens=20, k=3),
               GenerationConfig(max_new_tokens=20, k=2, stop=(f"t{free[1][4]}",)),
               GenerationConfig(max_new_tokens=20, k=4, ignore_eos=True),
               GenerationConfig(max_new_tokens=20, k=1, stop=("no such text",))]
    engine = batched(tiny_target, max_slots=2, eos=[eos])
    handles = [engine.submit(p, c, drafter=LookupDrafter(CPU)) for p, c in zip(prompts, configs)]
    engine.run()
    for prompt, config, handle in zip(prompts, configs, handles):
        expected = plain(tiny_target, prompt, config, eos=[eos])
        assert (handle.token_ids, handle.finish_reason) == (expected.token_ids, expected.finish_reason)
    assert handles[0].finish_reason == "stop" and handles[0].token_ids[-1] == eos
    assert handles[1].finish_reason == "stop"


@pytest.mark.parametrize("kind", ["none", "lookup", "model", "head"])
def test_a_seed_reproduces_a_sequence_whatever_its_companions(tiny_target, tiny_draft, kind):
    prompt = [3, 4, 5, 3, 4, 5, 3]
    config = GenerationConfig(max_new_tokens=24, k=3, sampling=SamplingParams(temperature=1.0, seed=42))
    alone = batched(tiny_target, max_slots=1).submit(prompt, config, make_drafter(kind, tiny_target, tiny_draft))
    engine = batched(tiny_target, max_slots=3, chunk=3)
    companions = [([8, 9, 10, 11, 12, 13, 14], SamplingParams(temperature=0.8, seed=1)),
                  ([20], SamplingParams()), ([30, 31] * 6, SamplingParams(temperature=1.2, top_k=9, seed=2))]
    for i, (other, params) in enumerate(companions[:2]):
        engine.submit(other, GenerationConfig(max_new_tokens=30, k=i + 2, sampling=params),
                      make_drafter(KINDS[i + 1], tiny_target, tiny_draft))
    engine.step()
    engine.step()
    shared = engine.submit(prompt, config, make_drafter(kind, tiny_target, tiny_draft))
    engine.step()
    engine.submit(companions[2][0], GenerationConfig(max_new_tokens=10, k=5, sampling=companions[2][1]))
    assert shared.result().token_ids == alone.result().token_ids
    one_engine = Engine(tiny_target, make_drafter(kind, tiny_target, tiny_draft)).generate(prompt, config)
    assert shared.token_ids == one_engine.token_ids  # and as the single-sequence engine draws them


def test_sampled_output_follows_target_distribution_under_batching():
    """2000 seeded sequences of one prompt in 16 slots, each with its own Markov draft (K=1: a
    2-token answer is one round of a draft and its bonus, or two rounds), among greedy and sampled
    companions of other prompts and lengths arriving in between."""
    engine = BatchedEngine(LoopSlots(lambda: MarkovLM(V, seed=0), 16), lambda: ModelDrafter(MarkovLM(V, seed=1), V))
    handles, origins = [], set()
    for i in range(2000):
        sampling = SamplingParams(temperature=1.0, seed=i)
        handles.append(engine.submit(PROMPT, GenerationConfig(max_new_tokens=2, k=1, sampling=sampling)))
        if i % 4 == 0:
            other = SamplingParams(temperature=0.0 if i % 8 else 0.7, seed=10_000 + i)
            config = GenerationConfig(max_new_tokens=3 + i % 5, k=1 + i % 3, sampling=other)
            engine.submit([i % V] * (1 + i % 3), config)
        if i % 5 == 0:
            engine.step()
    engine.run()
    counts = {}
    for handle in handles:
        counts[tuple(handle.token_ids)] = counts.get(tuple(handle.token_ids), 0) + 1
        origins |= {t.origin for t in handle}
    assert goodness_of_fit(counts, exact_joint(MarkovLM(V, seed=0), HOT, n_tokens=2)) > 1e-3
    assert origins == {Origin.ACCEPTED, Origin.RECOVERED, Origin.BONUS}


@pytest.mark.parametrize("prompt, config, words", [
    ([], GenerationConfig(), "prompt is empty"),
    ([1] * 500, GenerationConfig(max_new_tokens=20), "exceeds the target's context of 512"),
    ([1, 2], GenerationConfig(stop=("x",)), "stop strings need a decode function"),
], ids=["empty-prompt", "prompt-too-long", "stop-without-decode"])
def test_bad_requests_are_refused_at_submit_as_engine_refuses_them(tiny_target, prompt, config, words):
    single = Engine(tiny_target, NoDrafter(CPU))
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 2), lambda: NoDrafter(CPU))
    with pytest.raises(InvalidRequestError, match=words) as from_single:
        single.generate(prompt, config)
    with pytest.raises(InvalidRequestError, match=words) as from_batched:
        engine.submit(prompt, config)
    assert str(from_batched.value) == str(from_single.value) and not engine.busy


def test_k_below_one_is_refused_before_submit():
    with pytest.raises(InvalidRequestError, match="K"):
        GenerationConfig(k=0)


def test_a_long_prompt_never_stalls_the_others_for_more_than_one_chunk(tiny_target, monkeypatch):
    engine = batched(tiny_target, max_slots=2, chunk=4)
    calls = record_rows(engine, monkeypatch)
    short = engine.submit([5, 6], GenerationConfig(max_new_tokens=30, k=1))
    engine.step()
    long = engine.submit(list(range(5, 45)), GenerationConfig(max_new_tokens=5, k=1))
    steps = 0
    while not long.token_ids:
        before = len(short.token_ids)
        engine.step()
        steps += 1
        assert len(short.token_ids) > before  # the decoding sequence emits every step
    assert steps >= 39 // 4 + 1 and max(rows[1] for rows in calls if len(rows) == 2) <= 4  # 39 prompt tokens, 4 a step
    engine.run()
    assert long.token_ids == plain(tiny_target, list(range(5, 45)), GenerationConfig(max_new_tokens=5, k=1)).token_ids


def test_a_step_of_prefill_chunks_only_waits_for_the_device_so_its_time_is_prefill_time(tiny_target, monkeypatch):
    """Such a step reads nothing back; without a wait its device time lands in the next step, the
    first decode, and batch-1 tokens/s read 3-5 % low on the H200 (226 against 234 for the same
    kernels). One wait per prefill-only step, none in a step that reads its verdicts anyway."""
    import specdec.engine.batched

    waits = []
    monkeypatch.setattr(specdec.engine.batched, "_wait_for", lambda device: waits.append(len(handle.token_ids)))
    engine = batched(tiny_target, max_slots=2, chunk=4)
    handle = engine.submit(list(range(5, 15)), GenerationConfig(max_new_tokens=6, k=1))
    engine.run()
    assert waits == [0, 0, 0] and len(handle.token_ids) == 6  # 9 prompt tokens in chunks of 4: 3 prefill steps


def test_sequences_wait_for_a_slot_and_a_cancelled_one_frees_it(tiny_target):
    engine = batched(tiny_target, max_slots=2)
    config = GenerationConfig(max_new_tokens=12, k=2)
    first, second, third = (engine.submit([i + 5, i + 6], config) for i in range(3))
    engine.step()  # the prefill of the first two prompts
    engine.step()
    assert first.token_ids and second.token_ids and not third.token_ids  # queued: no free slot
    assert (engine.num_running, engine.num_waiting) == (2, 1)
    second.cancel()
    engine.run()
    assert second.done and second.finish_reason is None and len(second.token_ids) < 12
    assert third.token_ids == plain(tiny_target, [7, 8], config).token_ids


def test_a_listener_receives_every_token_once_in_order(tiny_target):
    engine = batched(tiny_target, max_slots=2)
    seen: dict[int, list[int]] = {}
    finished = []

    def listener(handle, tokens):
        seen.setdefault(handle.request_id, []).extend(t.token_id for t in tokens)
        if handle.done:
            finished.append(handle.request_id)

    handles = [engine.submit([i + 5] * (i + 1), GenerationConfig(max_new_tokens=9, k=3), listener=listener)
               for i in range(3)]
    engine.run()
    assert sorted(finished) == [h.request_id for h in handles]
    assert all(seen[h.request_id] == h.token_ids for h in handles)


def test_breaking_out_of_a_handle_cancels_it(tiny_target):
    engine = batched(tiny_target, max_slots=1)
    handle = engine.submit([3, 4, 5], GenerationConfig(max_new_tokens=40, k=2))
    waiting = engine.submit([6, 7], GenerationConfig(max_new_tokens=5, k=2))
    stream = iter(handle)
    for i, _ in zip(range(4), stream):
        pass
    stream.close()
    assert handle.cancelled and waiting.result().finish_reason == "length"
    assert handle.done and len(handle.token_ids) < 40


def assert_slots_match_alone(slots: SlotModel, make_alone, steps: int = 40, seed: int = 0,
                             exact: bool = True) -> tuple[int, int]:
    """A random schedule of ragged calls over the slots (prefill chunks, verifies, plain steps, some
    asking for features or no logits, each followed by a rollback or a release now and then): every
    sequence's logits and features equal, bit for bit, those of its own CausalLM run alone
    (make_alone: () -> a fresh one). Any SlotModel must pass. exact=False: equal greedy tokens and
    logits within 1e-5 only (matrices whose kernels differ by row count). Returns (sequence calls
    whose logits were bit-identical, sequence calls)."""
    rng = random.Random(seed)
    alone = [make_alone() for _ in range(slots.max_slots)]
    same = total = 0
    for _ in range(steps):
        chosen = rng.sample(range(slots.max_slots), rng.randint(1, slots.max_slots))
        tokens = [torch.tensor([rng.randrange(VOCAB) for _ in range(rng.choice([1, 1, 3, 7]))]) for _ in chosen]
        layers = [rng.choice([None, None, (), (0,)]) for _ in chosen]
        want = [rng.random() < 0.9 for _ in chosen]
        out = slots.forward_ragged(chosen, tokens, logits=want, features=layers)
        for i, (slot, new) in enumerate(zip(chosen, tokens)):
            logits, features = alone[slot].forward_with_hidden(new, layers[i] or ())
            assert (out.features[i] is None) == (layers[i] is None)
            if want[i]:
                total += 1
                same += torch.equal(out.logits_of(i), logits)
                assert torch.equal(out.logits_of(i).argmax(-1), logits.argmax(-1))
                torch.testing.assert_close(out.logits_of(i), logits, rtol=0, atol=0 if exact else 1e-5)
            if layers[i] is not None:
                torch.testing.assert_close(out.features[i], features, rtol=0, atol=0 if exact else 1e-5)
            if rng.random() < 0.1:
                slots.release(slot)
                alone[slot].reset()
            elif rng.random() < 0.4:
                keep = rng.randint(0, alone[slot].cache_len)
                slots.rollback(slot, keep)
                alone[slot].rollback(keep)
        assert [slots.cache_len(s) for s in range(slots.max_slots)] == [m.cache_len for m in alone]
    return same, total


def test_loop_slots_rows_are_each_model_alone(tiny_target):
    assert_slots_match_alone(LoopSlots(tiny_target.with_own_cache, 4), tiny_target.with_own_cache)


def test_forward_ragged_gives_logits_and_features_where_asked(tiny_target):
    slots = LoopSlots(tiny_target.with_own_cache, 3)
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([9]), torch.tensor([1, 2, 3, 4, 5])]
    out = slots.forward_ragged([2, 0, 1], prompts, logits=[True, False, True], features=[None, (0,), None])
    assert out.offsets == (0, 3, 3, 8) and out.logits.shape == (8, VOCAB)
    assert out.features[0] is None and out.features[1].shape == (1, 2 * 32)
    assert torch.equal(out.logits_of(2), tiny_target.prefill(prompts[2]))
    assert [slots.cache_len(s) for s in range(3)] == [1, 5, 3]
    with pytest.raises(ValueError, match="distinct"):
        slots.forward_ragged([0, 0], [torch.tensor([1]), torch.tensor([2])])
    with pytest.raises(ValueError, match="exceed"):
        slots.forward_ragged([0], [torch.zeros(512, dtype=torch.long)])
