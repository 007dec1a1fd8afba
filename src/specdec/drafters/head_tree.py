"""The draft head growing EAGLE-2 dynamic trees (HeadDrafter with a TreeShape), many sequences at once.

Depth by depth, the head runs once over every sequence's frontier nodes: node n of depth d reads the
pair (its parent's predicted feature, its token) at position text + d - 1, exactly as drafting its
path as a chain would. Its key and value go to a scratch entry of its sequence's head cache past the
true pairs (the next free one), and it attends to the true pairs and to its own path's entries only
(a tree mask over the head's own cache). The scratch entries sit where the next round's true pairs
go, so the next catch-up overwrites them: after a round the head's cache is right with no rollback.

Greedy, children are the top-`branch` tokens of each node's softmax over the head's sub-vocabulary,
scored by cumulative probability (TreeGrowth); nothing is sampled and q is None. Sampling, they are
up to `branch` distinct tokens drawn without replacement from the warped distribution (rule 3) with the
sequence's own generator, every draw kept (SampledTreeGrowth), and q holds the distribution each child
was drawn from (the node's, less its earlier siblings): the multi-step rule is exact for such children,
and none of them repeats a sibling, which a rejected sibling's residual would always reject.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.models.llama_net import rope_tables
from specdec.drafters.tree_shape import GrownTree, SampledTreeGrowth, TreeGrowth, ranking_distribution
from specdec.errors import InvalidRequestError
from specdec.models.cpu_matrix import linear
from specdec.sampling import SamplingParams, sample_distinct


class _Grower:
    """One sequence's tree in the making: its growth, and each expanded node's predicted feature
    [D] (the root's: the head's prediction after the true text) and scratch cache entry."""

    def __init__(self, drafter, k: int, params: SamplingParams, generator: torch.Generator | None):
        self.drafter, self.params, self.generator = drafter, params, generator
        grows = TreeGrowth if params.greedy else SampledTreeGrowth
        self.growth = grows(drafter.tree, k, drafter.min_confidence)
        self.feature: dict[int, torch.Tensor] = {-1: drafter._last_true}
        self.entry: dict[int, int] = {}  # node -> index of its key/value in the head cache
        self.q: list[torch.Tensor] = []  # sampled: each depth's nodes' distributions [n, V], in node order

    def result(self) -> GrownTree:
        tree = self.growth.result()
        return dataclasses.replace(tree, q=torch.cat(self.q)) if self.q else tree

    def rows(self) -> tuple[list[int], list[int]]:
        """The frontier's scratch entries (assigned now) and its positions."""
        n, growth = self.drafter._num_feats, self.growth
        for node in growth.frontier:
            self.entry[node] = n + len(self.entry)
        return [self.entry[m] for m in growth.frontier], [n + growth.depths[m] - 1 for m in growth.frontier]

    def mask(self, end: int) -> torch.Tensor:
        """[F, end] bool: frontier node j sees the true pairs and its own path's entries."""
        mask = torch.zeros(len(self.growth.frontier), end, dtype=torch.bool)
        mask[:, :self.drafter._true_pairs] = True
        for j, node in enumerate(self.growth.frontier):
            mask[j, [self.entry[m] for m in self.growth.path(node)]] = True
        return mask.to(self.drafter.device)


@torch.inference_mode()
def grow_head_trees(drafters, ks, params, generators) -> list[GrownTree]:
    """drafters[i] (HeadDrafters of one head, each with a tree shape, caught up on the text) grows a
    tree of at most ks[i] nodes, all in one head pass a depth; a sampling one draws with generators[i]."""
    growers = [_Grower(d, k, sp, g) for d, k, sp, g in zip(drafters, ks, params, generators)]
    _offer_children(growers, [[-1] for _ in growers])
    while True:
        live = [g for g in growers if g.growth.frontier]
        if not live:
            return [g.result() for g in growers]
        frontiers = [list(g.growth.frontier) for g in live]
        for g, feats in zip(live, _run_frontiers(live)):
            g.feature.update(zip(g.growth.frontier, feats))
        _offer_children(live, frontiers)


def _run_frontiers(growers: list[_Grower]) -> list[torch.Tensor]:
    """Every grower's frontier nodes through the head layer -> their predicted features [F_i, D]."""
    first = growers[0].drafter
    head, c, parts = first.head, first.c, first.parts
    feats, tokens, positions, entries, counts = [], [], [], [], []
    for g in growers:
        frontier = g.growth.frontier
        feats += [g.feature[g.growth.parents[n]] for n in frontier]
        tokens += [g.growth.tokens[n] for n in frontier]
        rows, where = g.rows()
        entries.append(rows)
        positions += where
        counts.append(len(frontier))
    flat = torch.tensor(tokens, device=first.device)
    x, a = head.layer_inputs(torch.stack(feats)[None], first.embed[flat][None].float())  # [1, T, D], [1, T, D or 2D]
    cos, sin = rope_tables(torch.tensor(positions, device=first.device), c.head_dim, c.rope_theta)
    q, k, v = head.layer.project(a, cos, sin)  # [1, H or Hkv, T, hd]
    attended, row = [], 0
    for g, rows, n in zip(growers, entries, counts):
        d, end = g.drafter, max(rows) + 1
        if end > d._k.shape[2]:
            raise InvalidRequestError(f"the draft head's cache holds {d._k.shape[2]} positions, too few for the "
                                      "text and a draft tree: use a shorter prompt or a smaller tree")
        index = torch.tensor(rows, device=d.device)
        d._k[:, :, index], d._v[:, :, index] = k[:, :, row:row + n], v[:, :, row:row + n]
        attended.append(head.layer.attend(q[:, :, row:row + n], d._k[:, :, :end], d._v[:, :, :end], g.mask(end)))
        row += n
    out = head.layer.after_attention(x, torch.cat(attended, dim=2))  # [1, T, D]
    predicted = head.carry(out[0], parts)  # [T, D]
    return list(predicted.split(counts))


def _offer_children(growers: list[_Grower], frontiers: list[list[int]]) -> None:
    """Each grower's frontiers[i] nodes (features known) get their children, top-`branch` or drawn:
    one logits pass for all, one host read for the ranked and one per sampling grower."""
    first = growers[0].drafter
    hs = torch.stack([g.feature[n] for g, nodes in zip(growers, frontiers) for n in nodes])  # [R, D]
    logits = linear(first.head.readout(hs), first.lm_sub)  # [R, N]
    owners = [g for g, nodes in zip(growers, frontiers) for _ in nodes]
    probs = torch.stack([ranking_distribution(row, g.params) for row, g in zip(logits, owners)])  # [R, N]
    widest = min(max(g.drafter.tree.branch for g in growers), probs.shape[-1])
    ranked = any(g.params.greedy for g in growers)
    top = torch.topk(probs, widest, dim=-1) if ranked else None
    values, indices = (top.values.tolist(), top.indices.tolist()) if ranked else ([], [])  # one host read
    vocab = first.vocab_list
    start = 0
    for g, nodes in zip(growers, frontiers):
        rows = range(start, start + len(nodes))
        if g.params.greedy:
            g.growth.grow([[(vocab[i], p) for i, p in zip(indices[r], values[r])] for r in rows])
        else:
            g.growth.grow(_draw_children(g, probs[start:start + len(nodes)]))
        start += len(nodes)


def _draw_children(g: _Grower, probs: torch.Tensor) -> list[list[tuple[int, float]]]:
    """The children of g's frontier (its rows of probs [F, N]): up to `draws` distinct tokens from each
    row with g's generator, without replacement (sampling.sample_distinct; fewer where a row has fewer
    tokens). Child i's q row (over the target's vocabulary) is the distribution it was drawn from, the
    row less its earlier siblings, noted in node order; its score uses the row's own probability of it."""
    drafter = g.drafter
    picks, live, conditionals = sample_distinct(probs, g.growth.draws, g.generator)
    g.q.append(drafter.target_q(conditionals[live]))  # [live children, V]
    rows = zip(picks.tolist(), probs.gather(1, picks).tolist())  # two host reads: a pick is live iff p > 0
    vocab = drafter.vocab_list
    return [[(vocab[i], p) for i, p in zip(*row) if p > 0] for row in rows]
