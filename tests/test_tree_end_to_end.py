"""Trees end to end on real (tiny, random) Llama targets: every tree drafter through the engine gives
plain decoding's greedy output, over the transformers backend one sequence at a time and over
NativeSlots in a batch that mixes trees, chains and prefill chunks; a seeded sampled sequence gets
the same tokens alone or in a batch (rule 6)."""

import pytest
import torch

from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.drafters.combined import LookupThenHead
from specdec.drafters.tree_shape import TreeShape
from specdec.engine import Engine, GenerationConfig
from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.sampling import SamplingParams
from tests.conftest import VOCAB
from tests.test_batch_drafters import untrained_head
from tests.test_batching import DECODE, plain
from tests.test_native_slots import native_pair

CPU = torch.device("cpu")
SHAPE = TreeShape(depth=3, branch=3, width=2)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9], [10, 11, 12, 13, 14, 15, 16, 10, 11], [20, 21]]


def tree_drafter(kind: str, target, draft):
    if kind == "lookup":
        base = LookupDrafter(CPU)
    elif kind == "model":
        base = ModelDrafter(draft.with_own_cache(), VOCAB)
    elif kind == "head":
        base = untrained_head(target)
    else:
        base = LookupThenHead(LookupDrafter(CPU), untrained_head(target))
    return base.with_tree(SHAPE)


@pytest.mark.parametrize("kind", ["lookup", "model", "head", "lookup+head"])
def test_tree_drafters_give_plain_greedy_output_one_sequence_at_a_time(kind, tiny_target, tiny_draft):
    engine = Engine(tiny_target, tree_drafter(kind, tiny_target, tiny_draft))
    reference = Engine(tiny_target, NoDrafter(CPU))
    trees = 0
    for prompt in PROMPTS:
        config = GenerationConfig(max_new_tokens=24, k=8)
        out = engine.generate(prompt, config)
        assert out.token_ids == reference.generate(prompt, config).token_ids, (kind, prompt)
        trees += out.stats.drafted
    assert trees > 0


def test_a_batch_of_trees_and_chains_over_native_slots_gives_plain_greedy_output(tiny_target, tiny_draft):
    slots, alone = native_pair(tiny_target, max_slots=6)
    engine = BatchedEngine(slots, lambda: NoDrafter(CPU), decode=DECODE, config=BatchConfig(prefill_chunk=4))
    kinds = ["lookup", "model", "head", "lookup+head"]
    requests = [(p, kind, tree) for p in PROMPTS for kind in kinds for tree in (True, False)][:14]
    handles = []
    for prompt, kind, tree in requests:
        drafter = tree_drafter(kind, tiny_target, tiny_draft)
        if not tree:  # the same kind drafting chains
            drafter = {"lookup": LookupDrafter(CPU), "head": untrained_head(tiny_target),
                       "model": ModelDrafter(tiny_draft.with_own_cache(), VOCAB)}.get(kind, LookupDrafter(CPU))
        handles.append(engine.submit(prompt, GenerationConfig(max_new_tokens=20, k=7 if tree else 3), drafter))
        engine.step()
    engine.run()
    for (prompt, kind, tree), handle in zip(requests, handles):
        expected = plain(alone, prompt, GenerationConfig(max_new_tokens=20))
        assert handle.token_ids == expected.token_ids, (kind, tree, prompt)
    assert all(slots.cache_len(s) == 0 for s in range(6))


def test_a_seeded_tree_sequence_is_the_same_alone_and_in_a_batch(tiny_target, tiny_draft):
    config = GenerationConfig(max_new_tokens=20, k=8, sampling=SamplingParams(temperature=0.9, seed=11))
    slots, _ = native_pair(tiny_target, max_slots=4)
    alone = BatchedEngine(slots, lambda: NoDrafter(CPU)).submit(PROMPTS[0], config,
                                                                   tree_drafter("head", tiny_target, tiny_draft))
    alone_tokens = alone.result().token_ids
    engine = BatchedEngine(slots, lambda: NoDrafter(CPU))
    others = [engine.submit(p, GenerationConfig(max_new_tokens=15, k=5,
                                                sampling=SamplingParams(temperature=1.0, seed=i)),
                            tree_drafter("lookup+head", tiny_target, tiny_draft)) for i, p in enumerate(PROMPTS[1:])]
    mine = engine.submit(PROMPTS[0], config, tree_drafter("head", tiny_target, tiny_draft))
    engine.run()
    assert mine.token_ids == list(alone_tokens) and all(h.done for h in others)
