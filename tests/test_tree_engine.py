"""The engine with draft trees: greedy output equals plain decoding, sampled output follows the target
(chi-square over the first tokens), a seeded sequence is the same alone or in a batch, and the slot
keeps exactly the accepted path. The target is an order-2 Markov table (tests/markov.py): a tree row's
logits are its path's by construction, so these tests check the engine and the rule, not attention."""

import pytest
import torch

from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.engine import GenerationConfig
from specdec.faults import inject
from specdec.sampling import SamplingParams
from tests.markov import MarkovLM, MarkovSlots, MarkovTreeDrafter
from tests.test_exactness import HOT, N_TOKENS, PROMPT, V, exact_joint, goodness_of_fit

SAMPLES = 3000


def pair(vocab: int = V, noise: float = 1.0) -> tuple[MarkovLM, MarkovLM]:
    """A target and a draft whose table is the target's plus noise: drafts kept often, not always."""
    target, draft = MarkovLM(vocab, seed=1), MarkovLM(vocab, seed=2)
    draft.table = target.table + noise * draft.table / 2.0
    return target, draft


def engine(target: MarkovLM, drafter: MarkovTreeDrafter, slots: int = 8) -> BatchedEngine:
    return BatchedEngine(MarkovSlots(target, slots), drafter.fork, config=BatchConfig(prefill_chunk=4))


def plain_greedy(target: MarkovLM, prompt: list[int], n: int) -> list[int]:
    context = list(prompt)
    for _ in range(n):
        context.append(int(target.next_logits(context).argmax()))
    return context[len(prompt):]


@pytest.mark.parametrize("width,depth,k", [(2, 3, 6), (3, 2, 9), (1, 4, 4)])
def test_greedy_trees_equal_plain_decoding(width, depth, k):
    target, draft = pair(vocab=12)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10], [11, 1]]
    eng = engine(target, MarkovTreeDrafter(draft, width, depth))
    handles = [eng.submit(p, GenerationConfig(max_new_tokens=40, k=k)) for p in prompts]
    eng.run()
    for prompt, handle in zip(prompts, handles):
        assert handle.token_ids == plain_greedy(target, prompt, 40)
    stats = [h.stats for h in handles]
    assert sum(s.accepted for s in stats) > sum(s.rounds for s in stats) // 2  # the trees were used


def sampled_counts(drafter: MarkovTreeDrafter, target: MarkovLM, k: int = 6) -> dict:
    eng = engine(target, drafter, slots=64)
    handles = [eng.submit(PROMPT, GenerationConfig(max_new_tokens=N_TOKENS, k=k,
                                                   sampling=SamplingParams(temperature=1.0, seed=i)))
               for i in range(SAMPLES)]
    eng.run()
    counts: dict[tuple, int] = {}
    for h in handles:
        counts[tuple(h.token_ids)] = counts.get(tuple(h.token_ids), 0) + 1
    return counts


@pytest.mark.parametrize("sampled,distinct", [(False, False), (True, False), (True, True)])
def test_sampled_output_follows_the_target(sampled, distinct):
    """Top-token children, children drawn with replacement, and children drawn without (as the head's)."""
    target, draft = pair()
    counts = sampled_counts(MarkovTreeDrafter(draft, width=2, depth=2, sampled=sampled, distinct=distinct), target)
    assert goodness_of_fit(counts, exact_joint(target, HOT)) > 1e-3


def test_the_engine_test_catches_a_rule_without_residual_updates():
    target, draft = pair()
    with inject("tree-no-sibling-residual"):
        counts = sampled_counts(MarkovTreeDrafter(draft, width=3, depth=1), target, k=3)
    assert goodness_of_fit(counts, exact_joint(target, HOT)) < 1e-4


def test_a_seeded_sequence_is_the_same_alone_and_in_a_batch():
    target, draft = pair(vocab=12)
    config = GenerationConfig(max_new_tokens=30, k=6, sampling=SamplingParams(temperature=0.9, seed=7))
    alone = engine(target, MarkovTreeDrafter(draft, sampled=True)).generate([[3, 4]], config)[0].token_ids
    eng = engine(target, MarkovTreeDrafter(draft, sampled=True))
    others = [eng.submit([i % 12, 5], GenerationConfig(max_new_tokens=20 + i, k=1 + i % 6,
                                                        sampling=SamplingParams(temperature=1.0, seed=100 + i)))
              for i in range(5)]
    mine = eng.submit([3, 4], config)
    eng.run()
    assert mine.token_ids == list(alone) and all(h.done for h in others)


def test_the_slot_holds_exactly_the_text_after_each_tree_round():
    target, draft = pair(vocab=12)
    slots = MarkovSlots(target, 2)
    eng = BatchedEngine(slots, MarkovTreeDrafter(draft, width=3, depth=3).fork)
    handle = eng.submit([1, 2, 3], GenerationConfig(max_new_tokens=25, k=10))
    while not handle.done:
        eng.step()
        if not handle.done:  # the slot holds the text but its newest token (fed first next round)
            assert slots.slots[0] == ([1, 2, 3] + handle.token_ids)[:-1]


def test_each_tree_rounds_first_token_carries_its_tree_and_kept_path():
    target, draft = pair(vocab=12)
    eng = engine(target, MarkovTreeDrafter(draft, width=2, depth=3))
    handle = eng.submit([1, 2, 3], GenerationConfig(max_new_tokens=30, k=6))
    emitted = list(handle)
    firsts = [t for i, t in enumerate(emitted) if i == 0 or t.round_index != emitted[i - 1].round_index]
    trees = [t for t in emitted if t.tree is not None]
    assert all(t in firsts for t in trees)  # only a round's first token carries it
    assert len(trees) >= len(firsts) - 2  # the last rounds, short of room, may draft chains
    for i, t in enumerate(emitted):
        if t.tree is not None:  # the kept path's tokens are the round's first emitted ones
            kept = [t.tree.tokens[j] for j in t.tree.path]
            assert [e.token_id for e in emitted[i:i + len(kept)]] == kept
