"""Speculation that never loses: how many drafts each sequence verifies at each step, 0 included.

A step of the batched engine runs one target pass over every decoding sequence's K_i + 1 rows.
Its expected yield is sum_i tau(a_i, K_i) tokens, tau(a, K) = (1 - a^(K+1)) / (1 - a)
(specdec.speedup), and its cost is the target pass over those rows (a measured verify-cost table
over batch size and rows per sequence) plus the drafter's: a fixed part and max_i K_i passes, each
drafting one token for every sequence still drafting (a draft model's pass over a few rows costs
about what one row does; DraftCost). The auto policy picks the K_i that maximise tokens per second
of the whole batch, exactly (choose_ks: the cost depends on the drafts only through their number
and their largest K, and each sequence's j-th draft yields a^j), with all K_i = 0 (a plain step)
among the candidates: under its own model a step is never predicted slower than plain decoding. Each sequence's
acceptance is a posterior over its own judged drafts, its prior the mean of every sequence's with
the same drafter (AcceptancePool). K only changes how many drafts are verified, never which tokens
come out (the rejection rule keeps the output the target's).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from specdec.errors import InvalidRequestError

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

    def describe(self) -> str:
        """The table in milliseconds a pass, one line per batch size: what the auto policy prices steps by."""
        head = "ms a pass of N sequences with R new rows each, R = " + " ".join(map(str, self.rows_per_seq))
        return "\n".join([head] + [f"  N = {b:>3}: " + " ".join(f"{1e3 * t:.2f}" for t in row)
                                    for b, row in zip(self.batch_sizes, self.seconds)])

    def costs(self, num_seqs: int, total_rows: np.ndarray) -> np.ndarray:
        """Seconds of a pass over num_seqs sequences bringing total_rows[i] rows in all, for each i,
        in one go (the auto policy prices every draft total of a step, at every step)."""
        seconds = np.asarray(self.seconds)  # [batch sizes, rows per sequence]
        along_batch = _interpolate(np.asarray(self.batch_sizes, dtype=float), seconds, np.asarray([num_seqs]))[0]
        per_seq = np.asarray(total_rows, dtype=float) / num_seqs
        return np.maximum(_interpolate(np.asarray(self.rows_per_seq, dtype=float), along_batch, per_seq), 1e-12)


def _interpolate(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Piecewise linear through (xs, ys[j]) along ys' first axis, at each of x, extended linearly past
    both ends; a constant for one point. xs [n], ys [n, ...], x [m] -> [m, ...]."""
    if len(xs) == 1:
        return np.broadcast_to(ys[0], (len(x), *ys.shape[1:])).copy()
    i = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, len(xs) - 2)
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]).reshape(-1, *([1] * (ys.ndim - 1)))
    return ys[i] + slope * (x - xs[i]).reshape(-1, *([1] * (ys.ndim - 1)))


@dataclass(frozen=True)
class SpeculationPolicy:
    """How many drafts each sequence verifies per step.

    mode "request": each request's GenerationConfig.k (the engine's behaviour before policies).
    mode "fixed": k for every sequence. mode "auto": 0..k per sequence per step, chosen to maximise
    the batch's expected tokens per second (choose_ks). prior_accepted / prior_rejected: the Beta
    prior of a sequence's acceptance rate before it has drafted (a mean of 0.5 over 4 pseudo-drafts
    by default: four unlucky rounds in a row, 0 of 4 judged, leave 0.25, not 0.17). verify_cost: the target's
    cost table; None: the engine measures it at start-up.
    draft_seconds_per_pass: the drafter's seconds per drafting pass (one token for every drafting
    sequence) before the engine has timed it (DraftCost).
    min_gain: a step speculates only when its predicted rate beats plain's by this fraction (the
    cost model is measured, so a prediction within its error is no reason to risk being slower);
    the guard, likewise, counts its drafting windows' lead over plain ones only past it (its margin).
    evidence_half_life: engine steps over which a sequence's own judged drafts lose half their
    weight (SequenceEvidence), so that one that stopped drafting after unlucky rounds tries again.
    guard_window: steps per window of the auto policy's ThroughputGuard (specdec.guard), which lets
    the policy draft at a batch size only while drafting's realized tokens per second beat plain
    steps'; 0: no guard (the model's plans alone). load_hold: steps over which the guard reads the
    load as its peak (HeldLoad), so that the dip between a finished request and its client's next
    one is not a load of its own; 1: the load of each step alone."""

    mode: str = "request"
    k: int = 4
    prior_accepted: float = 2.0
    prior_rejected: float = 2.0
    verify_cost: VerifyCostTable | None = None
    draft_seconds_per_pass: float = 0.0
    min_gain: float = 0.05
    evidence_half_life: int = 16
    guard_window: int = 32
    load_hold: int = 8

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequestError(f"speculation mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.k < (1 if self.mode == "auto" else 0):
            raise InvalidRequestError(f"speculation k must be >= {1 if self.mode == 'auto' else 0} "
                                      f"in mode {self.mode}, got {self.k}")
        if self.prior_accepted <= 0 or self.prior_rejected <= 0:
            raise InvalidRequestError("the acceptance prior's pseudo-counts must be > 0")
        if self.draft_seconds_per_pass < 0 or self.min_gain < 0:
            raise InvalidRequestError("draft_seconds_per_pass and min_gain must be >= 0")
        if self.evidence_half_life < 2:
            raise InvalidRequestError(f"evidence_half_life must be >= 2 steps, got {self.evidence_half_life}")
        if self.guard_window < 0:
            raise InvalidRequestError(f"guard_window must be >= 0 steps (0: no guard), got {self.guard_window}")
        if self.load_hold < 1:
            raise InvalidRequestError(f"load_hold must be >= 1 step (1: no hold), got {self.load_hold}")

    @classmethod
    def auto(cls, k_max: int = 8, **kwargs) -> "SpeculationPolicy":
        return cls(mode="auto", k=k_max, **kwargs)

    @classmethod
    def fixed(cls, k: int) -> "SpeculationPolicy":
        return cls(mode="fixed", k=k)

    def acceptance(self, accepted: int, judged: int, prior_mean: float | None = None) -> float:
        """The posterior mean of a sequence's acceptance rate, the chance that the rule keeps a draft
        it judges (tau's a), from its own counts: judged drafts are the accepted ones and each round's
        first rejected one. (Accepted over all drafted would count the drafts after a rejection,
        never judged, as rejected: at a = 0.8 and K = 4 it reads 0.59, and the policy would find
        drafting worth less than it is.) prior_mean: the prior's mean (AcceptancePool: what other
        sequences' drafts showed), weighing the prior's pseudo-drafts; None: the prior's own."""
        weight = self.prior_accepted + self.prior_rejected
        mean = self.prior_accepted / weight if prior_mean is None else prior_mean
        return (accepted + weight * mean) / (judged + weight)


class RecentMedian:
    """The median of the latest `window` samples, forgotten once `memory` ticks pass without a new
    one (None: never), so that an estimate that stops its own sampling (a cost too high to let
    anyone draft) cannot hold for good."""

    def __init__(self, window: int = 32, memory: int | None = 512):
        self.memory = memory
        self._samples: deque[float] = deque(maxlen=window)
        self._ticks = self._added_at = 0

    def tick(self) -> None:
        self._ticks += 1
        if self.memory is not None and self._samples and self._ticks - self._added_at > self.memory:
            self._samples.clear()

    def add(self, value: float) -> None:
        self._samples.append(value)
        self._added_at = self._ticks

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def median(self) -> float | None:
        return statistics.median(self._samples) if self._samples else None


class DraftCost:
    """The drafter's seconds in a drafting step as the auto policy reads them: a step that drafts up
    to K tokens for some sequences runs K passes, each drafting one token for every sequence still
    drafting (a draft model: one forward_ragged over those rows, whose cost hardly depends on how
    many there are), and pays some seconds whatever its passes (the first pass's launch, the drafts
    gathered for the verify). seconds(passes) = fixed + per_pass * passes.

    Each timed drafting step's seconds go to the median of the latest `window` steps of its pass
    count. With at least `min_samples` steps at two pass counts or more, fixed and per_pass are the
    line through those medians (least squares); else fixed is 0 and per_pass the median of the
    latest steps' seconds over their passes, which prices a pass with its share of the fixed part:
    on the H200 at 1 in flight a three-pass step took 8.66 ms and a four-pass one 9.40, so a fourth
    pass cost 0.74 ms where seconds over passes read 1.2-1.4, and the policy drafted three tokens
    where four paid. Without a drafting step for `memory` steps all is forgotten (RecentMedian), so
    that a cost too high to let anyone draft cannot hold for good. The engine times only steps where
    no drafter catches up on text it has not seen (its first draft reads the prompt; after a plain
    stretch it reads every token since): those cost the catching up, not the drafting, and are read
    apart: their seconds beyond seconds(passes), per token caught up on (per_unseen_token; 0 before
    any was seen). prior: per_pass before any step was timed."""

    def __init__(self, prior: float, window: int = 32, memory: int = 512, min_samples: int = 8):
        self.prior, self.window, self.min_samples = prior, window, min_samples
        self._per_pass = RecentMedian(window, memory)
        self._by_passes: dict[int, RecentMedian] = {}  # kept while drafting goes on at any pass count
        self._per_unseen = RecentMedian(window, memory)
        self._fitted: tuple[float, float] | None = None

    def tick(self) -> None:
        """One engine step went by."""
        self._per_pass.tick()
        self._per_unseen.tick()
        if self._per_pass.median is None and self._by_passes:
            self._by_passes.clear()
            self._fitted = None

    def record(self, seconds: float, passes: int) -> None:
        self._per_pass.add(seconds / passes)
        self._by_passes.setdefault(passes, RecentMedian(self.window, None)).add(seconds)
        self._fitted = None

    def record_catch_up(self, seconds: float, passes: int, unseen: int) -> None:
        """A drafting step in which drafters caught up on `unseen` tokens of text in all."""
        self._per_unseen.add(max(0.0, seconds - self.seconds(passes)) / max(unseen, 1))

    def seconds(self, passes: int) -> float:
        """A drafting step's seconds at this many passes (0 passes: no drafting, no seconds)."""
        return self.fixed + self.per_pass * passes if passes else 0.0

    @property
    def per_pass(self) -> float:
        return self._fit()[1]

    @property
    def fixed(self) -> float:
        return self._fit()[0]

    @property
    def per_unseen_token(self) -> float:
        median = self._per_unseen.median
        return 0.0 if median is None else median

    def _fit(self) -> tuple[float, float]:
        """(fixed, per_pass), worked out again only after a step was recorded or all was forgotten."""
        if self._fitted is None:
            median = self._per_pass.median
            points = [(m, r.median) for m, r in self._by_passes.items() if len(r) >= self.min_samples]
            fixed, slope = _line(points) if len(points) >= 2 else (0.0, 0.0)
            if median is None:
                self._fitted = (0.0, self.prior)
            elif fixed >= 0 and slope > 0:
                self._fitted = (fixed, slope)
            else:  # one pass count, or medians that no line of positive cost fits
                self._fitted = (0.0, median)
        return self._fitted


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y) points at two x or more."""
    x_mean = sum(x for x, _ in points) / len(points)
    y_mean = sum(y for _, y in points) / len(points)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in points) / sum((x - x_mean) ** 2 for x, _ in points)
    return y_mean - slope * x_mean, slope


class AcceptancePool:
    """What every sequence's drafts so far say about each drafter (by name): the prior of a new
    sequence's acceptance estimate, and whether the policy must still explore.

    A sequence that never drafts brings no evidence, so a prior alone can keep a good drafter off
    for good (on the H200 the oracle at a = 0.8, 1.7x plain at batch 1 with K = 4, never drafted
    from the neutral prior 0.5 once the calibration priced drafting steps right). So while a
    drafter has fewer than `explore` judged drafts in the pool, its sequences are planned as if
    every draft were accepted (optimism under uncertainty: they draft, and the pool learns); after,
    a sequence's prior mean is the pool's. The counts halve whenever the pool passes `memory`
    judged drafts, so it follows a drift in what the server is asked."""

    def __init__(self, policy: SpeculationPolicy, explore: int = 32, memory: int = 4096):
        self.policy = policy
        self.explore = explore
        self.memory = memory
        self._counts: dict[str, list[float]] = {}  # drafter name -> [accepted, judged]

    def add(self, drafter: str, accepted: int, judged: int) -> None:
        counts = self._counts.setdefault(drafter, [0.0, 0.0])
        counts[0] += accepted
        counts[1] += judged
        if counts[1] > self.memory:
            counts[0] /= 2
            counts[1] /= 2

    def exploring(self, drafter: str) -> bool:
        return self._counts.get(drafter, [0.0, 0.0])[1] < self.explore

    def estimates(self, evidence: Sequence[tuple[str, float, float]]) -> list[float]:
        """Each sequence's acceptance for the plan from (drafter, accepted, judged): 1 while its drafter
        is explored, else its posterior mean under the pool's prior (each drafter's worked out once)."""
        priors: dict[str, float | None] = {}
        out = []
        for drafter, accepted, judged in evidence:
            if drafter not in priors:
                priors[drafter] = None if self.exploring(drafter) else self.policy.acceptance(*self._counts[drafter])
            prior = priors[drafter]
            out.append(1.0 if prior is None else self.policy.acceptance(accepted, judged, prior))
        return out


class SequenceEvidence:
    """A sequence's own judged drafts as the auto policy weighs them: every `half_life` steps of the
    engine they lose half their weight, drafting or not (applied twice per half-life, so that
    between fades the plan's inputs hold and it is reused).

    Lifelong counts would trap a sequence: one whose first judged draft is rejected reads 0.64 under
    a pool's 0.8 (4 pseudo-drafts), below what pays where the verify is dear, and a sequence that does
    not draft gets no evidence to undo it (on the H200 at concurrency 1 most sequences of the oracle
    at 0.8 stopped drafting that way, 1.02x plain where a fixed K = 4 gave 1.39x). Faded, its estimate
    returns to the pool's mean and it tries again; a sequence that really is poor retries rarely
    (from 20 judged drafts at 0.3 under a pool of 0.8, after about 60 steps)."""

    def __init__(self) -> None:
        self.accepted = self.judged = 0.0

    def add(self, accepted: int, judged: int) -> None:
        self.accepted += accepted
        self.judged += judged

    def fade(self, factor: float) -> None:
        """Weigh what it has by factor; under half a judged draft it is forgotten (so that a sequence
        with none left keeps its estimate, and the plan, unchanged)."""
        self.accepted *= factor
        self.judged *= factor
        if self.judged < 0.5:
            self.accepted = self.judged = 0.0


def fade_evidence(policy: SpeculationPolicy, step: int, evidence: Sequence[SequenceEvidence]) -> None:
    """At engine step `step` (counted from 1): every half of a half-life, each sequence's evidence fades."""
    period = policy.evidence_half_life // 2
    if step % period == 0:
        for one in evidence:
            one.fade(0.5 ** (period / policy.evidence_half_life))


class StepCalibration:
    """How much longer steps take than the model predicts, drafting steps against plain ones.

    The verify-cost table times bare passes; a step also pays the host's planning, the rule, the
    settling and the emitting of its tokens, and a plain step's share of that hides behind the
    device when it is queued ahead (pipelined) while a drafting step's cannot. A step's observed
    seconds are its whole call's, as the guard reads them (BatchedEngine._calibrate says why).
    factor: the median of observed/predicted seconds over the latest `window` drafting steps, over
    the same for plain steps (1 until both have samples); the policy multiplies a drafting plan's
    predicted seconds by it. The drafting steps' median is forgotten after `memory` steps without
    one, like DraftCost, so a high factor cannot keep drafting off for good."""

    def __init__(self, window: int = 32, memory: int = 512):
        self._drafting = RecentMedian(window, memory)
        self._plain = RecentMedian(window, None)

    def record(self, observed: float, predicted: float, drafted: bool) -> None:
        self._drafting.tick()
        (self._drafting if drafted else self._plain).add(observed / predicted)

    @property
    def factor(self) -> float:
        drafting, plain = self._drafting.median, self._plain.median
        return 1.0 if drafting is None or plain is None else drafting / plain

    def factor_to(self, step: float) -> float:
        """factor, rounded to the nearest power of (1 + step): the same value while it moves less."""
        return math.exp(round(math.log(self.factor) / math.log1p(step)) * math.log1p(step))


def policy_from_flag(text: str, k_max: int) -> SpeculationPolicy:
    """`--speculation auto|K|request`: auto picks 0..k_max drafts per sequence per step, K fixes it for
    every sequence, request keeps each request's own k (else k_max; SpeculationPolicy())."""
    if text == "auto":
        return SpeculationPolicy.auto(k_max=k_max)
    if text == "request":
        return SpeculationPolicy()
    if not text.isdigit() or int(text) < 1:
        raise InvalidRequestError(f"--speculation must be auto, request or a whole number K >= 1, got {text!r}")
    return SpeculationPolicy.fixed(int(text))


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


def step_seconds(cost: VerifyCostTable, ks: Sequence[int], other_rows: Sequence[int], draft_per_pass: float,
                 draft_fixed: float = 0.0) -> float:
    """Predicted seconds of a step: one pass over every sequence's rows plus, where any drafts, the
    drafter's fixed seconds and max(ks) drafting passes (DraftCost)."""
    passes = max(ks, default=0)
    verify = _verify_seconds(cost, len(ks), sum(ks), tuple(other_rows))[-1]
    return verify + draft_per_pass * passes + draft_fixed if passes else verify


def choose_ks(alphas: Sequence[float], caps: Sequence[int], cost: VerifyCostTable, draft_per_pass: float,
              other_rows: Sequence[int] = (), min_gain: float = 0.0, drafting_factor: float = 1.0,
              entry: Sequence[float] = (), draft_fixed: float = 0.0) -> StepPlan:
    """The K_i (0 up to caps[i]) that maximise the batch's predicted tokens per second.

    A step's cost depends on the drafts only through their total D (the pass over B sequences and
    B + D rows) and their largest K, m (the drafting passes), and the j-th draft of a sequence with
    acceptance a adds a^j expected tokens, less than its (j-1)-th. So for each m and D the best
    split gives the D drafts of largest gain among those with j <= m, whoever they belong to, and
    the plan is the best over m = 1 .. max(caps) and D, against the plain step (D = 0): the exact
    optimum under the model, whatever shape the measured cost has (on a CPU a pass of 5 rows may
    cost less than one of 1). other_rows: the rows of each prefill chunk sharing the pass; they cost
    time, and each of their sequences counts as the one token a plain step gives a sequence: its
    time is worth what it will decode, and drafting for the others holds its prefill up (a wave of
    requests, most still prefilling, is no batch of a few). drafting_factor: what a drafting step's
    seconds are multiplied by (StepCalibration). entry: by sequence, the seconds its drafting adds
    this step whatever its K (a drafter catching up on text it has not seen); with any, the plan is
    the best of the D largest gains' prefixes, each paying the entries of the sequences in it, with
    and without the sequences that have an entry. draft_fixed: the drafter's seconds a drafting step
    pays whatever its passes (DraftCost). A plan predicted less than min_gain above plain's rate gives
    way to the plain step.

    Plain Python, not numpy: the engine plans every drafting step on the host while the device
    waits, and over a few dozen candidate drafts numpy's cost per call was most of the time (on
    the H100 at 1 in flight the auto policy's host work made a four-draft step 0.6 ms slower than
    a fixed K = 4 step's). Its time grows with max K times all the candidates, numpy's with max K:
    on the dev CPU at 1 / 16 / 32 sequences and K = 4 it takes 0.08 / 0.55 / 1.0 of numpy's time,
    at 32 and K = 8 or 16 1.4-1.6 times it; past the m where even every draft's gain in the
    cheapest pass could not win, it stops (at K = 64: 0.4 of numpy's time)."""
    n, filling = len(alphas), len(other_rows)
    verify = _verify_seconds(cost, n, sum(caps), tuple(other_rows))  # every draft total D, once
    plain, cheapest = verify[0], min(verify[1:], default=0.0)  # cheapest: a pass with any drafts
    best_worth, best = (n + filling) / plain * (1 + min_gain) * (1 + 1e-9), None
    entries = list(entry) if len(entry) else [0.0] * n
    # Every possible draft (sequence i, its j-th), largest gain first; a stable sort keeps a
    # sequence's first draft before its others where gains tie (a = 1 while a drafter is explored).
    candidates = sorted(((alphas[i] ** j, i, j) for i in range(n) for j in range(1, caps[i] + 1)),
                        key=lambda c: -c[0])
    every_gain = sum(g for g, _, _ in candidates)
    for allowed in [caps] if not any(entries) else [caps, [0 if e > 0 else c for e, c in zip(entries, caps)]]:
        for m in range(1, max(allowed, default=0) + 1):
            passes_cost = draft_per_pass * m
            # No plan of m passes or more beats the best: every draft's gain in the cheapest pass
            # (with room for rounding, so that the bound never cuts off a plan the search would pick).
            if (n + every_gain + filling) / ((cheapest + draft_fixed + passes_cost) * drafting_factor) * (1 + 1e-12) \
                    <= best_worth:
                break
            chosen = [(g, i, j) for g, i, j in candidates if j <= allowed[i] and j <= m]
            gained = paid = 0.0
            top, top_d = -math.inf, 0
            for d, (gain, i, j) in enumerate(chosen, start=1):
                gained += gain
                if j == 1:
                    paid += entries[i]
                seconds = (verify[d] + draft_fixed + passes_cost) * drafting_factor + paid
                worth = (n + gained + filling) / seconds
                if worth > top:
                    top, top_d, top_tokens, top_seconds = worth, d, n + gained, seconds
            if top > best_worth:
                ks = [0] * n
                for _, i, _ in chosen[:top_d]:
                    ks[i] += 1
                best_worth, best = top * (1 + 1e-9), StepPlan(tuple(ks), top_tokens, top_seconds, plain)
    return best or StepPlan((0,) * n, float(n), plain, plain)


@functools.lru_cache(maxsize=256)
def _verify_seconds(cost: VerifyCostTable, num_seqs: int, max_drafts: int,
                    other_rows: tuple[int, ...]) -> tuple[float, ...]:
    """The target pass's seconds with num_seqs decoding sequences drafting D = 0 .. max_drafts tokens
    in all, beside prefill chunks of other_rows, by D; remembered by shape (the shapes repeat from
    step to step, and numpy's interpolation costs tens of microseconds a call)."""
    rows = num_seqs + np.arange(max_drafts + 1) + sum(other_rows)
    return tuple(float(s) for s in cost.costs(num_seqs + len(other_rows), rows))


def measure_verify_cost(target, k_max: int, trials: int = 5) -> VerifyCostTable:
    """Time forward_ragged on the target's (empty) slots: batch sizes 1, 2, 4, .. max_slots, rows per
    sequence 1, 2, 3, 5, .. k_max + 1, on top of a short cached prompt. The cells take turns, one
    trial of each at a time (drift on a shared machine hits all alike); each is the median of its
    trials. The table keeps its shape as measured: on a CPU a pass of 5 rows can cost less than one
    of 1 (the matmul path changes with the row count), and choose_ks takes any shape."""
    batches = _powers_up_to(target.max_slots)
    rows = tuple(sorted({1, 2, 3, *(r + 1 for r in _powers_up_to(k_max)), k_max + 1}))
    prompt = 16
    slots = list(range(batches[-1]))
    target.forward_ragged(slots, [torch.ones(prompt, dtype=torch.long, device=target.device)] * len(slots),
                          logits=[False] * len(slots))
    times = {(b, r): [] for b in batches for r in rows}
    for trial in range(trials + 1):  # the first is a warm-up
        for b, r in times:
            seconds = _time_pass(target, slots[:b], r, prompt)
            if trial:
                times[b, r].append(seconds)
    for s in slots:
        target.release(s)
    medians = [[statistics.median(times[b, r]) for r in rows] for b in batches]
    return VerifyCostTable(batches, rows, tuple(map(tuple, medians)))


def _time_pass(target, slots: list[int], rows: int, prompt: int) -> float:
    """Seconds of one pass of `rows` new tokens on each slot, then the slots back to the prompt."""
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    new = [torch.ones(rows, dtype=torch.long, device=target.device)] * len(slots)
    sync()
    start = time.perf_counter()
    target.forward_ragged(slots, new)
    sync()
    seconds = time.perf_counter() - start
    for s in slots:
        target.rollback(s, prompt)
    return seconds


@dataclass(frozen=True)
class StepDecision:
    """What the engine decided for its latest step, for a server's /metrics and web view.

    request_ids and ks: each decoding sequence's request id and drafts this step (0: a plain step).
    batch_size: sequences in the pass (prefilling ones included). The predictions are the auto
    policy's (None in the other modes), in tokens per second of the whole batch. drafting: the auto
    policy's ThroughputGuard at this batch size, "open" (the policy chooses) or "closed" (plain
    steps); None in the other modes or without a guard. draft_seconds: the drafter's cost as the auto
    policy prices a step, (fixed, per pass) in seconds (DraftCost); None in the other modes."""

    mode: str
    request_ids: tuple[int, ...]
    ks: tuple[int, ...]
    batch_size: int
    predicted_tokens_per_second: float | None = None
    plain_tokens_per_second: float | None = None
    drafting: str | None = None
    draft_seconds: tuple[float, float] | None = None


def _powers_up_to(n: int) -> tuple[int, ...]:
    out = [1]
    while out[-1] * 2 <= n:
        out.append(out[-1] * 2)
    return tuple(out) if out[-1] == n else (*out, n)
