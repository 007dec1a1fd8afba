"""Speculation that never loses: how many drafts each sequence verifies at each step, 0 included.

A step of the batched engine runs one target pass over every decoding sequence's K_i + 1 rows.
Its expected yield is sum_i tau(a_i, K_i) tokens, tau(a, K) = (1 - a^(K+1)) / (1 - a)
(specdec.speedup), and its cost is the target pass over those rows (a measured verify-cost table
over batch size and rows per sequence) plus the drafter's cost per drafted token. The auto policy
picks the K_i that maximise tokens per second of the whole batch, greedily: from all K_i = 0 (a
plain step) it adds the one draft that raises the batch's rate most, until none does. So under its
own model a step is never predicted slower than plain decoding. K only changes how many drafts are
verified, never which tokens come out (the rejection rule keeps the output the target's).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.errors import InvalidRequestError
from specdec.speedup import expected_tokens_per_round

MODES = ("request", "fixed", "auto")


@dataclass(frozen=True)
class VerifyCostTable:
    """Seconds of one target pass, measured at batch sizes x rows per sequence.

    seconds[i][j]: the pass over batch_sizes[i] sequences of rows_per_seq[j] rows each. Between and
    beyond the measured points it is linear in both (extrapolated from the last two points)."""

    batch_sizes: tuple[int, ...]
    rows_per_seq: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        for name, axis in (("batch_sizes", self.batch_sizes), ("rows_per_seq", self.rows_per_seq)):
            if not axis or list(axis) != sorted(set(axis)) or axis[0] < 1:
                raise InvalidRequestError(f"verify cost {name} must be distinct increasing ints >= 1, got {axis}")
        if len(self.seconds) != len(self.batch_sizes) or any(len(r) != len(self.rows_per_seq) for r in self.seconds):
            raise InvalidRequestError("verify cost seconds must be [len(batch_sizes)][len(rows_per_seq)]")
        if any(s <= 0 for row in self.seconds for s in row):
            raise InvalidRequestError("verify cost seconds must be > 0")

    @classmethod
    def from_rows(cls, points: Sequence[tuple[int, float]]) -> "VerifyCostTable":
        """A batch-1 curve [(rows, seconds)]: at b sequences a pass costs b times one sequence's."""
        rows, secs = zip(*sorted(points))
        return cls((1, 2), tuple(rows), (tuple(secs), tuple(2 * s for s in secs)))

    def cost(self, num_seqs: int, total_rows: int) -> float:
        """Seconds of a pass over num_seqs sequences bringing total_rows rows in all."""
        per_seq = total_rows / num_seqs
        along_rows = [_interpolate(self.rows_per_seq, row, per_seq) for row in self.seconds]
        return max(_interpolate(self.batch_sizes, along_rows, num_seqs), 1e-12)


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), extended linearly past both ends; a constant for one point."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return ys[i] + slope * (x - xs[i])


@dataclass(frozen=True)
class SpeculationPolicy:
    """How many drafts each sequence verifies per step.

    mode "request": each request's GenerationConfig.k (the engine's behaviour before policies).
    mode "fixed": k for every sequence. mode "auto": 0..k per sequence per step, chosen to maximise
    the batch's expected tokens per second (choose_ks). prior_accepted / prior_rejected: the Beta
    prior of a sequence's acceptance rate before it has drafted (a mean of 0.5 over 2 pseudo-drafts
    by default). verify_cost: the target's cost table; None: the engine measures it at start-up.
    draft_seconds_per_token: the drafter's cost per drafted token before the engine has timed it.
    min_gain: a step speculates only when its predicted rate beats plain's by this fraction (the
    cost model is measured, so a prediction within its error is no reason to risk being slower)."""

    mode: str = "request"
    k: int = 4
    prior_accepted: float = 1.0
    prior_rejected: float = 1.0
    verify_cost: VerifyCostTable | None = None
    draft_seconds_per_token: float = 0.0
    min_gain: float = 0.05

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequestError(f"speculation mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.k < (1 if self.mode == "auto" else 0):
            raise InvalidRequestError(f"speculation k must be >= {1 if self.mode == 'auto' else 0} "
                                      f"in mode {self.mode}, got {self.k}")
        if self.prior_accepted <= 0 or self.prior_rejected <= 0:
            raise InvalidRequestError("the acceptance prior's pseudo-counts must be > 0")
        if self.draft_seconds_per_token < 0 or self.min_gain < 0:
            raise InvalidRequestError("draft_seconds_per_token and min_gain must be >= 0")

    @classmethod
    def auto(cls, k_max: int = 8, **kwargs) -> "SpeculationPolicy":
        return cls(mode="auto", k=k_max, **kwargs)

    @classmethod
    def fixed(cls, k: int) -> "SpeculationPolicy":
        return cls(mode="fixed", k=k)

    def acceptance(self, accepted: int, drafted: int) -> float:
        """The posterior mean of a sequence's acceptance rate from its own counts."""
        return (accepted + self.prior_accepted) / (drafted + self.prior_accepted + self.prior_rejected)


def policy_from_flag(text: str | None, k_max: int) -> SpeculationPolicy:
    """`--speculation auto|K`: auto picks 0..k_max drafts per sequence per step, K fixes it for every
    sequence; None keeps each request's own k (SpeculationPolicy())."""
    if text is None:
        return SpeculationPolicy()
    if text == "auto":
        return SpeculationPolicy.auto(k_max=k_max)
    if not text.isdigit() or int(text) < 1:
        raise InvalidRequestError(f"--speculation must be auto or a whole number K >= 1, got {text!r}")
    return SpeculationPolicy.fixed(int(text))


def tokens_at(alpha: float, k: int) -> float:
    """tau: expected tokens of a step with k drafts (1 for a plain step)."""
    return 1.0 if k == 0 else expected_tokens_per_round(alpha, k)


@dataclass(frozen=True)
class StepPlan:
    """A chosen step: K per decoding sequence and what the model predicts of it."""

    ks: tuple[int, ...]
    predicted_tokens: float
    predicted_seconds: float
    plain_seconds: float  # the same batch with every K = 0

    @property
    def predicted_tokens_per_second(self) -> float:
        return self.predicted_tokens / self.predicted_seconds

    @property
    def plain_tokens_per_second(self) -> float:
        return len(self.ks) / self.plain_seconds


def step_seconds(cost: VerifyCostTable, ks: Sequence[int], other_rows: Sequence[int], draft_per_token: float) -> float:
    """Predicted seconds of a step: one pass over every sequence's rows plus the drafting."""
    rows = sum(k + 1 for k in ks) + sum(other_rows)
    return cost.cost(len(ks) + len(other_rows), rows) + draft_per_token * sum(ks)


def choose_ks(alphas: Sequence[float], caps: Sequence[int], cost: VerifyCostTable, draft_per_token: float,
              other_rows: Sequence[int] = (), min_gain: float = 0.0) -> StepPlan:
    """Greedy marginal gain: K_i from 0 up to caps[i], one draft at a time, each time the one that
    raises the batch's tokens per second most; stop when no draft raises it. other_rows: the rows
    of prefill chunks sharing the pass (they cost time and yield no tokens). A plan predicted less
    than min_gain above plain's rate gives way to the plain step."""
    plan = _greedy_ks(alphas, caps, cost, draft_per_token, other_rows)
    if plan.predicted_tokens_per_second < (1 + min_gain) * len(alphas) / plan.plain_seconds:
        return StepPlan((0,) * len(alphas), float(len(alphas)), plan.plain_seconds, plan.plain_seconds)
    return plan


def _greedy_ks(alphas, caps, cost, draft_per_token, other_rows) -> StepPlan:
    ks = [0] * len(alphas)
    plain = step_seconds(cost, ks, other_rows, draft_per_token)
    tokens, seconds = float(len(ks)), plain
    while True:
        best = None
        for i, alpha in enumerate(alphas):
            if ks[i] >= caps[i]:
                continue
            ks[i] += 1
            t = tokens - tokens_at(alpha, ks[i] - 1) + tokens_at(alpha, ks[i])
            s = step_seconds(cost, ks, other_rows, draft_per_token)
            ks[i] -= 1
            if t / s > tokens / seconds * (1 + 1e-9) and (best is None or t / s > best[1] / best[2]):
                best = (i, t, s)
        if best is None:
            return StepPlan(tuple(ks), tokens, seconds, plain)
        ks[best[0]] += 1
        tokens, seconds = best[1], best[2]


def measure_verify_cost(target, k_max: int, trials: int = 5) -> VerifyCostTable:
    """Time forward_ragged on the target's (empty) slots: batch sizes 1, 2, 4, .. max_slots, rows per
    sequence 1, 2, 3, 5, .. k_max + 1, the fastest of `trials` on top of a short cached prompt (the
    fastest: on a shared machine the noise only ever adds time)."""
    batches = _powers_up_to(target.max_slots)
    rows = tuple(sorted({1, 2, 3, *(r + 1 for r in _powers_up_to(k_max)), k_max + 1}))
    prompt = 16
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    slots = list(range(batches[-1]))
    target.forward_ragged(slots, [torch.ones(prompt, dtype=torch.long, device=target.device)] * len(slots),
                          logits=[False] * len(slots))
    table = []
    for b in batches:
        line = []
        for r in rows:
            new = [torch.ones(r, dtype=torch.long, device=target.device)] * b
            times = []
            for _ in range(trials + 1):  # the first is a warm-up
                sync()
                start = time.perf_counter()
                target.forward_ragged(slots[:b], new)
                sync()
                times.append(time.perf_counter() - start)
                for s in slots[:b]:
                    target.rollback(s, prompt)
            line.append(min(times[1:]))
        table.append(tuple(line))
    for s in slots:
        target.release(s)
    return VerifyCostTable(batches, rows, tuple(table))


@dataclass(frozen=True)
class StepDecision:
    """What the engine decided for its latest step, for a server's /metrics and web view.

    request_ids and ks: each decoding sequence's request id and drafts this step (0: a plain step).
    batch_size: sequences in the pass (prefilling ones included). The predictions are the auto
    policy's (None in the other modes), in tokens per second of the whole batch."""

    mode: str
    request_ids: tuple[int, ...]
    ks: tuple[int, ...]
    batch_size: int
    predicted_tokens_per_second: float | None = None
    plain_tokens_per_second: float | None = None


def _powers_up_to(n: int) -> tuple[int, ...]:
    out = [1]
    while out[-1] * 2 <= n:
        out.append(out[-1] * 2)
    return tuple(out) if out[-1] == n else (*out, n)
