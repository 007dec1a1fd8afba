"""`--speculation auto`: per load, the draft cap that delivers the most tokens per second, measured.

No model of costs: whether drafting pays depends on the verify pass's cost at this batch size, the
drafter's cost, the host's work and the acceptance of the requests being served, and a measurement
of what the server delivers sees all of them at once. So auto is a small bandit:

- Steps are grouped by load into buckets: the next power of two of the sequences the engine holds,
  decoding, prefilling or waiting (3-4 is 4, 9-16 is 16), so that a batch that shrinks by one as a
  request ends, until its client's next one arrives, stays in its bucket.
- The arms are draft caps: 0 (plain steps), about K / 2, and K, and for a large K (a tree's node
  budget) K / 4 too. Under an arm of cap c every decoding sequence verifies min(c, its room) drafts,
  a tree drafter the c nodes its draft probabilities rank highest: so under load its trees shrink
  toward chains, then to plain steps.
- Each bucket runs windows of WINDOW counted steps at one arm. A window's score is its tokens over
  its seconds (whole step calls, emitting included), so it sees every cost the server pays.
- The arm with the best median score over its latest MEMORY windows leads. A new bucket starts at one
  end and walks arm by arm toward the other while the newest arm leads: at load 1 from the largest cap
  down (a verify row costs least there, so drafting most likely pays), at higher loads from plain steps
  up (every row is dearer, and a short burst of requests must not be served below plain while the dear
  arms are tried). The walk stops at the first arm that does not lead: the throughput of the caps is
  taken to be unimodal, so the arms beyond it are not run until it leads again.
- A trailing arm that scores a fraction `loss` below the leader runs a window again once
  loss / EXPLORE_COST windows have passed since its latest score, so that re-measuring it costs at
  most about EXPLORE_COST of the throughput, whatever its loss: a near tie is re-measured often and
  cheaply, a clear loser rarely. A change in acceptance or in the load's mix moves the leader's own
  median first, and with it how soon the others are tried again; a re-measured walk's end that now
  leads continues the walk.

Steps that count: planned under the arm in force (a plain step queued ahead of the step that
closed a window was not), no prefill rows in the pass, at least one sequence that may draft
(otherwise every arm runs the same step), and not the first step planned under a new arm, which pays
for the switch (a draft model catching up on the text it skipped) once, where running that arm
steadily does not. A seeded sample never drafts under auto: its draws depend on where drafts were verified,
and auto's cap depends on the batch (design rule 6).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from specdec.engine.controller import Plan, SequenceView, StepTrace

WINDOW = 32  # counted steps a window: enough to average over a few rounds' luck, short next to a request
MEMORY = 8  # windows an arm's median reads: one unlucky window does not decide
EXPLORE_COST = 0.01  # the share of throughput that re-measuring each trailing arm may cost


def bucket_of(load: int) -> int:
    """The load's bucket: the next power of two at or above it (at least 1)."""
    return 1 << max(0, load - 1).bit_length()


@dataclass
class _Bucket:
    """One load bucket's bandit: the arm in force, the window it is filling, each arm's scores."""

    arms: tuple[int, ...]  # ascending
    descending: bool  # the walk's direction: from the largest cap down (load 1) or from plain up
    arm: int
    scores: dict[int, deque] = field(default_factory=dict)  # arm -> latest window scores (tokens / s)
    last_scored: dict[int, int] = field(default_factory=dict)  # arm -> the window count at its latest score
    windows: int = 0
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    switched: bool = False  # the arm changed since its last counted step

    def median(self, arm: int) -> float | None:
        window = self.scores.get(arm)
        return statistics.median(window) if window else None

    def add_step(self, tokens: int, seconds: float) -> bool:
        """Count a step; True when it closed the window (the arm's score is then recorded)."""
        if self.switched:
            self.switched = False
            return False
        self.steps, self.tokens, self.seconds = self.steps + 1, self.tokens + tokens, self.seconds + seconds
        if self.steps < WINDOW:
            return False
        self.scores.setdefault(self.arm, deque(maxlen=MEMORY)).append(self.tokens / self.seconds)
        self.windows += 1
        self.last_scored[self.arm] = self.windows
        self.steps, self.tokens, self.seconds = 0, 0, 0.0
        return True

    def next_arm(self) -> int:
        leader, walk = self.leader, self.walk_order
        measured = [a for a in walk if a in self.scores]
        end = measured[-1]  # the walk's furthest arm: the walk goes on while it leads
        if end == leader and end != walk[-1]:
            return walk[walk.index(end) + 1]
        best = self.median(leader)
        due = [a for a in measured if a != leader
               and self.windows - self.last_scored[a] >= (1 - self.median(a) / best) / EXPLORE_COST]
        return min(due, key=lambda a: self.last_scored[a]) if due else leader

    @property
    def walk_order(self) -> tuple[int, ...]:
        """The order a new bucket tries its arms in: the first is the arm it starts at."""
        return self.arms[::-1] if self.descending else self.arms

    @property
    def leader(self) -> int:
        """The arm with the best median score (the walk's first arm until any has one); a tie goes to
        the arm the walk reached later, so that a flat stretch does not stop the walk."""
        scored = [a for a in self.walk_order[::-1] if a in self.scores]
        return max(scored, key=self.median) if scored else self.walk_order[0]


def arms_for(k: int) -> tuple[int, ...]:
    """The caps auto tries for a budget of k: 0, k and its halvings down to 2, at most four (k, k / 2,
    k / 4: a tree's node budget of 16 gets 4, 8 and 16, its smallest near a chain), at least 0, k / 2, k."""
    halvings = {k >> i for i in range(3) if k >> i >= 2}
    return tuple(sorted({0, max(1, k // 2), k} | halvings))


class AutoController:
    """The auto SpeculationController over caps (arms_for(k)), by load bucket (module docstring)."""

    name = "auto"

    def __init__(self, k: int):
        self.k = k
        self.arms = arms_for(k)
        self._buckets: dict[int, _Bucket] = {}

    def arm_at(self, load: int) -> int:
        """The draft cap in force at this load."""
        bucket = self._buckets.get(bucket_of(load))
        return _new_bucket(self.arms, load).arm if bucket is None else bucket.arm

    def plan(self, sequences: Sequence[SequenceView], load: int) -> Plan:
        arm = self.arm_at(load)
        budgets = tuple(s.capped(arm) if _may_draft(s) else 0 for s in sequences)
        return Plan(budgets, f"auto: cap {arm} at load bucket {bucket_of(load)}", key=arm)

    def record(self, trace: StepTrace) -> None:
        record = trace.record
        if record.prefill_rows or record.seconds <= 0 or not any(_may_draft(s) for s in record.sequences):
            return  # prefill in the pass, or no sequence that any arm would let draft
        key = bucket_of(record.load)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _new_bucket(self.arms, record.load)
        if trace.plan.key != bucket.arm:
            return  # planned before the arm changed
        if bucket.add_step(record.emitted, record.seconds):
            arm = bucket.next_arm()
            bucket.switched, bucket.arm = arm != bucket.arm, arm

    def summary(self) -> dict:
        """By load bucket: the arm in force, the leader, each arm's median score (tokens/s), windows run."""
        return {"arms": list(self.arms), "buckets": [
            {"load": key, "arm": b.arm, "leader": b.leader, "windows": b.windows,
             "scores": {str(a): b.median(a) for a in self.arms}}
            for key, b in sorted(self._buckets.items())]}


def _new_bucket(arms: tuple[int, ...], load: int) -> _Bucket:
    """A bucket's bandit before its first window: at load 1 at the largest cap, walking down; above,
    at plain steps, walking up (module docstring)."""
    descending = bucket_of(load) == 1
    return _Bucket(arms, descending, arms[-1] if descending else arms[0])


def _may_draft(seq: SequenceView) -> bool:
    return seq.drafts and not seq.seeded_sample
