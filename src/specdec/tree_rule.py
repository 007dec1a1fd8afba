"""The multi-candidate rule over a draft tree (rule 7 of the design; SpecInfer, Miao et al. 2024).

Notation as in verify.py: p is the target's probability vector at a row of the verify pass, q the
draft's. The walk starts at the root row (the text's newest token). At a row, its children are tried
in node order: child c, token x drawn from q_c, is kept with probability min(1, r(x) / q_c(x)), where
r starts as the row's p and, after each rejected child, becomes the residual max(0, r - q_c)
renormalised. The first kept child is where the walk goes on. If every child is rejected the next
token is drawn from r (recovered); at a row without children, from its p (bonus).

- A child chosen deterministically (top-k, lookup; Draft.q None) has q_c one-hot on x: it is kept with
  probability r(x), and a rejection removes x's mass from r.
- Children drawn one after another each carry the distribution they were drawn from as their row:
  the same q for i.i.d. draws (with replacement), or q less the earlier siblings' tokens, renormalised,
  for draws without replacement (the head's). Each child's test is then a speculative step from r with
  the child's own proposal, so the multi-step rule is exact for either.
- Greedy (temperature 0): follow the child equal to the target's argmax; the argmax where none is.

Each emitted token then follows p exactly. A chain is the tree with one child a row, and the rule is
verify.py's there; the engine settles chains with verify.py (its draws) and trees here.

How it runs: everything the walk could need is computed on the device in one go, and read with the
step's one copy: for every node, whether it would be kept when its turn comes (its uniform against the
residual its earlier siblings leave), and for every row one draw from the distribution it would end
with (its residual after all its children, or p). The host then walks the tree on those values. Each
row is reached at most once, and its draw is independent of the tests that reach it, so taking every
row's draw up front changes no probability. Draws per sequence, from its own generator, in a fixed
order (the uniforms, then the rows' draws), so a seed reproduces a round whatever shares the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling import sample
from specdec.trees import children_of, node_depths
from specdec.verify import Verdict, residual


@dataclass(frozen=True)
class TreeVerdict(Verdict):
    """How a tree round ended: the kept nodes `path` (the root's child first; num_accepted of them) of
    the tree of `nodes` and `parents`, then next_token. leaf: the path ends at a node without children, so next_token is a bonus drawn
    from p (else a recovered token). judged: the children the rule tried (kept or rejected)."""

    path: tuple[int, ...] = ()
    nodes: tuple[int, ...] = ()  # every node's token
    parents: tuple[int, ...] = ()  # every node's parent (Draft.parents)
    leaf: bool = False
    judged: int = 0
    depth: int = 0  # the tree's deepest node's depth (the root's children are at 1)

    @property
    def all_accepted(self) -> bool:
        return self.leaf

    @property
    def num_judged(self) -> int:
        return self.judged

    @property
    def positions(self) -> int:
        return self.depth

    @property
    def rows(self) -> list[int]:
        """The verify rows that became text: the root row, then each kept node's (node j is row j + 1)."""
        return [0] + [j + 1 for j in self.path]


def q_row_of(parents: Sequence[int]) -> list[int]:
    """The row of the draft's q that node j was drawn from: its own (Draft.q's layout)."""
    return list(range(len(parents)))


def next_residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What r becomes after a child drawn from q is rejected: max(0, r - q) renormalised. [m, V]."""
    return residual(r, q)


def exhausted(r: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The distribution a row's next token is drawn from once every child is rejected: its last residual."""
    return r


def tree_values(p: torch.Tensor, tokens: torch.Tensor, parents: Sequence[int], q: torch.Tensor | None,
                greedy: bool, generator: torch.Generator | None) -> torch.Tensor:
    """The rule's device work for one tree round, as one long tensor for the host's read (walk).

    p: [n + 1, V] the target's warped probabilities (greedy: any scores, only their argmax is read),
    row 0 the root, row j + 1 node j. tokens: [n] long. parents: [n] host ints (Draft.parents).
    q: [n, V] the rows node j was drawn from, or None (every node one-hot). Returns [3n + 1]:
    kept [n] (0/1; greedy: the argmax of each node's row instead, and row 0's in front),
    a draw for each row [n + 1], the tokens [n]. Greedy: [argmax of the n + 1 rows, zeros [n], tokens].
    """
    n = tokens.shape[0]
    if greedy:
        return torch.cat([p.argmax(-1), torch.zeros_like(tokens), tokens])
    kids = children_of(parents)
    q_rows = q_row_of(parents)
    u = torch.rand(n, generator=generator, device=p.device)  # [n], one per node, in node order
    kept = torch.zeros(n, dtype=torch.bool, device=p.device)
    r = p.clone()  # [n + 1, V] each row's residual so far
    for rank in range(max((len(k) for k in kids), default=0)):
        rows = [row for row, k in enumerate(kids) if len(k) > rank]
        nodes = [kids[row][rank] for row in rows]
        at, of = _index(rows, p.device), _index(nodes, p.device)
        q_c = _q_of(q, [q_rows[c] for c in nodes], tokens, of, p)  # [m, V]
        x = tokens.index_select(0, of)  # [m]
        picked = torch.arange(len(nodes), device=p.device)
        r_rows = r.index_select(0, at)
        kept[of] = u.index_select(0, of) * q_c[picked, x] < r_rows[picked, x]
        r[at] = next_residual(r_rows, q_c)
    draws = sample(exhausted(r, p), generator)  # [n + 1]
    return torch.cat([kept.long(), draws, tokens])


def _index(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long).to(device, non_blocking=True)


def _q_of(q: torch.Tensor | None, rows: list[int], tokens: torch.Tensor, nodes: torch.Tensor,
          p: torch.Tensor) -> torch.Tensor:
    """The q each of these nodes was drawn from, [m, V]: its row of q, or one-hot on its token."""
    if q is not None:
        return q.index_select(0, _index(rows, q.device))
    return torch.zeros(nodes.shape[0], p.shape[1], dtype=p.dtype, device=p.device).scatter_(
        1, tokens.index_select(0, nodes)[:, None], 1.0)


def walk(values: Sequence[int], parents: Sequence[int], greedy: bool) -> tuple[TreeVerdict, list[int]]:
    """The host's walk over tree_values read back: (verdict, the kept nodes' tokens)."""
    n = len(parents)
    tokens = list(values[2 * n + 1:])
    kids = children_of(parents)
    path, row, judged = [], 0, 0
    while True:
        taken = None
        for c in kids[row]:
            judged += 1
            keep = tokens[c] == values[row] if greedy else values[c] == 1
            if keep:
                taken = c
                break
        if taken is None:
            break
        path.append(taken)
        row = taken + 1
    next_token = values[row] if greedy else values[n + row]
    verdict = TreeVerdict(num_accepted=len(path), next_token=int(next_token), num_drafted=n, path=tuple(path),
                          nodes=tuple(tokens), parents=tuple(parents), leaf=not kids[row], judged=judged, depth=max(node_depths(parents), default=0))
    return verdict, [tokens[c] for c in path]


def settle_tree(p: torch.Tensor, tokens: torch.Tensor, parents: Sequence[int], q: torch.Tensor | None,
                greedy: bool, generator: torch.Generator | None = None) -> tuple[TreeVerdict, list[int]]:
    """One tree round settled at once (tree_values, then walk): (verdict, kept tokens)."""
    values = tree_values(p, tokens, parents, q, greedy, generator).tolist()
    return walk(values, parents, greedy)
