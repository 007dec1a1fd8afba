"""A draft model growing EAGLE-2 trees (ModelDrafter / SlotDrafter with a TreeShape).

The draft's cache holds the text but its last token (the root). Each depth the draft runs one
forward of a tree from the cache's end: row 0 the root, then every node expanded so far, each under
its parent (models' tree contract: `forward(tokens, tree=row_parents)`, `forward_ragged(...,
trees=)`); the newest frontier's rows give its children (top-`branch` of the draft's distribution,
TreeGrowth). Before each depth the cache is cut back to the text but the root, so a pass never sees
the last one's rows; the tree's rows are rebuilt each depth (depth x width rows at most: cheap next
to the verify pass, and no cross-pass ancestry is needed from the models).

After a round, commit(len(text before it)) keeps the root row (it sits at its true position) and
forgets the rest: the cache holds the text, as a chain round leaves it.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import fit_logits
from specdec.drafters.tree_shape import GrownTree, TreeGrowth, TreeShape, ranking_distribution
from specdec.sampling import SamplingParams
from specdec.transfers import token_tensor
from specdec.trees import is_chain


class ModelTree:
    """One sequence's tree in the making: its growth and which nodes have rows (the expanded ones,
    in the order they were expanded, parents first)."""

    def __init__(self, shape: TreeShape, budget: int, root: int, params: SamplingParams, vocab_size: int):
        self.growth = TreeGrowth(shape, budget)
        self.root, self.params, self.vocab_size = root, params, vocab_size
        self.expanded: list[int] = []

    def rows(self) -> tuple[list[int], tuple[int, ...] | None]:
        """This depth's pass: tokens [1 + expanded] and its row_parents (None: a chain, the rows
        are causal). The current frontier's rows are the last ones."""
        self.expanded += [n for n in self.growth.frontier if n >= 0]
        row = {node: 1 + i for i, node in enumerate(self.expanded)}
        tokens = [self.root] + [self.growth.tokens[n] for n in self.expanded]
        parents = (-1,) + tuple(row.get(self.growth.parents[n], 0) for n in self.expanded)
        return tokens, None if is_chain(parents) else parents

    def offer(self, logits: torch.Tensor) -> None:
        """The pass's logits [rows, V_draft]: its last len(frontier) rows are the frontier's."""
        frontier = self.growth.frontier
        rows = fit_logits(logits[logits.shape[0] - len(frontier):], self.vocab_size).float()
        probs = ranking_distribution(rows, self.params)
        top = torch.topk(probs, min(self.growth.shape.branch, probs.shape[-1]), dim=-1)
        values, indices = top.values.tolist(), top.indices.tolist()
        self.growth.grow([list(zip(i, v)) for i, v in zip(indices, values)])

    @property
    def done(self) -> bool:
        return not self.growth.frontier

    def result(self) -> GrownTree:
        return self.growth.result()


@torch.inference_mode()
def grow_model_tree(drafter, context: list[int], k: int, params: SamplingParams) -> GrownTree:
    """A ModelDrafter's tree of at most k nodes after context (its cache: the text but the root after)."""
    model = drafter.model
    if model.cache_len >= len(context):  # it has seen the root already: the root goes in as row 0
        model.rollback(len(context) - 1)
    unseen = context[model.cache_len:]
    if len(unseen) > 1:
        model.extend(drafter._tensor(unseen[:-1]))
    base = model.cache_len  # len(context) - 1
    tree = ModelTree(drafter.tree, k, context[-1], params, drafter.vocab_size)
    while not tree.done:
        model.rollback(base)
        tokens, parents = tree.rows()
        tree.offer(model.forward(drafter._tensor(tokens), tree=parents))
    return tree.result()


@torch.inference_mode()
def grow_slot_trees(drafters, contexts, ks, params) -> list[GrownTree]:
    """SlotDrafters of one pool: each sequence's tree, one forward_ragged a depth for all."""
    pool = drafters[0].pool.model
    slots = [d.lease.slot for d in drafters]
    for slot, context in zip(slots, contexts):
        if pool.cache_len(slot) >= len(context):  # it has seen the root already: the root goes in as row 0
            pool.rollback(slot, len(context) - 1)
    unseen = [d.lease.unseen(c) for d, c in zip(drafters, contexts)]
    behind = [i for i, u in enumerate(unseen) if u.shape[0] > 1]
    if behind:
        pool.forward_ragged([slots[i] for i in behind], [unseen[i][:-1] for i in behind], logits=[False] * len(behind))
    bases = [pool.cache_len(s) for s in slots]
    trees = [ModelTree(d.tree, k, c[-1], sp, d.vocab_size) for d, c, k, sp in zip(drafters, contexts, ks, params)]
    while True:
        live = [i for i, t in enumerate(trees) if not t.done]
        if not live:
            return [t.result() for t in trees]
        rows = [trees[i].rows() for i in live]
        for i in live:
            pool.rollback(slots[i], bases[i])
        out = pool.forward_ragged([slots[i] for i in live], [token_tensor(t, pool.device) for t, _ in rows],
                                  trees=[parents for _, parents in rows])
        for j, i in enumerate(live):
            trees[i].offer(out.logits_of(j))
