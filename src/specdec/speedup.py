"""What speculation should buy, from acceptance rate alpha, K and cost ratio c (Leviathan et al. 2023).

With each draft kept independently with probability alpha, a round of K drafts emits
tau = (1 - alpha^(K+1)) / (1 - alpha) tokens on average (the kept prefix plus one recovered or
bonus token). The round costs K draft steps and one target verify step, K*c + 1 in units of a
target step, against tau target steps for plain decoding: speedup = tau / (K*c + 1).
The verify step is taken to cost one target step; `verify_cost` lets a measured ratio replace that.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import InvalidRequestError


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """tau: mean tokens emitted per round."""
    _check(alpha, k)
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Speedup over plain decoding: tau / (K*c + verify_cost)."""
    if c < 0:
        raise InvalidRequestError(f"c (draft step / target step) must be >= 0, got {c}")
    return expected_tokens_per_round(alpha, k) / (k * c + verify_cost)


@dataclass(frozen=True)
class KChoice:
    k: int
    tokens_per_round: float
    speedup: float


def speedup_table(alpha: float, c: float, k_max: int = 16) -> list[KChoice]:
    """Expected tau and speedup for K = 1..k_max."""
    return [
        KChoice(k, expected_tokens_per_round(alpha, k), expected_speedup(alpha, k, c))
        for k in range(1, k_max + 1)
    ]


def best_k(alpha: float, c: float, k_max: int = 16) -> KChoice:
    """The K with the highest expected speedup (the smallest such K on ties)."""
    return max(speedup_table(alpha, c, k_max), key=lambda row: (row.speedup, -row.k))


def _check(alpha: float, k: int) -> None:
    if not (0.0 <= alpha <= 1.0):
        raise InvalidRequestError(f"alpha must be in [0, 1], got {alpha}")
    if k < 1:
        raise InvalidRequestError(f"K must be >= 1, got {k}")


@dataclass(frozen=True)
class TreePlan:
    """A draft tree's shape chosen for a rank profile: node j's parent (-1: the root), its sibling rank,
    and its value, the chance that its path is kept. Nodes are in the order they were chosen, which is
    topological, siblings by rank."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def expected_tokens(self) -> float:
        """tau of a round: the kept nodes' expected count, plus the one recovered or bonus token."""
        return 1.0 + sum(self.values)


def best_tree(profile: tuple[float, ...], nodes: int, max_depth: int = 16) -> TreePlan:
    """The tree of at most `nodes` nodes (depth at most max_depth) that keeps the most tokens in
    expectation when, at every depth independently, the target's next token is the draft's sibling of
    rank i with probability profile[i] (and none of them with 1 - sum(profile)). A node's value is the
    product of its path's rank probabilities; the nodes are taken best value first from the frontier of
    the tree so far (a child is worth at most its parent, so the best set is closed under ancestors:
    EAGLE-2's selection with calibrated probabilities). A chain is profile (alpha,): tau as
    expected_tokens_per_round(alpha, nodes)."""
    if nodes < 0 or not profile or any(p < 0 for p in profile) or sum(profile) > 1 + 1e-9:
        raise InvalidRequestError(f"a rank profile needs probabilities summing to at most 1, got {profile}")
    import heapq

    frontier = [(-profile[0], 0, -1, 0, 1)]  # (-value, tie order, parent, rank, depth)
    order = 1
    parents, ranks, values, depth_of = [], [], [], []
    while frontier and len(parents) < nodes:
        neg, _, parent, rank, depth = heapq.heappop(frontier)
        node = len(parents)
        parents.append(parent), ranks.append(rank), values.append(-neg), depth_of.append(depth)
        if rank + 1 < len(profile):  # its next sibling
            heapq.heappush(frontier, (neg / profile[rank] * profile[rank + 1] if profile[rank] else 0.0, order,
                                      parent, rank + 1, depth))
            order += 1
        if depth < max_depth:  # its first child
            heapq.heappush(frontier, (neg * profile[0], order, node, 0, depth + 1))
            order += 1
    return TreePlan(tuple(parents), tuple(ranks), tuple(values))
