"""The engine's one speculation boundary: how many drafts each decoding sequence verifies per step.

Each step the engine asks its SpeculationController for a Plan (a draft budget per decoding
sequence: today the length of its chain of drafts) and, once the step has settled, tells it what
happened (a StepRecord). The controller only changes how many drafts are verified, never which
tokens come out: the rejection rule keeps the output the target's whatever the budgets.

Three controllers, each made from a frozen option (`Speculation`, resolved once from a flag):
- RequestK: each request's own k (a library call's GenerationConfig.k);
- FixedK(k): k for every sequence;
- Auto(k): per load, the draft cap that has delivered the most tokens per second (specdec.engine.auto).

Every controller caps a sequence's budget by its room (no round emits past max_new_tokens) and gives
0 to a sequence whose drafter drafts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, Union

from specdec.errors import InvalidRequestError


@dataclass(frozen=True)
class SequenceView:
    """A decoding sequence as a controller sees it.

    k: its request's k. room: the most drafts its next round may verify (its remaining tokens
    minus the one a round always emits). drafts: whether its drafter proposes anything.
    seeded_sample: sampled with a seed, whose draws depend on where drafts were verified: a budget
    that depends on the batch would make its tokens depend on its companions (rule 6).
    tree: its drafter drafts trees, so a budget counts nodes, which its room does not bound (a tree
    of many nodes may be shallow)."""

    request_id: int
    k: int
    room: int
    drafts: bool
    seeded_sample: bool
    tree: bool = False

    def capped(self, budget: int) -> int:
        """budget, within its room (a tree: while it has any); 0 when its drafter drafts nothing."""
        if not self.drafts or self.room <= 0:
            return 0
        return max(0, budget) if self.tree else max(0, min(budget, self.room))


@dataclass(frozen=True)
class Plan:
    """A step's draft budget for each decoding sequence (batch order), and why, in words. key: what
    the controller needs to know its plan again when the step's record comes back (auto: the cap)."""

    budgets: tuple[int, ...]
    reason: str
    key: object = None

    @property
    def plain(self) -> bool:
        return not any(self.budgets)


@dataclass(frozen=True)
class StepRecord:
    """What a step did, as its controller is told once it has settled.

    load: sequences the engine held as the step began (decoding, prefilling, waiting for a slot).
    sequences, drafted, accepted: per decoding sequence, in batch order: its view as planned, the
    drafts it verified (its drafter may propose fewer than its budget) and those kept.
    emitted: tokens the step emitted in all. prefill_rows: prompt rows that shared the pass.
    draft_seconds: the host's time drafting; seconds: the whole step call, emitting included."""

    load: int
    sequences: tuple[SequenceView, ...]
    drafted: tuple[int, ...]
    accepted: tuple[int, ...]
    emitted: int
    prefill_rows: int
    draft_seconds: float
    seconds: float


@dataclass(frozen=True)
class StepTrace:
    """One step at the boundary: what was planned (and why) and what happened. The engine keeps the
    latest (BatchedEngine.last_step, read by a server's /speculation and /metrics) and hands each to
    its on_step hook, the documented way to trace the controller."""

    plan: Plan
    record: StepRecord


class SpeculationController(Protocol):
    """plan() must not change the controller (the engine may ask for the next step's plan ahead of
    it, to queue a plain step early); record() gets every step's trace once, in order."""

    name: str  # "request", "fixed" or "auto": how the server describes it
    k: int  # the most drafts it gives a sequence (request: the default for requests without one)

    def plan(self, sequences: Sequence[SequenceView], load: int) -> Plan: ...

    def record(self, trace: StepTrace) -> None: ...

    def summary(self) -> dict: ...


class _Stateless:
    """A controller that learns nothing from its steps: the option is its own controller."""

    def controller(self):
        return self

    def record(self, trace: StepTrace) -> None:
        pass

    def summary(self) -> dict:
        return {}


@dataclass(frozen=True)
class RequestK(_Stateless):
    """Each sequence verifies its request's k drafts. k: the default a server gives requests."""

    k: int = 4
    name = "request"

    def plan(self, sequences: Sequence[SequenceView], load: int) -> Plan:
        return Plan(tuple(s.capped(s.k) for s in sequences), "each request's k")


@dataclass(frozen=True)
class FixedK(_Stateless):
    """Every sequence verifies k drafts (0: plain decoding)."""

    k: int
    name = "fixed"

    def __post_init__(self) -> None:
        if self.k < 0:
            raise InvalidRequestError(f"a fixed K must be >= 0, got {self.k}")

    def plan(self, sequences: Sequence[SequenceView], load: int) -> Plan:
        return Plan(tuple(s.capped(self.k) for s in sequences), f"fixed K = {self.k}")


@dataclass(frozen=True)
class Auto:
    """Per load, the draft cap (0, about K / 2 or K) that has delivered the most tokens per second,
    measured in windows of steps (specdec.engine.auto.AutoController). k: the largest cap."""

    k: int = 4
    name = "auto"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise InvalidRequestError(f"auto speculation needs K >= 1, got {self.k}")

    def controller(self):
        from specdec.engine.auto import AutoController  # the engine layer's own module, imported when used

        return AutoController(self.k)


Speculation = Union[RequestK, FixedK, Auto]
Hook = Callable[[StepTrace], None]


def speculation_from_flag(text: str, k: int) -> Speculation:
    """`--speculation auto|K|request`: auto picks a cap of at most k per load, K fixes it for every
    sequence, request keeps each request's own k (k for requests without one)."""
    if text == "auto":
        return Auto(k)
    if text == "request":
        return RequestK(k)
    if not text.isdigit() or int(text) < 1:
        raise InvalidRequestError(f"--speculation must be auto, request or a whole number K >= 1, got {text!r}")
    return FixedK(int(text))
