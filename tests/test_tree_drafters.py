"""Drafters that draft trees: EAGLE-2 trees from the head, lookup's trie of matched continuations,
lookup+head merging both, and `tree:[SHAPE:]SPEC` in the registry."""

import random
from itertools import accumulate

import pytest
import torch

from specdec.drafters import LookupDrafter, NoDrafter, make_drafter
from specdec.drafters.base import propose_all
from specdec.drafters.combined import LookupThenHead
from specdec.drafters.head_batch import _catch_up, head_trees, run_pairs
from specdec.drafters.tree_shape import ranking_distribution
from specdec.drafters.lookup import continuation_trie, lookup_continuations, lookup_draft
from specdec.drafters.model import DraftSlots, ModelDrafter, SlotDrafter
from specdec.drafters.tree_shape import (GrownTree, SampledTreeGrowth, TreeGrowth, TreeShape, append_tree, merge_trees,
                                         parse_tree_shape)
from specdec.errors import DraftSpecError
from specdec.models.cpu_matrix import linear
from specdec.models.loader import LoadedModel
from specdec.models.slots import LoopSlots, RaggedOutput
from specdec.sampling import SamplingParams
from specdec.trees import check_parents, path_rows
from tests.conftest import VOCAB
from tests.test_batch_drafters import untrained_head

CPU = torch.device("cpu")
GREEDY = SamplingParams()
WARM = SamplingParams(temperature=0.8, top_k=20, seed=3)


def assert_valid(tree: GrownTree, k: int) -> None:
    """A tree of at most k nodes, topological (so closed under ancestors), siblings in descending score."""
    assert 1 <= len(tree.tokens) <= k
    check_parents(tree.parents, len(tree.tokens))
    for j, parent in enumerate(tree.parents):
        if parent >= 0:
            assert tree.scores[j] <= tree.scores[parent]
    for parent in set(tree.parents):
        siblings = [tree.scores[j] for j, p in enumerate(tree.parents) if p == parent]
        assert siblings == sorted(siblings, reverse=True)


def paths(tree: GrownTree) -> set[tuple[int, ...]]:
    """The token paths from the root to each leaf."""
    def path(j):
        out = []
        while j >= 0:
            out.append(tree.tokens[j])
            j = tree.parents[j]
        return tuple(out[::-1])
    return {path(j) for j in range(len(tree.tokens)) if j not in tree.parents}


# --- growth and merging, by hand ---

def test_growth_expands_the_best_and_keeps_the_best_k_closed_under_ancestors():
    growth = TreeGrowth(TreeShape(depth=3, branch=2, width=1), budget=4)
    growth.grow([[(10, 0.6), (11, 0.3), (12, 0.1)]])  # branch 2: 12 is not offered
    assert growth.tokens == [10, 11] and growth.frontier == [0]  # width 1: the best only
    growth.grow([[(20, 0.5), (21, 0.4)]])  # scores 0.3, 0.24
    assert growth.frontier == [2]
    growth.grow([[(30, 0.9), (31, 0.05)]])  # depth 3 is the last: nothing more to expand
    assert growth.frontier == []
    tree = growth.result()
    # scores: 10 .6, 11 .3, 20 .3, 21 .24, 30 .27, 31 .015: the best four are 10, 11, 20, 30
    assert tree.tokens == (10, 11, 20, 30) and tree.parents == (-1, -1, 0, 2)
    assert_valid(tree, 4)


def test_growth_never_expands_a_node_outside_the_budget():
    growth = TreeGrowth(TreeShape(depth=4, branch=3, width=3), budget=2)
    growth.grow([[(1, 0.5), (2, 0.3), (3, 0.2)]])
    assert growth.frontier == [0, 1]  # node 2 (0.2) is third: none of its descendants could be kept


def test_min_score_drops_weak_candidates_but_keeps_the_first():
    growth = TreeGrowth(TreeShape(depth=2, branch=2, width=2), budget=5, min_score=0.5)
    growth.grow([[(1, 0.4), (2, 0.3)]])
    assert growth.tokens == [1] and growth.result().tokens == (1,)


def test_merge_puts_the_first_tree_first_and_shares_common_paths():
    first = GrownTree((5, 6), (-1, 0), (2.0, 1.0))  # the path 5 6
    second = GrownTree((5, 7, 8), (-1, -1, 0), (0.5, 0.3, 0.2))  # 5 (then 8), 7
    merged = merge_trees(first, second, budget=4)
    assert merged.tokens == (5, 7, 6, 8) and merged.parents == (-1, -1, 0, 0)
    assert merge_trees(first, second, budget=3).tokens == (5, 7, 6)  # 8 did not fit


def test_sampled_growth_keeps_every_draw_and_spends_the_budget_on_expansions():
    growth = SampledTreeGrowth(TreeShape(depth=3, branch=2, width=2), budget=7)
    assert growth.draws == 2
    growth.grow([[(5, 0.9)]])  # a distribution with one token gives one child
    assert growth.tokens == [5] and growth.frontier == [0] and growth.draws == 2
    growth.grow([[(1, 0.6), (2, 0.1)]])  # scores 0.54, 0.09; room for two more pairs, both expanded
    assert growth.frontier == [1, 2]
    with pytest.raises(ValueError, match="drawn"):
        growth.grow([[(3, 0.5)], []])  # every expanded node gets a child
    with pytest.raises(ValueError, match="distinct"):
        growth.grow([[(3, 0.5), (3, 0.5)], [(4, 0.5)]])  # drawn without replacement
    growth.grow([[(3, 0.9), (4, 0.1)], [(6, 1.0)]])  # depth 3 is the last
    tree = growth.result()
    assert tree.tokens == (5, 1, 2, 3, 4, 6) and tree.parents == (-1, 0, 0, 1, 1, 2)
    assert SampledTreeGrowth(TreeShape(3, 4, 2), budget=3).draws == 3  # the root's draws fit the budget


def test_a_sampled_tree_is_appended_whole_beside_lookups_one_hot_branches():
    looked_up = GrownTree((7, 8), (-1, 0), (1.0, 1.0))
    q = torch.softmax(torch.randn(3, 10), -1)
    drawn = GrownTree((7, 2, 3), (-1, -1, 0), (0.4, 0.3, 0.1), q)
    both = append_tree(looked_up, drawn)
    assert both.tokens == (7, 8, 7, 2, 3) and both.parents == (-1, 0, -1, -1, 2)
    assert torch.equal(both.q[:2], torch.nn.functional.one_hot(torch.tensor([7, 8]), 10).float())
    assert torch.equal(both.q[2:], q)
    assert append_tree(GrownTree((), (), ()), drawn) is drawn and append_tree(looked_up, GrownTree((), (), ())) is looked_up


def test_a_shape_is_written_depth_x_branch_x_width():
    assert parse_tree_shape("5x3") == TreeShape(5, 3, 3)
    assert parse_tree_shape("5x3x8") == TreeShape(5, 3, 8)
    assert parse_tree_shape("") == TreeShape()
    for bad in ("5", "x3", "0x3", "5x3x"):
        with pytest.raises(DraftSpecError):
            parse_tree_shape(bad)


# --- lookup ---

def test_lookup_branches_are_exactly_the_distinct_continuations():
    seq = [1, 2, 3, 9, 1, 2, 3, 9, 4, 1, 2, 3, 7, 7, 1, 2, 3, 5, 6, 1, 2, 3]
    matched, found = lookup_continuations(seq, length=3, branches=4)
    assert matched == 3 and found[0] == [5, 6, 1]  # the most recent first, as lookup_draft's
    tree = continuation_trie(found, budget=100)
    assert paths(tree) == {tuple(c) for c in found} == {(5, 6, 1), (7, 7, 1), (9, 4, 1), (9, 1, 2)}
    assert len(tree.tokens) == 11  # 9 is one node for both continuations that start with it
    assert tree.tokens[0] == 9  # the most frequent first child is tried first
    drafter = LookupDrafter(CPU).with_tree(TreeShape(depth=3, branch=4))
    draft = drafter.propose(seq, 6, GREEDY, None)
    assert draft.q is None and len(draft) == 6 and set(draft.tokens[:3].tolist()) == {9, 5, 7}


def test_lookup_tree_of_one_branch_is_the_chain_draft():
    seq = [4, 8, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    tree = LookupDrafter(CPU).with_tree(TreeShape(depth=4, branch=1)).propose(seq, 4, GREEDY, None)
    assert tree.is_chain and tree.tokens.tolist() == lookup_draft(seq, 4) == [4, 5, 6, 7]


def test_lookup_without_a_match_drafts_nothing():
    assert len(LookupDrafter(CPU).with_tree(TreeShape()).propose([1, 2, 3], 5, GREEDY, None)) == 0


# --- the head ---

def fed(head, target, context: list[int]):
    """head after begin(context) and the target's features of context but its last token."""
    head.begin(list(context))
    _, feats = target.with_own_cache().forward_with_hidden(torch.tensor(context), ())
    head.observe(feats[:len(context) - 1])
    return head


@torch.inference_mode()
def chain_scores(head, context: list[int], path: list[int], params: SamplingParams) -> float:
    """The head's cumulative probability of `path`, drafting it as a chain from a fresh cache."""
    _catch_up([head], [context])
    h, score = head._last_true, 1.0
    for i, token in enumerate(path):
        probs = ranking_distribution(linear(h[None], head.lm_sub)[0], params)
        score *= float(probs[head.vocab_list.index(token)])
        h = run_pairs([head], [h[None]], [torch.tensor([token])], [head._num_feats + i])[0]
    return score


CONTEXT = [3, 17, 5, 42, 8, 8, 21, 60, 2]


def tree_path(tree: GrownTree, j: int) -> list[int]:
    path = []
    while j >= 0:
        path.insert(0, tree.tokens[j])
        j = tree.parents[j]
    return path


@pytest.mark.parametrize("k", [1, 5, 16])
def test_greedy_head_trees_are_valid_and_score_each_path_as_its_chain(tiny_target, k):
    shape = TreeShape(depth=4, branch=3, width=2)
    head = fed(untrained_head(tiny_target).with_tree(shape), tiny_target, CONTEXT)
    tree = head_trees([head], [CONTEXT], [k], [GREEDY], [None])[0]
    assert_valid(tree, k)
    assert len(tree.tokens) == min(k, shape.most_nodes) and tree.q is None
    assert max(len(p) for p in paths(tree)) <= shape.depth
    for j in range(len(tree.tokens)):
        alone = fed(untrained_head(tiny_target), tiny_target, CONTEXT)
        assert tree.scores[j] == pytest.approx(chain_scores(alone, CONTEXT, tree_path(tree, j), GREEDY), rel=1e-4)


@pytest.mark.parametrize("k", [1, 5, 16])
def test_sampled_head_trees_keep_every_draw_with_the_distribution_it_came_from(tiny_target, k):
    """Each expanded node has `branch` distinct children (the root min(branch, k)), fewer only where its
    distribution has fewer tokens; node j's q row is the head's warped distribution after its parent's
    path, drafted as a chain, less its earlier siblings' tokens and renormalised."""
    shape = TreeShape(depth=4, branch=3, width=2)
    head = fed(untrained_head(tiny_target).with_tree(shape), tiny_target, CONTEXT)
    tree = head_trees([head], [CONTEXT], [k], [WARM], [torch.Generator().manual_seed(3)])[0]
    check_parents(tree.parents, len(tree.tokens))
    assert len(tree.tokens) <= k and tree.q.shape == (len(tree.tokens), tiny_target.vocab_size)
    for parent in set(tree.parents):
        siblings = [j for j, p in enumerate(tree.parents) if p == parent]
        alone = fed(untrained_head(tiny_target), tiny_target, CONTEXT)
        support = int((chain_distribution(alone, CONTEXT, tree_path(tree, siblings[0])[:-1], WARM) > 0).sum())
        assert len(siblings) == min(shape.branch if parent >= 0 else min(shape.branch, k), support)
        assert len({tree.tokens[j] for j in siblings}) == len(siblings)
    for j, token in enumerate(tree.tokens):
        alone = fed(untrained_head(tiny_target), tiny_target, CONTEXT)
        expected = chain_distribution(alone, CONTEXT, tree_path(tree, j)[:-1], WARM).clone()
        before = [i for i in range(j) if tree.parents[i] == tree.parents[j]]
        expected[[tree.tokens[i] for i in before]] = 0.0
        torch.testing.assert_close(tree.q[j], expected / expected.sum(), rtol=1e-4, atol=1e-6)
        assert tree.q[j, token] > 0
        assert tree.scores[j] == pytest.approx(chain_scores(alone, CONTEXT, tree_path(tree, j), WARM), rel=1e-4)


@torch.inference_mode()
def chain_distribution(head, context: list[int], path: list[int], params: SamplingParams) -> torch.Tensor:
    """The head's warped distribution over the target's vocabulary after drafting `path` as a chain."""
    _catch_up([head], [context])
    h = head._last_true
    for i, token in enumerate(path):
        h = run_pairs([head], [h[None]], [torch.tensor([token])], [head._num_feats + i])[0]
    probs = ranking_distribution(linear(h[None], head.lm_sub)[0], params)
    return probs.new_zeros(head.c.vocab_size).index_copy_(0, head.head.vocab_ids, probs)


def test_greedy_head_trees_draw_nothing_and_sampled_ones_repeat_for_a_seed(tiny_target):
    for params in (GREEDY, WARM):
        drafts, states = [], []
        for _ in range(2):
            head = fed(untrained_head(tiny_target).with_tree(TreeShape(3, 3, 2)), tiny_target, CONTEXT)
            generator = torch.Generator().manual_seed(7)
            before = generator.get_state()
            drafts.append(head.propose(CONTEXT, 8, params, generator))
            states.append(torch.equal(generator.get_state(), before))
        assert torch.equal(drafts[0].tokens, drafts[1].tokens) and drafts[0].parents == drafts[1].parents
        if params.greedy:
            assert all(states) and drafts[0].q is None
        else:
            assert not any(states) and torch.equal(drafts[0].q, drafts[1].q)


def kept_round(drafter, target, context: list[int], draft, rng) -> list[int]:
    """A tree round as the engine ends it: a random node's path is kept, plus one token; commit to
    the text before the round, then observe the features of the root and the path's nodes."""
    node, path = rng.randrange(len(draft)), []
    while node >= 0:
        path.insert(0, int(draft.tokens[node]))
        node = draft.node_parents[node]
    text = context + path + [rng.randrange(VOCAB)]
    drafter.commit(len(context))
    _, feats = target.with_own_cache().forward_with_hidden(torch.tensor(text), ())
    drafter.observe(feats[len(context) - 1:len(text) - 1])
    return text


@pytest.mark.parametrize("make", ["head", "lookup+head"])
def test_after_a_tree_round_the_head_drafts_as_a_fresh_head_fed_the_text(tiny_target, make):
    def build():
        head = untrained_head(tiny_target)
        drafter = head if make == "head" else LookupThenHead(LookupDrafter(CPU), head)
        return drafter.with_tree(TreeShape(3, 3, 2))

    rng, drafter, text = random.Random(1), fed(build(), tiny_target, CONTEXT), list(CONTEXT)
    for _ in range(3):
        draft = drafter.propose(text, 7, GREEDY, None)
        text = kept_round(drafter, tiny_target, text, draft, rng)
        fresh = fed(build(), tiny_target, text)
        mine, theirs = drafter.propose(text, 7, GREEDY, None), fresh.propose(text, 7, GREEDY, None)
        assert torch.equal(mine.tokens, theirs.tokens) and mine.parents == theirs.parents
        head, other = (drafter, fresh) if make == "head" else (drafter.head, fresh.head)
        n = head._true_pairs
        assert n == other._true_pairs == len(text) - 1
        torch.testing.assert_close(head._k[:, :, :n], other._k[:, :, :n], rtol=0, atol=1e-5)


def test_batched_head_trees_equal_each_alone(tiny_target):
    contexts = [CONTEXT, [1, 2, 3], [9] * 12, [5, 4, 3, 2, 1, 0]]
    shape, ks = TreeShape(4, 3, 3), [6, 1, 11, 4]
    params = [GREEDY, WARM, SamplingParams(temperature=1.0, seed=1), GREEDY]
    prototype = untrained_head(tiny_target).with_tree(shape)
    together = [fed(prototype.fork(), tiny_target, c) for c in contexts]
    alone = [fed(prototype.fork(), tiny_target, c) for c in contexts]
    batch = propose_all(together, contexts, ks, params, [torch.Generator().manual_seed(i) for i in range(4)])
    for i, (drafter, draft, c, k, sp) in enumerate(zip(alone, batch, contexts, ks, params)):
        one = drafter.propose(c, k, sp, torch.Generator().manual_seed(i))
        assert torch.equal(draft.tokens, one.tokens) and draft.parents == one.parents and len(one) <= k
        assert (draft.q is None) == (one.q is None)
        if one.q is not None:  # the matrices' last bits may follow the row count (head_batch.py)
            torch.testing.assert_close(draft.q, one.q, rtol=1e-5, atol=1e-7)


def test_a_chain_head_still_drafts_chains(tiny_target):
    head = fed(untrained_head(tiny_target), tiny_target, CONTEXT)
    tree_head = fed(untrained_head(tiny_target).with_tree(TreeShape(4, 1, 1)), tiny_target, CONTEXT)
    chain = head.propose(CONTEXT, 4, GREEDY, None)
    assert head.tree is None and chain.parents is None and chain.q is None
    one_branch = tree_head.propose(CONTEXT, 4, GREEDY, None)  # branch 1: the argmax path, as a tree
    assert one_branch.is_chain and torch.equal(one_branch.tokens, chain.tokens)


# --- lookup + head, and the registry ---

def test_lookup_and_head_merge_into_one_tree(tiny_target):
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    shape = TreeShape(3, 2, 2)
    both = fed(LookupThenHead(LookupDrafter(CPU), untrained_head(tiny_target)).with_tree(shape), tiny_target, seq)
    draft = both.propose(seq, 8, GREEDY, None)
    tree = GrownTree(tuple(draft.tokens.tolist()), draft.node_parents, (0.0,) * len(draft))
    assert len(draft) == 8 and draft.q is None
    looked_up = lookup_continuations(seq, 3, 2)[1]
    assert all(any(p[:len(c)] == tuple(c) for p in paths(tree)) for c in looked_up)  # lookup's paths are in
    assert draft.tokens[:2].tolist() == [7, 9]  # lookup's branches are tried first (most recent first)


def test_the_registry_names_trees_in_one_place(tiny_target):
    target = LoadedModel(tiny_target, None, "tiny")
    lookup = make_drafter("tree:5x2x3:lookup", target)
    assert isinstance(lookup, LookupDrafter) and lookup.tree == TreeShape(5, 2, 3)
    assert make_drafter("tree:lookup", target).tree == TreeShape()
    assert make_drafter("lookup", target).tree is None  # chains stay the default
    assert lookup.fork().tree == lookup.tree
    for bad in ("tree:5x2", "tree:", "tree:none"):
        with pytest.raises(DraftSpecError):
            make_drafter(bad, target)
    assert isinstance(make_drafter("none", target), NoDrafter)


# --- the draft model ---

class PathByPath:
    """A test's CausalLM with the models' tree contract, exact by construction: each tree row's
    logits come from decoding its path alone (the cache's rows past the root are then causal
    rows, which a drafter forgets at commit)."""

    def __init__(self, model):
        self.inner = model
        self.name, self.vocab_size, self.device = model.name, model.vocab_size, model.device
        self.max_length = model.max_length

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_len(self) -> int:
        return self.inner.cache_len

    def forward(self, tokens, tree=None):
        if tree is None:
            return self.inner.forward(tokens)
        start, rows = self.inner.cache_len, []
        for r in range(len(tokens)):
            rows.append(self.inner.forward(tokens[path_rows(tree, r)])[-1])
            self.inner.rollback(start)
        self.inner.forward(tokens)
        return torch.stack(rows)

    def with_own_cache(self):
        return PathByPath(self.inner.with_own_cache())


class TreeLoopSlots(LoopSlots):
    """LoopSlots passing each sequence's tree to its PathByPath model."""

    def forward_ragged(self, slots, tokens, *, logits=None, features=None, trees=None):
        if trees is None:
            return super().forward_ragged(slots, tokens, logits=logits, features=features)
        rows = [self._models[s].forward(t, tree=tree) for s, t, tree in zip(slots, tokens, trees)]
        offsets = tuple(accumulate((r.shape[0] for r in rows), initial=0))
        return RaggedOutput(torch.cat(rows), offsets, (None,) * len(slots))


@torch.inference_mode()
def path_score(model, context: list[int], path: list[int], params: SamplingParams) -> float:
    """The draft's cumulative probability of `path` after context, decoding it one token at a time."""
    model.reset()
    logits, score = model.forward(torch.tensor(context))[-1], 1.0
    for token in path:
        score *= float(ranking_distribution(logits, params)[token])
        logits = model.forward(torch.tensor([token]))[-1]
    return score


def node_path(draft, j: int) -> list[int]:
    out = []
    while j >= 0:
        out.insert(0, int(draft.tokens[j]))
        j = draft.node_parents[j]
    return out


@pytest.mark.parametrize("params", [GREEDY, WARM], ids=["greedy", "sampled"])
def test_draft_model_trees_score_each_path_as_decoding_it(tiny_draft, params):
    drafter = ModelDrafter(PathByPath(tiny_draft.with_own_cache()), VOCAB).with_tree(TreeShape(3, 3, 2))
    drafter.begin(CONTEXT)
    draft = drafter.propose(CONTEXT, 7, params, None)
    grown = model_tree_of(drafter, CONTEXT, 7, params)
    assert grown.tokens == tuple(draft.tokens.tolist()) and draft.q is None
    assert_valid(grown, 7)
    for j in range(len(draft)):
        expected = path_score(tiny_draft.with_own_cache(), CONTEXT, node_path(draft, j), params)
        assert grown.scores[j] == pytest.approx(expected, rel=1e-4)


def model_tree_of(drafter, context, k, params):
    from specdec.drafters.model_tree import grow_model_tree

    return grow_model_tree(drafter, context, k, params)


@pytest.mark.parametrize("slots", [False, True], ids=["model", "slots"])
def test_after_a_tree_round_the_draft_model_drafts_as_a_fresh_one(tiny_target, tiny_draft, slots):
    def build():
        model = ModelDrafter(PathByPath(tiny_draft.with_own_cache()), VOCAB).with_tree(TreeShape(3, 2, 2))
        if slots:
            return SlotDrafter(DraftSlots(TreeLoopSlots(model.model.with_own_cache, 2)), VOCAB, tree=model.tree).fork()
        return model

    rng, drafter, text = random.Random(2), build(), list(CONTEXT)
    drafter.begin(text)
    for _ in range(3):
        draft = drafter.propose(text, 6, GREEDY, None)
        text = kept_round(drafter, tiny_target, text, draft, rng)
        fresh = build()
        fresh.begin(list(text))
        mine, theirs = drafter.propose(text, 6, GREEDY, None), fresh.propose(text, 6, GREEDY, None)
        assert torch.equal(mine.tokens, theirs.tokens) and mine.parents == theirs.parents


def test_a_chain_draft_model_is_unchanged_by_trees(tiny_draft):
    chain = ModelDrafter(tiny_draft.with_own_cache(), VOCAB)
    chain.begin(CONTEXT)
    draft = chain.propose(CONTEXT, 4, GREEDY, None)
    assert chain.tree is None and draft.parents is None
    assert node_path(draft, 3) == [int(t) for t in draft.tokens]
    one_branch = ModelDrafter(PathByPath(tiny_draft.with_own_cache()), VOCAB).with_tree(TreeShape(4, 1, 1))
    one_branch.begin(CONTEXT)
    assert torch.equal(one_branch.propose(CONTEXT, 4, GREEDY, None).tokens, draft.tokens)
