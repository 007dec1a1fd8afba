"""The audit's statistics: two-sample tests, the correction across prompts, and the power statement.

An outcome is what a completion began with: its first token, or the tuple of its first m tokens
(token strings where the server returns logprobs, else pieces of text). Two samples of outcomes,
one from each server, are tested for coming from one distribution:

- chi-square of homogeneity on a 2 x columns table, outcomes expected fewer than `min_expected`
  times in a cell pooled into one column (scipy's chi2_contingency);
- a permutation test: the statistic is the total-variation distance between the two empirical
  distributions of the first j tokens, summed over j = 1..m; its p-value is the share of random
  relabellings of the pooled sample (seeded) whose statistic is at least the observed one. It makes
  no large-sample assumption, so it stays valid with many rare outcomes.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Sequence

import numpy as np


def chi2_homogeneity(a: Sequence[Hashable], b: Sequence[Hashable], min_expected: float = 5.0) -> tuple[float, int]:
    """p-value that samples a and b share one distribution, and the table's columns after pooling."""
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    smaller_share = min(len(a), len(b)) / (len(a) + len(b))
    kept, pool = [], [0, 0]
    for outcome in sorted(set(ca) | set(cb), key=lambda o: (ca[o] + cb[o], repr(o))):
        column = [ca[outcome], cb[outcome]]
        target = kept if smaller_share * sum(column) >= min_expected else pool
        if target is pool:
            pool[0], pool[1] = pool[0] + column[0], pool[1] + column[1]
        else:
            kept.append(column)
    if sum(pool):
        if kept and smaller_share * sum(pool) < min_expected:
            kept[0] = [kept[0][0] + pool[0], kept[0][1] + pool[1]]  # still rare: join the smallest column
        else:
            kept.append(pool)
    if len(kept) < 2:
        return 1.0, len(kept)  # one column: both samples put all their mass on it
    table = np.array(kept).T  # [2, columns]
    return float(chi2_contingency(table).pvalue), len(kept)


def permutation_test(a: Sequence[tuple], b: Sequence[tuple], m: int, permutations: int = 2000,
                     seed: int = 0) -> float:
    """p-value of sum_j TV(first j tokens of a, first j tokens of b), j = 1..m, by relabelling."""
    pooled = list(a) + list(b)
    n, na = len(pooled), len(a)
    if na == 0 or na == n:
        return 1.0
    rng = np.random.default_rng(seed)
    # Row 0 is the observed labelling; the others are random relabellings. [B + 1, n]
    order = np.vstack([np.arange(n), rng.permuted(np.tile(np.arange(n), (permutations, 1)), axis=1)])
    stat = np.zeros(permutations + 1)
    for j in range(1, m + 1):
        codes = _codes([tuple(s[:j]) for s in pooled])  # [n]
        c = int(codes.max()) + 1
        rows = np.repeat(np.arange(permutations + 1), na)
        in_a = np.bincount(rows * c + codes[order[:, :na]].ravel(), minlength=(permutations + 1) * c)
        in_a = in_a.reshape(permutations + 1, c)  # [B + 1, c]
        in_b = np.bincount(codes, minlength=c)[None, :] - in_a
        stat += 0.5 * np.abs(in_a / na - in_b / (n - na)).sum(axis=1)
    return float((1 + np.sum(stat[1:] >= stat[0] - 1e-12)) / (permutations + 1))


def _codes(items: list) -> np.ndarray:
    index: dict = {}
    return np.array([index.setdefault(item, len(index)) for item in items], dtype=np.int64)


def adjust(p_values: Sequence[float], method: str) -> list[float]:
    """Adjusted p-values: "holm" (family-wise error) or "bh" (Benjamini-Hochberg, false discovery rate)."""
    n = len(p_values)
    order = sorted(range(n), key=lambda i: p_values[i])
    adjusted = [1.0] * n
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (n - rank) * p_values[i]))
            adjusted[i] = running
    elif method == "bh":
        running = 1.0
        for rank in range(n - 1, -1, -1):
            i = order[rank]
            running = min(running, n * p_values[i] / (rank + 1))
            adjusted[i] = min(1.0, running)
    else:
        raise ValueError(f"unknown correction {method!r}; use holm or bh")
    return adjusted


def min_detectable_tv(n_a: int, n_b: int, level: float, power: float = 0.8) -> float:
    """The smallest total-variation distance the run would detect with probability `power`.

    Two distributions at TV distance d differ by d on some event (the tokens where one is more likely).
    A two-sample test of that event's frequency at significance `level` (two-sided, normal
    approximation, the worst case of a 50% base rate) reaches `power` once d is at least this value.
    """
    from scipy.stats import norm

    if n_a < 1 or n_b < 1:
        return 1.0
    z = norm.ppf(1 - level / 2) + norm.ppf(power)
    return min(1.0, z * math.sqrt(0.25 * (1 / n_a + 1 / n_b)))


def logprob_tv(a: dict[str, float], b: dict[str, float]) -> float:
    """TV distance between two next-token distributions known by their top logprobs: a token one side
    does not list counts as 0 there, and the mass outside the listed tokens as one more outcome."""
    pa = {t: math.exp(v) for t, v in a.items()}
    pb = {t: math.exp(v) for t, v in b.items()}
    listed = sum(abs(pa.get(t, 0.0) - pb.get(t, 0.0)) for t in set(pa) | set(pb))
    rest = abs(max(0.0, 1 - sum(pa.values())) - max(0.0, 1 - sum(pb.values())))
    return 0.5 * (listed + rest)
