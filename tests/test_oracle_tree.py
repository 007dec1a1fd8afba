"""The oracle tree drafter and best_tree: the shape keeps the most tokens for its profile, and the
engine's measured tau with the oracle meets the shape's prediction (greedy, a Markov target)."""

import pytest
import torch

from specdec.drafters.oracle_tree import OracleTreeDrafter
from specdec.engine import GenerationConfig
from specdec.engine.batched import BatchedEngine
from specdec.errors import InvalidRequestError
from specdec.speedup import best_tree, expected_tokens_per_round
from specdec.trees import node_depths
from tests.markov import MarkovLM, MarkovSlots
from tests.test_tree_engine import plain_greedy


def test_a_one_rank_profile_is_a_chain():
    plan = best_tree((0.7,), 5)
    assert plan.parents == (-1, 0, 1, 2, 3)
    assert plan.expected_tokens == pytest.approx(expected_tokens_per_round(0.7, 5))


def test_best_tree_beats_the_chain_of_the_same_nodes_and_is_closed_under_ancestors():
    profile = (0.55, 0.2, 0.08)
    for nodes in (4, 8, 16, 32):
        plan = best_tree(profile, nodes)
        assert len(plan.parents) == nodes and all(-1 <= p < j for j, p in enumerate(plan.parents))
        assert all(plan.values[j] <= plan.values[p] for j, p in enumerate(plan.parents) if p >= 0)
        assert plan.expected_tokens > expected_tokens_per_round(profile[0], nodes)
    assert best_tree(profile, 32, max_depth=3).parents and max(node_depths(best_tree(profile, 32, 3).parents)) == 3


def test_a_bad_profile_is_refused():
    with pytest.raises(InvalidRequestError, match="summing to at most 1"):
        best_tree((0.8, 0.4), 4)


@pytest.mark.parametrize("profile,nodes", [((0.6, 0.2, 0.1), 10), ((0.8,), 4)])
def test_the_engine_keeps_what_the_shape_predicts(profile, nodes):
    target = MarkovLM(16, seed=3)
    oracle = OracleTreeDrafter(MarkovLM(16, seed=3), profile, horizon=400)
    engine = BatchedEngine(MarkovSlots(target, 4), oracle.fork)
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8]]
    handles = [engine.submit(p, GenerationConfig(max_new_tokens=300, k=nodes)) for p in prompts]
    engine.run()
    for prompt, handle in zip(prompts, handles):
        assert handle.token_ids == plain_greedy(target, prompt, 300)
    rounds = sum(h.stats.rounds for h in handles)
    tau = sum(h.stats.generated for h in handles) / rounds
    assert tau == pytest.approx(best_tree(profile, nodes).expected_tokens, rel=0.06)
