"""The auto policy's check on itself: drafting stays allowed at a load only while it pays.

The auto policy prices each step by a model (the verify-cost table, the drafter's cost, the
calibration of drafting steps against plain ones) and speculates where the model predicts a gain.
Where the model misprices (a host cost it does not see, a drafter whose cost grows in a way its
timing misses, the pipelining that only plain steps get), a plan predicted to win can lose. The
guard does not predict; it measures what the server delivers.

The engine's steps are grouped by load into buckets: the nearest power of two of the sequences in
the engine (3-5 is 4, 12-22 is 16), so that a batch that shrinks by one as a sequence ends stays in
its bucket. The load counts every sequence the engine holds, decoding, prefilling or waiting for a
slot: while a batch fills up (a wave of requests arriving, most of them still prefilling) its few
decoding sequences are a step of the load it is about to be, and drafting for them would hold up
the newcomers' prefill. Each bucket runs windows, each either open (the policy chooses K per sequence, 0
included: `window` steps) or closed (every K = 0, plain steps, which pipeline: half as many, since
a plain step's tokens do not vary and only its seconds do). A window's score is its realized tokens
per second over what the cost table predicts plain decoding of the same batches gives, so windows
under different loads compare. A window's first step is not scored: it pays the switch (a draft
model catching up on the plain steps' tokens, a plain step that could not be queued ahead), which
the mode that runs steadily does not. The mode with the better median score over its latest
`memory` windows runs, the open one only where it beats the closed one by a margin (its windows'
scores leave out the switches and the steps with prefill chunks around them). The other one runs
a window again once the leader has run long enough that exploring costs at most `budget` of
throughput, so a change in load or in acceptance is seen; an exploration whose window beats the
leader's median (past the margin, where the open mode explores) runs on, window after window, until
its own median leads or one of its windows loses, so that a bucket turns once a change is seen. An
exploration costs the trailer's window (behind by a fraction g) and the two switches, into the
trailer and back, each measured as the first step of a window that follows the other mode beyond
its window's mean step; without switch costs a trailer gets a share of the time of budget / g
(all of it while g <= budget), and at least 1 / (1 + max_ratio) in any case. Between two modes
that score alike the switches are the whole cost, and a catching-up draft model makes them dear.
Both modes emit the target's tokens: the guard only changes how fast they come.

The load a step is keyed by is held (HeldLoad): the most sequences the engine held over its latest
few steps. When a request ends, its client's next one arrives a round trip later; keyed by the load
of those steps, a server at 16 in flight would draft for a step or two in bucket 4's open window each
time, every drafter catching up on all the text it skipped while bucket 16 was closed. On an H100
that cost 1-4 % of throughput at 16 in flight (docs/server.md).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

OPEN, CLOSED = "open", "closed"
MODES = (OPEN, CLOSED)  # the order of each mode's first window


def at_bucket(store: dict, load: int, make: Callable):
    """store's entry for the bucket of this load (ThroughputGuard.bucket_of), made on first use (not
    setdefault: it would make one every step)."""
    size = ThroughputGuard.bucket_of(load)
    entry = store.get(size)
    if entry is None:
        entry = store[size] = make()
    return entry


def _other(mode: str) -> str:
    return CLOSED if mode == OPEN else OPEN


class HeldLoad:
    """The load the guard keys a step by: the most sequences the engine held over its latest `span`
    steps, so that a dip between requests stays in the bucket of the load around it, and a real drop
    is seen `span` steps late. A stretch with the engine empty counts as steps of load 0, as many as
    the latest step's seconds fit in it: a request after a pause is not held to the load before it.
    (Only an empty engine's time: between the steps of a busy one the host works, admits, streams.)"""

    def __init__(self, span: int = 8):
        if span < 1:
            raise ValueError("span must be >= 1 step")
        self._loads: deque[int] = deque(maxlen=span)
        self._started = 0.0
        self._emptied: float | None = None  # when the engine was left empty (None: it was not)
        self._step_seconds = 0.0  # the latest step's (0: none ended yet)
        self.value = 0

    def start(self, load: int, now: float) -> int:
        """A step begins at this load (sequences in the engine) at time `now`; the held load."""
        if self._emptied is not None and self._step_seconds > 0:
            idle_steps = int((now - self._emptied) / self._step_seconds)
            self._loads.extend([0] * min(idle_steps, self._loads.maxlen))
        self._loads.append(load)
        self._started, self.value = now, max(self._loads)
        return self.value

    def end(self, now: float, empty: bool) -> None:
        """The step begun last ended at time `now`, leaving the engine empty or not."""
        self._step_seconds = now - self._started
        self._emptied = now if empty else None


@dataclass
class _Window:
    """The steps of one bucket's current window."""

    mode: str
    switched: bool = False  # it follows a window of the other mode: its first step pays the switch
    skip: int = 1  # first steps left unscored (the switch's)
    first_seconds: float = 0.0  # the unscored first step's
    steps: int = 0
    tokens: int = 0
    sequences: int = 0  # sum over its steps of the decoding sequences: the tokens plain steps give
    seconds: float = 0.0
    plain_seconds: float = 0.0  # sum over its steps of the cost table's plain step for the same batch

    def score(self) -> float:
        """Realized tokens per second over plain decoding's predicted tokens per second."""
        return (self.tokens / self.seconds) / (self.sequences / self.plain_seconds)


@dataclass
class _Bucket:
    scores: dict[str, deque] = field(default_factory=dict)
    window: _Window = field(default_factory=lambda: _Window(OPEN))
    last_seconds: dict[str, float] = field(default_factory=dict)  # each mode's latest window's seconds
    switch_seconds: dict[str, float] = field(default_factory=dict)  # the latest switch into each mode: extra seconds
    leader: str | None = None
    leader_seconds: float = 0.0  # the leader's seconds since the trailing mode last ran


class ThroughputGuard:
    """Whether drafting is allowed at each load (module docstring). window: steps per open
    window (a closed one: half, at least 1), each window's first step left out; memory: windows of
    each mode whose median scores it; budget: the share of throughput that exploring the trailing
    mode may cost; max_ratio: the most seconds the leader runs per second of the trailer's; margin:
    drafting's cost that its windows' scores do not show, as a fraction of plain's: the open mode's
    lead over the closed one counts only past it (to take the lead, to keep it, to explore)."""

    def __init__(self, window: int = 32, memory: int = 8, budget: float = 0.005, max_ratio: float = 100.0,
                 margin: float = 0.05):
        if window < 1 or memory < 1 or budget <= 0 or max_ratio < 0 or margin < 0:
            raise ValueError("window and memory must be >= 1, budget > 0, max_ratio and margin >= 0")
        self.window, self.memory, self.budget, self.max_ratio = window, memory, budget, max_ratio
        self.margin = margin
        self._buckets: dict[int, _Bucket] = {}
        self.summary: tuple[dict, ...] = ()  # replaced whole as a window ends: other threads may read it

    @staticmethod
    def bucket_of(load: int) -> int:
        """The power of two nearest to the load (in log scale)."""
        return 2 ** round(math.log2(max(load, 1)))

    def mode_at(self, load: int) -> str:
        """OPEN or CLOSED: the mode of the current window at this load (sequences in the engine)."""
        return self._bucket(load).window.mode

    def is_open(self, load: int) -> bool:
        """Whether the policy may draft in a step at this load."""
        return self.mode_at(load) == OPEN

    def record(self, load: int, num_decoding: int, tokens: int, seconds: float, plain_seconds: float) -> None:
        """One step: the load it ran at, its decoding sequences, the tokens they emitted, its seconds,
        and the cost table's seconds of a plain step of the same batch (prefill chunks in the pass
        included). A window that fills up is scored and the next one's mode is chosen."""
        if num_decoding < 1 or seconds <= 0 or plain_seconds <= 0:
            return
        bucket = self._bucket(load)
        w = bucket.window
        if w.skip:
            w.skip -= 1
            w.first_seconds = seconds
            return
        w.steps += 1
        w.tokens += tokens
        w.sequences += num_decoding
        w.seconds += seconds
        w.plain_seconds += plain_seconds
        if w.steps >= (self.window if w.mode == OPEN else max(1, self.window // 2)):
            bucket.scores.setdefault(w.mode, deque(maxlen=self.memory)).append(w.score())
            if w.switched:  # its first step beyond its mean step: what switching into its mode cost
                bucket.switch_seconds[w.mode] = max(0.0, w.first_seconds - w.seconds / w.steps)
            mode = self._next_mode(bucket, w.mode, w.seconds)
            bucket.window = _Window(mode, switched=mode != w.mode)
            self.summary = self._summarize()

    def _next_mode(self, bucket: _Bucket, last: str, seconds: float) -> str:
        bucket.last_seconds[last] = seconds
        for mode in MODES:
            if mode not in bucket.scores:
                return mode  # each mode's first window, open first
        # An open window's score leaves out what drafting costs around it (the switch into it, the
        # steps with a prefill chunk): on an H100 at 16 in flight open and closed windows scored
        # alike (1.16) while the server lost up to 7 % to plain. So the margin is read as drafting's
        # hidden cost: the lead that decides, prices a switch and an exploration is the one past it.
        lead = self._lead(bucket) - self.margin
        leader = OPEN if lead >= 0 else CLOSED
        if (bucket.leader is not None and leader != bucket.leader and last != leader
                and not self._pays_to_switch(bucket, leader, lead)):
            leader = bucket.leader  # a lead within what switching costs: modes that score alike stay put
        trailer = _other(leader)
        if last == trailer and leader == bucket.leader and self._latest_leads(bucket, trailer):
            return trailer  # an exploration that beat the leader runs on, until its median leads or it loses
        if last == trailer or leader != bucket.leader:
            bucket.leader, bucket.leader_seconds = leader, 0.0
            return leader
        bucket.leader_seconds += seconds
        # Exploring costs the trailer's window's seconds times the lead, plus the switches into the
        # trailer and back (a draft model catching up on the plain steps' text is one); spread over
        # leader + trailer time that is the budget once the leader has run cost / budget - trailer.
        trailing = bucket.last_seconds[trailer]
        cost = abs(lead) * trailing + bucket.switch_seconds.get(trailer, 0.0) + bucket.switch_seconds.get(leader, 0.0)
        wait = min(self.max_ratio * trailing, max(0.0, cost / self.budget - trailing))
        return trailer if bucket.leader_seconds >= wait else leader

    def _pays_to_switch(self, bucket: _Bucket, leader: str, lead: float) -> bool:
        """Whether a new leader's lead (past the margin), held for the time its median spans
        (`memory` of its windows), gains more than the switch into it costs."""
        return abs(lead) * self.memory * bucket.last_seconds.get(leader, 0.0) >= bucket.switch_seconds.get(leader, 0.0)

    def _latest_leads(self, bucket: _Bucket, mode: str) -> bool:
        """Whether the latest window of `mode` beat the other mode's median past the margin. A
        bucket's medians can hold what another time taught it (the tail of a burst, a warm-up):
        turning a median of 8 windows by explorations alone, each after its wait, takes many waits
        (at 1 in flight on the H200 a run that followed a burst read 1.05x plain where K = 4 read
        1.54x, and its guard mostly closed)."""
        scores = {mode: bucket.scores[mode][-1], _other(mode): statistics.median(bucket.scores[_other(mode)])}
        open_leads = scores[OPEN] / scores[CLOSED] - 1 - self.margin >= 0
        return open_leads == (mode == OPEN)

    @staticmethod
    def _lead(bucket: _Bucket) -> float:
        """How much the open mode's median score beats the closed one's (negative: it trails)."""
        return statistics.median(bucket.scores[OPEN]) / statistics.median(bucket.scores[CLOSED]) - 1

    def _bucket(self, load: int) -> _Bucket:
        return at_bucket(self._buckets, load, _Bucket)

    def _summarize(self) -> tuple[dict, ...]:
        """Per bucket, by load (its key is named batch): the mode now, each mode's median score and
        the windows it reads."""
        out = []
        for size in sorted(self._buckets):
            b = self._buckets[size]
            if not b.scores:
                continue  # steps seen, no window scored yet
            row = {"batch": size, "mode": b.window.mode}
            for mode in MODES:
                scores = b.scores.get(mode, ())
                row[f"{mode}_score"] = round(statistics.median(scores), 4) if scores else None
                row[f"{mode}_windows"] = len(scores)
            out.append(row)
        return tuple(out)
