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
