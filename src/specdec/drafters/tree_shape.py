"""How a drafter grows a draft tree (EAGLE-2's dynamic tree), and the host-side bookkeeping of one.

A drafter given a TreeShape drafts a tree a round instead of a chain: depth by depth it offers each
frontier node's `branch` most probable children, scores every candidate by its cumulative draft
probability (the product of the draft's probabilities along its path, the draft's own estimate that
the target keeps the whole path), and expands the `width` best candidates of the newest depth. At the
end it keeps the best k candidates overall (k: the round's node budget). A child's score is at most
its parent's, so the kept set is closed under ancestors.

Children are chosen deterministically (top-`branch` of the draft's warped distribution), so a tree
draft's q is None (one-hot per node): the rule is exact for it at any temperature.

Chains stay the default: a drafter drafts trees only when asked (`tree:[SHAPE:]SPEC`, registry.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from specdec.errors import DraftSpecError
from specdec.sampling import SamplingParams, warp_logits
from specdec.trees import node_depths, path_rows


@dataclass(frozen=True)
class TreeShape:
    """depth: the deepest node, in tokens past the text (>= 1).
    branch: children offered by each expanded node, its most probable tokens (>= 1).
    width: candidates expanded at each depth, the best by cumulative draft probability (>= 1).
    The node budget is not part of the shape: it is the k of each propose (the controller's plan).
    """

    depth: int = 6
    branch: int = 4
    width: int = 4

    def __post_init__(self):
        if min(self.depth, self.branch, self.width) < 1:
            raise DraftSpecError(f"a draft tree's depth, branch and width must each be at least 1, got {self}")

    @property
    def most_nodes(self) -> int:
        """The most candidates a round can grow (the budget keeps at most k of them)."""
        return self.branch + (self.depth - 1) * self.width * self.branch

    def __str__(self) -> str:
        return f"{self.depth}x{self.branch}x{self.width}"


SHAPE_SYNTAX = re.compile(r"^(\d+)x(\d+)(?:x(\d+))?$")


def parse_tree_shape(text: str) -> TreeShape:
    """`DEPTHxBRANCH[xWIDTH]` (width defaults to branch) -> TreeShape; `""` -> the default shape.

    >>> parse_tree_shape("6x4x8")
    TreeShape(depth=6, branch=4, width=8)
    """
    if not text:
        return TreeShape()
    found = SHAPE_SYNTAX.match(text)
    if found is None:
        raise DraftSpecError(f"a tree shape is DEPTHxBRANCH[xWIDTH] (e.g. 6x4 or 6x4x8), not {text!r}")
    depth, branch, width = found.groups()
    return TreeShape(int(depth), int(branch), int(width or branch))


def is_tree_shape(text: str) -> bool:
    return SHAPE_SYNTAX.match(text) is not None


@dataclass(frozen=True)
class GrownTree:
    """A tree as a drafter hands it over: tokens [n] host ints, parents [n] (-1: the root, else an
    earlier node), scores [n] each node's cumulative draft probability; topological, siblings in
    descending score. q: None when every node was chosen by rank (one-hot, rule 1); else [n, V], the
    distribution node j was drawn from (a sampled tree, SampledTreeGrowth: siblings in draw order)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    scores: tuple[float, ...]
    q: torch.Tensor | None = None


class TreeGrowth:
    """One sequence's tree while it grows (host ints and floats; the drafter runs the model).

    Each step the drafter drafts the children of every node in `frontier` (-1 is the root) and hands
    them to `grow`; when `frontier` is empty, `result()` is the tree to verify.
    budget: the most nodes kept (k). min_score: candidates below this cumulative probability are not
    kept (a head's min_confidence), except the root's best child, so a tree is never empty.
    """

    def __init__(self, shape: TreeShape, budget: int, min_score: float = 0.0):
        if budget < 1:
            raise ValueError(f"a draft tree needs a node budget of at least 1, got {budget}")
        self.shape, self.budget, self.min_score = shape, budget, min_score
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.scores: list[float] = []
        self.depths: list[int] = []
        self.frontier: list[int] = [-1]

    def _score(self, node: int) -> float:
        return 1.0 if node < 0 else self.scores[node]

    def _depth(self, node: int) -> int:
        return 0 if node < 0 else self.depths[node]

    def grow(self, offered: list[list[tuple[int, float]]]) -> list[int]:
        """offered[j]: (token, draft probability) of frontier[j]'s children, most probable first.
        Adds them as candidates and picks the next frontier; returns the new nodes."""
        if len(offered) != len(self.frontier):
            raise ValueError(f"children for {len(offered)} nodes offered, the frontier has {len(self.frontier)}")
        new = []
        for parent, children in zip(self.frontier, offered):
            for token, prob in children[:self.shape.branch]:
                score = self._score(parent) * prob
                if score <= 0.0 or (score < self.min_score and (self.tokens or parent >= 0)):
                    continue
                new.append(self._add(token, parent, score))
        self.frontier = self._next_frontier(new)
        return new

    def _add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.scores.append(score)
        self.depths.append(self._depth(parent) + 1)
        return len(self.tokens) - 1

    def _next_frontier(self, new: list[int]) -> list[int]:
        """The `width` best new nodes, unless at full depth; a node already outside the best `budget`
        candidates is never expanded (its descendants score no higher, so none would be kept)."""
        if not new or self.depths[new[0]] >= self.shape.depth:
            return []
        kept = set(self._ranked()[:self.budget])
        best = sorted(new, key=lambda n: (-self.scores[n], n))[:self.shape.width]
        return [n for n in best if n in kept]

    def _ranked(self) -> list[int]:
        return ranked(self.scores, self.depths)

    def result(self) -> GrownTree:
        """The best `budget` candidates, depth by depth, siblings in descending score."""
        return keep_best(self.tokens, self.parents, self.scores, self.budget)

    def path(self, node: int) -> list[int]:
        """The candidates from the root's child down to `node`."""
        return path_rows(self.parents, node)  # over node parents: the root (-1) ends the walk


class SampledTreeGrowth(TreeGrowth):
    """One sequence's sampled tree while it grows: each expanded node's children are up to `branch`
    distinct tokens drawn from the draft's distribution there without replacement (each from what the
    earlier ones left), all of them kept, so the rule's multi-step test is exact for them at any
    temperature (tree_rule), each judged with the distribution it was drawn from.

    What the draws decide is only which nodes are expanded later, never which drawn children are
    kept or in what order they are judged: a node is expanded (its children drawn) when it is among
    the `width` best new nodes by cumulative draft probability, above min_score, and its `branch`
    children fit the budget.
    """

    def __init__(self, shape: TreeShape, budget: int, min_score: float = 0.0):
        super().__init__(shape, budget, min_score)
        self.draws = min(shape.branch, budget)  # children to draw for each frontier node, at most

    def grow(self, offered: list[list[tuple[int, float]]]) -> list[int]:
        """offered[j]: the (token, draft probability) pairs drawn for frontier[j], 1 to `draws` distinct
        tokens (fewer where the distribution has fewer), in draw order. Keeps all of them and picks the
        next frontier; returns the new nodes."""
        if len(offered) != len(self.frontier) or any(not 0 < len(o) <= self.draws for o in offered):
            raise ValueError(f"sampled children {[len(o) for o in offered]} drawn, 1 to {self.draws} for each "
                             f"of {len(self.frontier)} nodes asked for")
        if any(len({token for token, _ in o}) != len(o) for o in offered):
            raise ValueError("sampled children are drawn without replacement: a node's tokens are distinct")
        new = [self._add(token, parent, self._score(parent) * prob)
               for parent, children in zip(self.frontier, offered) for token, prob in children]
        self.frontier = self._expandable(new)
        self.draws = self.shape.branch
        return new

    def _expandable(self, new: list[int]) -> list[int]:
        """The `width` best new nodes whose children fit the budget, unless at full depth."""
        if not new or self.depths[new[0]] >= self.shape.depth:
            return []
        room = (self.budget - len(self.tokens)) // self.shape.branch
        best = sorted((n for n in new if self.scores[n] >= self.min_score), key=lambda n: (-self.scores[n], n))
        return best[:min(self.shape.width, room)]

    def result(self) -> GrownTree:
        """Every drawn node, depth by depth (as drawn: the draws are topological already)."""
        return GrownTree(tuple(self.tokens), tuple(self.parents), tuple(self.scores))


def ranked(scores, depths) -> list[int]:
    """Every node, best score first; on equal scores the shallower first, then the earlier, so with
    scores that never grow from parent to child each node comes after its ancestors (any prefix of
    the ranking is closed under ancestors)."""
    return sorted(range(len(scores)), key=lambda n: (-scores[n], depths[n], n))


def keep_best(tokens, parents, scores, budget: int) -> GrownTree:
    """The best `budget` nodes of a tree (scores never growing from parent to child) as a GrownTree:
    depth by depth, siblings in descending score, parents renumbered."""
    depths = node_depths(parents)
    kept = sorted(ranked(scores, depths)[:budget], key=lambda n: (depths[n], -scores[n], n))
    return _renumbered(kept, tokens, parents, scores)


def merge_trees(first: GrownTree, second: GrownTree, budget: int) -> GrownTree:
    """One tree of at most `budget` nodes from two trees over the same root, merged as a trie (a
    path both hold is one path): first's nodes before second's, each tree's in its ranking, so the
    kept set is closed under ancestors. Siblings: first's before second's, each in its ranking;
    a node's score is the one of the tree that brought it first."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    at: dict[tuple[int, int], int] = {}  # (parent, token) -> merged node
    for tree in (first, second):
        where: dict[int, int] = {}  # the tree's node -> merged node
        for n in ranked(tree.scores, node_depths(tree.parents)):
            parent = tree.parents[n]
            if parent >= 0 and parent not in where:  # its parent did not fit the budget
                continue
            key = (where.get(parent, -1), tree.tokens[n])
            if key not in at:
                if len(tokens) == budget:
                    continue
                at[key] = len(tokens)
                tokens.append(tree.tokens[n])
                parents.append(key[0])
                scores.append(tree.scores[n])
            where[n] = at[key]
    depths = node_depths(parents)
    return _renumbered(sorted(range(len(tokens)), key=lambda n: (depths[n], n)), tokens, parents, scores)


def append_tree(first: GrownTree, second: GrownTree) -> GrownTree:
    """second's nodes after first's, as siblings of first's where they share a parent (no merging:
    second is a sampled tree, whose every draw must stay; first's nodes are one-hot in q)."""
    if not first.tokens or not second.tokens:
        return second if first.tokens == () else first
    if second.q is None:
        raise ValueError("append_tree appends a sampled tree (q given); merge_trees merges ranked ones")
    offset = len(first.tokens)
    vocab = second.q.shape[-1]
    first_q = torch.nn.functional.one_hot(torch.tensor(first.tokens, device=second.q.device), vocab).to(second.q.dtype)
    return GrownTree(first.tokens + second.tokens,
                     first.parents + tuple(p if p < 0 else p + offset for p in second.parents),
                     first.scores + second.scores, torch.cat([first_q, second.q]))


def _renumbered(order: list[int], tokens, parents, scores) -> GrownTree:
    """The nodes `order` names (a topological order, closed under ancestors), renumbered in it."""
    index = {node: i for i, node in enumerate(order)}
    return GrownTree(tuple(tokens[n] for n in order), tuple(-1 if parents[n] < 0 else index[parents[n]] for n in order),
                     tuple(scores[n] for n in order))


def ranking_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The draft's distribution a node's children are ranked and scored by, logits [..., V] -> [..., V]:
    the warped one when sampling (rule 3), the plain softmax when greedy (the draft's confidence;
    warp_logits would be one-hot)."""
    return torch.softmax(logits.float(), -1) if params.greedy else warp_logits(logits, params)
