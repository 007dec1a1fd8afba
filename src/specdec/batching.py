"""Many sequences at once: continuous batching over a slot model, with speculation per sequence.

A step runs every running sequence's next unit in one SlotModel.forward_ragged call:
- a prefill chunk (at most BatchConfig.prefill_chunk tokens of the prompt minus its last token)
  for a sequence still prefilling, so a long prompt holds the others up for one chunk at most;
- a verify of [pending, drafts...] for a decoding sequence (its own K, drafter and sampling).
Then the rejection rule settles every verify in one call (verify.ragged_outcome, each sequence
with its own sampling and generator), each slot is rolled back to its true text, and the tokens
are emitted. Sequences join between steps (in FIFO order while no slot is free) and leave when
done, freeing their slot.

Per sequence: the slot holds the emitted text minus its pending token (the newest, which the next
verify feeds first); draft, verify, keep a prefix, emit one more; the draws come from the
sequence's own generator in the same order whatever the batch; and a slot's rows do not depend on
the others: so a sequence's tokens are the ones it gets alone, whatever shares its batch and
whenever it arrived (rule 6 of the design). A single sequence is a batch of one (engine.Engine).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from specdec.batch_rule import StepRule, queue_rule, with_logprobs
from specdec.constraints.rounds import fit_drafts, grammar_drafts, start_constraint
from specdec.constraints.sequence import SequenceConstraint
from specdec.drafters.base import Draft, Drafter, DrafterFactory, empty_draft, propose_all
from specdec.guard import HeldLoad, ThroughputGuard, at_bucket
from specdec.generation import EmittedToken, GenerationConfig, Origin, SpecStats
from specdec.errors import InvalidRequestError
from specdec.models.slots import RaggedOutput, SlotModel
from specdec.speculation import (AcceptancePool, DraftCost, SequenceEvidence, SpeculationPolicy, StepCalibration,
                                 StepDecision, StepPlan, VerifyCostTable, choose_ks, fade_evidence,
                                 measure_verify_cost, step_seconds)
from specdec.transfers import token_tensor
from specdec.verify import Verdict


@dataclass(frozen=True)
class BatchConfig:
    """How the engine schedules: prefill_chunk is the most prompt tokens a sequence runs in one step;
    speculation: how many drafts each sequence verifies per step (default: its request's k).

    pipeline: while every running sequence decodes plainly (a drafter that drafts nothing, no
    features, no logprobs), queue each step before reading the tokens of the one before, so that the
    GPU runs a step while the host reads and checks the last one. None: on for a CUDA target, off
    elsewhere (on a CPU the work is synchronous: there is nothing to overlap, and a finishing
    sequence would only cost its extra row)."""

    prefill_chunk: int = 256
    speculation: SpeculationPolicy = SpeculationPolicy()
    pipeline: bool | None = None

    def __post_init__(self) -> None:
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")


@dataclass(frozen=True)
class SequenceResult:
    """A finished sequence: its generated tokens, why it stopped ("stop", "length", None if
    cancelled) and its stats."""

    request_id: int
    token_ids: tuple[int, ...]
    finish_reason: str | None
    stats: SpecStats


# Called after each step in which the sequence emitted tokens or finished, with that step's tokens
# (handle.done tells which). An asyncio server stepping the engine in a thread of its own can hand
# them to its loop: lambda h, tokens: loop.call_soon_threadsafe(queue.put_nowait, (tokens, h.done)).
Listener = Callable[["SequenceHandle", list[EmittedToken]], None]


class SequenceHandle:
    """One submitted sequence. Iterate it for its EmittedTokens (stepping the engine while none are
    ready; leaving the loop early cancels the sequence), or give submit a listener. token_ids,
    stats and finish_reason fill in as the engine steps. Iterate handles, or call result(), only
    from the thread that steps the engine."""

    def __init__(self, engine: "BatchedEngine", request_id: int, listener: Listener | None):
        self.request_id = request_id
        self.stats = SpecStats()
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.done = False
        self.cancelled = False
        self._engine = engine
        self._listener = listener
        self._ready: deque[EmittedToken] = deque()  # emitted, not yet iterated (without a listener)

    def __iter__(self) -> Iterator[EmittedToken]:
        try:
            while True:
                while self._ready:
                    yield self._ready.popleft()
                if self.done:
                    return
                self._engine.step()
        finally:
            if not self.done:
                self.cancel()

    def cancel(self) -> None:
        """Stop generating: the sequence leaves at the next step and frees its slot."""
        self.cancelled = True

    close = cancel  # as engine.Generation.close

    def result(self) -> SequenceResult:
        """Step the engine until this sequence is done; its result."""
        while not self.done:
            self._engine.step()
        return SequenceResult(self.request_id, tuple(self.token_ids), self.finish_reason, self.stats)

    def _emit(self, tokens: list[EmittedToken], finished: bool) -> None:
        self.token_ids += [t.token_id for t in tokens]
        self.done = finished
        if self._listener is None:
            self._ready.extend(tokens)
        elif tokens or finished:
            self._listener(self, tokens)


@dataclass(eq=False)
class _Sequence:
    """The engine's record of one sequence (its handle is the caller's view)."""

    handle: SequenceHandle
    prompt: list[int]
    config: GenerationConfig
    drafter: Drafter
    generator: torch.Generator
    context: list[int] = field(default_factory=list)  # prompt + generated
    slot: int = -1
    prefilled: int = 0  # prompt tokens in the slot so far (the prompt minus its last when done)
    pending: torch.Tensor | None = None  # [1] the newest token, fed first by the next verify
    text_checked: int = 0  # generated tokens already checked for stop strings
    running: bool = False  # holds a slot (admitted, not yet left)
    drafted_upto: int = -1  # auto mode: the text's length when its drafter last proposed (-1: never yet)
    evidence: SequenceEvidence = field(default_factory=SequenceEvidence)  # auto mode: its judged drafts, fading
    constraint: SequenceConstraint | None = None  # structured output: its grammar's matcher (constraints/)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt) - 1

    @property
    def layers(self) -> tuple[int, ...] | None:
        """The feature layers its drafter reads, or None when it reads no features."""
        return self.drafter.feature_layers if self.drafter.needs_target_features else None

    @property
    def settles_plainly(self) -> bool:
        """A plain step of it needs nothing read back but the token (no features, no logprobs, no
        grammar: its next mask needs the token)."""
        return self.layers is None and self.config.logprobs is None and self.constraint is None

    @property
    def auto_may_draft(self) -> bool:
        """Whether the auto policy may give it drafts: its drafter drafts, and its sample does not
        hang on a seed (a seeded sample's draws depend on where drafts were verified, and auto's K on
        the batch: rule 6 keeps such a sequence plain, its sample its seed's alone)."""
        sampling = self.config.sampling
        return not self.drafter.drafts_nothing and (sampling.greedy or sampling.seed is None)

    @property
    def next_is_last(self) -> bool:
        """Whether the token of the step in flight is its last by length (context lags that step)."""
        return self.remaining <= 1

    @property
    def remaining(self) -> int:
        """Tokens it may still generate."""
        return self.config.max_new_tokens - (len(self.context) - len(self.prompt))

    def next_k(self, k: int | None = None) -> int:
        """Drafts this round, at most k (default: its request's): a round emits up to k + 1 tokens,
        never past max_new_tokens."""
        return max(0, min(self.config.k if k is None else k, self.remaining - 1))


@dataclass(frozen=True)
class _Unit:
    """A sequence's share of a step: tokens [n] for its slot; draft None for a prefill chunk; mask:
    a constrained verify's allowed tokens, bool [n, V] (constraints/), else None."""

    seq: _Sequence
    tokens: torch.Tensor
    draft: Draft | None
    mask: torch.Tensor | None = None


@dataclass(frozen=True)
class _Flight:
    """A step queued on the device: its units, the forward's output, and the rule's outcome on its
    way to the host (None when every unit was a prefill chunk)."""

    units: list[_Unit]
    out: RaggedOutput
    rule: StepRule | None

    @property
    def plain(self) -> bool:
        """Every unit a plain step (a verify of no drafts) of a sequence that settles plainly."""
        return all(u.draft is not None and len(u.draft) == 0 and u.seq.settles_plainly for u in self.units)

    @functools.cached_property
    def ks(self) -> tuple[int, ...]:
        """The drafts each decoding unit verifies, in batch order."""
        return tuple(len(u.draft) for u in self.units if u.draft is not None)

    @functools.cached_property
    def prefill_rows(self) -> tuple[int, ...]:
        """The rows of its prefill chunks (they share the pass with the verifies)."""
        return tuple(int(u.tokens.shape[0]) for u in self.units if u.draft is None)


class BatchedEngine:
    """Speculative decoding of many sequences at once over a slot model (continuous batching).

    drafter_factory: () -> a fresh Drafter for each sequence submitted without its own.
    eos_token_ids: ids that end a sequence. decode: list[int] -> str, needed for stop strings.
    Not thread-safe: call submit() and step() from one thread (a server: its engine thread).
    """

    def __init__(self, target: SlotModel, drafter_factory: DrafterFactory, eos_token_ids=(), decode=None,
                 config: BatchConfig = BatchConfig(), grammars=None):
        """grammars: a constraints.grammar.GrammarCompiler for the target's tokenizer, needed to serve
        GenerationConfig.constraint (None: constrained requests are refused)."""
        self.target = target
        self.grammars = grammars
        self.drafter_factory = drafter_factory
        self.eos_token_ids = frozenset(eos_token_ids)
        self.decode = decode
        self.config = config
        self._free = list(range(target.max_slots))  # a heap: the lowest free slot goes first
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._ids = itertools.count()
        policy = config.speculation
        self._verify_cost = policy.verify_cost
        if policy.mode == "auto" and self._verify_cost is None:
            self._verify_cost = measure_verify_cost(target, policy.k)
        # By the guard's load bucket: what drafting cost at 32 in flight is no price for it at 1.
        self._draft_costs: dict[int, DraftCost] = {}
        self._calibrations: dict[int, StepCalibration] = {}
        self._acceptance = AcceptancePool(policy)
        self._guard = (ThroughputGuard(policy.guard_window, margin=policy.min_gain)
                       if policy.mode == "auto" and policy.guard_window else None)
        self._held_load = HeldLoad(policy.load_hold)  # the guard's key, set as each step begins
        self._planned_for: tuple | None = None  # the inputs of the latest auto plan, and the plan
        self._latest_plan: StepPlan | None = None
        self._plain_batch: tuple | None = None  # the batch (and fade period) the latest plain plan holds for
        self._draft_span = DeviceSpan(target.device)  # this step's drafting, read after its settle
        self._draft_passes = 0  # the passes of a drafting still to be recorded (0: none)
        self._caught_up_on = 0  # tokens this step's drafters caught up on (0: steady drafting, or none)
        self._steps = 0  # steps run (the auto policy fades each sequence's evidence by them)
        self.last_decision: StepDecision | None = None  # the latest step's K per sequence (for a server)
        self._pipeline = target.device.type == "cuda" if config.pipeline is None else config.pipeline
        self._ahead: _Flight | None = None  # a plain step queued before the one before it was read
        self._no_draft = empty_draft(target.device)

    @property
    def verify_cost(self) -> VerifyCostTable | None:
        """The target's cost table the auto policy prices steps by (measured at start-up unless the
        policy brought one); None in the other modes."""
        return self._verify_cost

    @property
    def guard(self) -> ThroughputGuard | None:
        """The auto policy's check on its realized throughput, by batch size (None without one)."""
        return self._guard

    @property
    def busy(self) -> bool:
        """Whether any sequence is running or waiting for a slot."""
        return bool(self._running or self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def submit(self, prompt: list[int], config: GenerationConfig, drafter: Drafter | None = None,
               listener: Listener | None = None) -> SequenceHandle:
        """Queue one sequence; it joins the batch at the next step with a free slot. drafter: its own
        (a fresh instance, never shared), else one from drafter_factory."""
        check_request(prompt, config, self.target.max_length, self.decode)
        drafter = self.drafter_factory() if drafter is None else drafter
        # A cancelled sequence's drafter is free: it ends (Drafter.end) before the next admission begins it.
        if any(s.drafter is drafter and not s.handle.cancelled for s in itertools.chain(self._running, self._waiting)):
            raise ValueError("this drafter already drafts for another sequence: give each sequence its own")
        handle = SequenceHandle(self, next(self._ids), listener)
        generator = config.sampling.make_generator(self.target.device)
        constraint = start_constraint(self.grammars, config, self.target.vocab_size, self.target.device)
        self._waiting.append(_Sequence(handle, list(prompt), config, drafter, generator, context=list(prompt),
                                       constraint=constraint))
        return handle

    def generate(self, prompts: Sequence[list[int]], config: GenerationConfig) -> list[SequenceResult]:
        """Submit every prompt, run until all are done; their results in order."""
        handles = [self.submit(p, config) for p in prompts]
        self.run()
        return [h.result() for h in handles]

    def run(self) -> None:
        """Step until no sequence is running or waiting."""
        while self.step():
            pass

    def step(self) -> bool:
        """Admit, run every running sequence's next unit in one forward, settle, emit. Returns
        whether any sequence is still running or waiting. With pipelining a plain step may already
        be queued: then this call queues the one after it (while the batch stays plain) and settles it."""
        self._drop_cancelled()
        self._admit()
        if not self._running:
            return self.busy
        for cost in self._draft_costs.values():
            cost.tick()
        self._steps += 1
        if self.config.speculation.mode == "auto":
            fade_evidence(self.config.speculation, self._steps, [s.evidence for s in self._running])
        start = time.perf_counter()
        self._held_load.start(len(self._running) + len(self._waiting), start)
        flight, self._ahead = self._still_ahead(), None
        drafted = start
        if flight is None:
            units = self._plan()
            drafted = time.perf_counter()
            flight = self._launch(units)
        if self._may_pipeline(flight):
            self._ahead = self._launch_ahead(flight)
        emitted = self._settle(flight)
        settled = time.perf_counter()
        if self._draft_passes:  # the device is past this step's drafting now: its span reads without a wait
            self._record_drafting(self._draft_span.seconds())
        self._leave([unit.seq for unit, _, reason in emitted if reason])
        phases = (drafted - start, settled - drafted, time.perf_counter() - settled)
        for unit, tokens, reason in emitted:
            self._charge(unit, *phases)
            unit.seq.handle.finish_reason = reason
            unit.seq.handle._emit(tokens, finished=reason is not None)  # listeners' time is not ours
        ended = time.perf_counter()
        if self.config.speculation.mode == "auto":
            self._calibrate(flight, ended - start)
        if self._guard is not None:
            self._guard_record(flight, emitted, ended - start, self._load)
        self._held_load.end(ended, empty=not self.busy)
        return self.busy

    def _guard_record(self, flight: _Flight, emitted: list, seconds: float, load: int) -> None:
        """A step for the guard: the load it ran at, its decoding sequences, the tokens they emitted,
        and the predicted seconds of a plain step of the same batch. Not a step with prefill chunks:
        the table prices their rows by extrapolation, and how many such steps a window holds (an
        open window is twice as long as a closed one) would weigh in its score more than its mode;
        on the embedded model at 16 in flight open windows that hardly drafted outscored closed ones
        by 5-15 %."""
        n = len(flight.ks)
        if n == 0 or flight.prefill_rows or not any(u.seq.auto_may_draft for u in flight.units if u.draft is not None):
            return  # prefill in the pass, or no sequence that could draft: no evidence for either mode
        plain = step_seconds(self._verify_cost, (0,) * n, (), 0.0)
        self._guard.record(load, n, sum(len(tokens) for _, tokens, _ in emitted), seconds, plain)

    @property
    def _draft_cost(self) -> DraftCost:
        """The drafter's cost at the load now (its guard bucket's). Kept for the whole engine, a cost
        learnt at 32 in flight (a pass over 32 rows, their drafts gathered one by one) priced drafting
        at 1 in flight after a burst, and held it there in plain steps until forgotten."""
        prior = self.config.speculation.draft_seconds_per_pass
        return at_bucket(self._draft_costs, self._load, lambda: DraftCost(prior))

    @property
    def _calibration(self) -> StepCalibration:
        """The step calibration at the load now (its guard bucket's), as _draft_cost."""
        return at_bucket(self._calibrations, self._load, StepCalibration)

    @property
    def _load(self) -> int:
        """The guard's key: the sequences the engine holds, decoding, prefilling or waiting, as this
        step began, held at its peak over the latest steps (HeldLoad)."""
        return self._held_load.value

    def _drafting(self) -> str | None:
        """The guard's mode at the load now, for StepDecision (None without a guard)."""
        return None if self._guard is None else self._guard.mode_at(self._load)

    def _launch(self, units: list[_Unit]) -> _Flight:
        """Queue a step: one forward over every unit, then the rule over its verifies."""
        out = self.target.forward_ragged([u.seq.slot for u in units], [u.tokens for u in units],
                                         logits=[u.draft is not None for u in units],
                                         features=[u.seq.layers for u in units])
        rule = queue_rule([u.draft for u in units], [u.seq.config.sampling for u in units],
                          [u.seq.generator for u in units], out, [u.mask for u in units])
        return _Flight(units, out, rule)

    def _still_ahead(self) -> _Flight | None:
        """The plain step queued by the last call, unless none of its sequences still runs."""
        ahead = self._ahead
        return ahead if ahead is not None and any(u.seq.running for u in ahead.units) else None

    def _may_pipeline(self, flight: _Flight) -> bool:
        """Whether the next step may be queued before this one is read: this one and the next are
        plain for every running sequence (all are in it) and no waiting sequence could take a slot
        it frees by length. (A slot freed by an end-of-sequence token goes to a waiting sequence one
        step later.)"""
        if not self._pipeline or not flight.plain:
            return False
        in_flight = {id(u.seq) for u in flight.units}
        if not all(id(s) in in_flight for s in self._running):
            return False  # a sequence admitted since it was queued: it prefills next
        if self._waiting and (self._free or any(s.next_is_last for s in self._running)):
            return False
        return self._next_step_is_plain()

    def _launch_ahead(self, flight: _Flight) -> _Flight | None:
        """Queue the next plain step, fed with this step's tokens while they are still on the device
        (the same draws from each generator in the same order as one step at a time). A sequence
        whose token in flight is its last by length brings no row; one that turns out to stop at it
        (end of sequence, stop string) leaves with its slot released, the extra row with it."""
        running = [(i, u.seq) for i, u in enumerate(flight.units) if u.seq.running and not u.seq.next_is_last]
        if not running:
            return None
        units = [_Unit(seq, flight.rule.next_token_of(i), self._no_draft) for i, seq in running]
        policy = self.config.speculation
        self.last_decision = StepDecision(policy.mode, tuple(s.handle.request_id for _, s in running),
                                          (0,) * len(units), len(units), drafting=self._drafting())
        return self._launch(units)

    def _drop_cancelled(self) -> None:
        """Cancelled sequences leave: running ones free their slot, waiting ones their place."""
        self._leave([s for s in self._running if s.handle.cancelled])
        for seq in [s for s in self._waiting if s.handle.cancelled]:
            self._waiting.remove(seq)
            seq.handle._emit([], finished=True)

    def _admit(self) -> None:
        """Give free slots to waiting sequences, first come first served; their drafters begin."""
        while self._free and self._waiting:
            seq = self._waiting.popleft()
            seq.slot = heapq.heappop(self._free)
            start = time.perf_counter()
            seq.drafter.begin(list(seq.prompt))
            if not seq.prefilling:  # a one-token prompt: its only token is the pending one
                seq.pending = self._tensor(seq.prompt[-1:])
            seq.handle.stats.prefill_time += time.perf_counter() - start
            seq.running = True
            self._running.append(seq)

    def _leave(self, done: list[_Sequence]) -> None:
        for seq in done:
            self._running.remove(seq)
            seq.running = False
            seq.drafter.end()  # e.g. its slot of a shared draft cache goes back
            self.target.release(seq.slot)
            heapq.heappush(self._free, seq.slot)
            if seq.handle.cancelled and not seq.handle.done:
                seq.handle._emit([], finished=True)

    def _plan(self) -> list[_Unit]:
        """Every running sequence's unit, in batch order: prefill chunks, and verifies after drafting."""
        decoding = [s for s in self._running if not s.prefilling]
        ks = self._decide(decoding)
        constraints = [s.constraint for s in decoding]  # the grammar's drafts go first, free (constraints/)
        forced, ks = grammar_drafts(constraints, ks, [s.next_k() for s in decoding])
        timed = any(ks) and self.config.speculation.mode == "auto"
        if timed:
            self._draft_span.start()
        drafts = propose_all([s.drafter for s in decoding], [s.context + f for s, f in zip(decoding, forced)], ks,
                             [s.config.sampling for s in decoding], [s.generator for s in decoding])
        if timed:
            self._draft_span.stop()
        self._caught_up_on = self._note_drafts(decoding, ks) if timed else 0
        drafts, masks = fit_drafts(constraints, drafts, [s.generator for s in decoding])
        draft_of = {id(s): (d or empty_draft(self.target.device), m) for s, d, m in zip(decoding, drafts, masks)}
        units = []
        for seq in self._running:
            if seq.prefilling:
                end = min(seq.prefilled + self.config.prefill_chunk, len(seq.prompt) - 1)
                units.append(_Unit(seq, self._tensor(seq.prompt[seq.prefilled:end]), None))
            else:
                draft, mask = draft_of[id(seq)]
                units.append(_Unit(seq, torch.cat([seq.pending, draft.tokens]), draft, mask))
        return units

    def _note_drafts(self, decoding: list[_Sequence], ks: list[int]) -> int:
        """Note this step's drafting for the auto policy's draft cost, read from its span once the
        step has settled (no wait here: the host queues the verify while the draft passes run).
        Where a drafter caught up on more text than one round leaves unseen (its first draft reads
        the prompt; after plain steps it reads every token since), the step's seconds are the
        catching up's: they price catching up, not a pass, and are no evidence for the calibration
        either. Returns the tokens they caught up on (0: none did)."""
        drafting = [s for s, k in zip(decoding, ks) if k]
        caught_up_on = sum(self._unseen(s) for s in drafting if self._behind(s))
        self._draft_passes = max(ks)
        for seq in drafting:
            seq.drafted_upto = len(seq.context)
        return caught_up_on

    def _record_drafting(self, seconds: float) -> None:
        if self._caught_up_on:
            self._draft_cost.record_catch_up(seconds, self._draft_passes, self._caught_up_on)
        else:
            self._draft_cost.record(seconds, self._draft_passes)
        self._draft_passes = 0

    def _behind(self, seq: _Sequence) -> bool:
        """Whether its drafter has not seen more text than one round leaves unseen: a draft now
        catches it up first."""
        return seq.drafted_upto < 0 or len(seq.context) - seq.drafted_upto > self.config.speculation.k + 1

    @staticmethod
    def _unseen(seq: _Sequence) -> int:
        """The tokens of its text its drafter has not read (all of it before its first draft)."""
        return len(seq.context) - max(seq.drafted_upto, 0)

    def _entry_costs(self, decoding: list[_Sequence]) -> tuple[float, ...]:
        """By sequence, what drafting costs it this step beyond its passes: catching its drafter up
        on the text it has not seen, spread over the steps it may then draft on (the evidence's
        half-life, or fewer where fewer tokens remain). Drafting now and then, a sequence pays a
        catch-up each time, which the passes' cost does not show."""
        per_token = self._draft_cost.per_unseen_token
        if not per_token:
            return ()
        policy = self.config.speculation
        return tuple(per_token * self._unseen(s) / max(1, min(policy.evidence_half_life, s.remaining))
                     if self._behind(s) else 0.0 for s in decoding)

    def _decide(self, decoding: list[_Sequence]) -> list[int]:
        """K per decoding sequence under the speculation policy; the decision goes to last_decision."""
        policy, ids = self.config.speculation, tuple(s.handle.request_id for s in decoding)
        if policy.mode != "auto":
            ks = [s.next_k(policy.k if policy.mode == "fixed" else None) for s in decoding]
            self.last_decision = StepDecision(policy.mode, ids, tuple(ks), len(self._running))
            return ks
        if not any(s.auto_may_draft for s in decoding):  # nothing to price (a --draft none server)
            self.last_decision = StepDecision("auto", ids, (0,) * len(decoding), len(self._running),
                                              drafting=self._drafting())
            return [0] * len(decoding)
        plan = self._auto_plan(decoding)
        cost = self._draft_cost
        self.last_decision = StepDecision("auto", ids, plan.ks, len(self._running), plan.predicted_tokens_per_second,
                                          plan.plain_tokens_per_second, self._drafting(), (cost.fixed, cost.per_pass))
        return list(plan.ks)

    def _calibrate(self, flight: _Flight, observed: float) -> None:
        """A step's seconds, all of its call as the guard reads them (its tokens emitted included),
        against the model's prediction for it (StepCalibration); not a step whose drafters caught up
        on unseen text (_note_drafts). Read only up to the settle, a pipelined plain step looked
        shorter than it is by the emitting of the step before (its pass ran meanwhile), and a
        drafting step did not show its own: in a server at 16 in flight on an H100, where emitting
        feeds 16 streams, drafting steps read 1.3-1.4 times plain ones against the model, where
        stepped in process they read 1.1, and the policy planned plain steps there while K = 4
        served 1.10-1.20x plain (results/serving-h100-trace-20261206-1113.*)."""
        ks = flight.ks
        if any(ks) and self._caught_up_on:
            return
        cost = self._draft_cost
        predicted = step_seconds(self._verify_cost, ks, flight.prefill_rows, cost.per_pass, cost.fixed)
        self._calibration.record(observed, predicted, any(ks))

    def _auto_plan(self, decoding: list[_Sequence]) -> StepPlan:
        """The auto policy's K for each decoding sequence (none for one whose drafter drafts nothing).

        Through a plain stretch no evidence comes in: between two fades of the evidence, a plain plan
        for the same batch (no sequence joined, left or prefilling) holds, the calibration and the
        draft cost read again at the next fade. At high load, where the host's time a step is the
        server's, the policy then costs a comparison a step rather than a look at every sequence."""
        policy = self.config.speculation
        batch = (tuple(s.handle.request_id for s in decoding), self._steps // (policy.evidence_half_life // 2))
        if batch == self._plain_batch and len(decoding) == len(self._running):
            return self._latest_plan
        if self._guard is not None and not self._guard.is_open(self._load):
            return self._closed_plan(decoding)
        alphas = self._acceptance.estimates([(s.drafter.name, s.evidence.accepted, s.evidence.judged)
                                             for s in decoding])
        caps = [s.next_k(policy.k) if s.auto_may_draft else 0 for s in decoding]
        other_rows = self._prefill_rows()
        # The same inputs give the same plan: through a plain stretch only the calibration moves,
        # read to 2 %, so at high load (where the host's time a step is the server's) it is reused.
        cost = self._draft_cost
        per_pass, fixed = cost.per_pass, cost.fixed
        factor, entry = self._calibration.factor_to(0.02), self._entry_costs(decoding)
        inputs = (tuple(alphas), tuple(caps), per_pass, fixed, tuple(other_rows), factor, entry)
        if inputs != self._planned_for:
            self._planned_for = inputs
            self._latest_plan = choose_ks(alphas, caps, self._verify_cost, per_pass, other_rows, policy.min_gain,
                                          factor, entry, fixed)
        self._plain_batch = None if any(self._latest_plan.ks) or other_rows else batch
        return self._latest_plan

    def _prefill_rows(self) -> tuple[int, ...]:
        """The rows of this step's prefill chunks (they share the pass with the verifies)."""
        return tuple(min(self.config.prefill_chunk, len(s.prompt) - 1 - s.prefilled)
                     for s in self._running if s.prefilling)

    def _closed_plan(self, decoding: list[_Sequence]) -> StepPlan:
        """The plain step the guard holds this batch size to while drafting does not pay."""
        plain = step_seconds(self._verify_cost, (0,) * len(decoding), self._prefill_rows(), 0.0)
        return StepPlan((0,) * len(decoding), float(len(decoding)), plain, plain)

    def _next_step_is_plain(self) -> bool:
        """Whether the step after the one in flight will be plain for every running sequence: always
        for those that draft nothing; in auto mode, when none may draft (_decide's own shortcut) or the
        policy says K = 0 for all now (the plain step in flight brings no evidence that could change
        its mind, only a token more each)."""
        if all(s.drafter.drafts_nothing for s in self._running):
            return True
        if self.config.speculation.mode != "auto":
            return False
        return not any(s.auto_may_draft for s in self._running) or not any(self._auto_plan(self._running).ks)

    def _settle(self, flight: _Flight) -> list[tuple[_Unit, list[EmittedToken], str | None]]:
        """Read the step (its one wait for the device); each unit whose sequence still runs, with its
        tokens emitted this step and its finish reason (None: it goes on)."""
        if flight.rule is None:  # only prefill chunks: nothing to read, but wait so its time is its own
            _wait_for(self.target.device)  # (not the next step's, the first decode: its tokens per second)
        rounds = flight.rule.read() if flight.rule is not None else {}
        ahead = {id(u.seq) for u in self._ahead.units} if self._ahead is not None else set()
        results = []
        for i, unit in enumerate(flight.units):
            seq, features = unit.seq, flight.out.features[i]
            if not seq.running:
                continue  # it left (cancelled, or stopped at the step before) after this step was queued
            if unit.draft is None:
                results.append((unit, [], self._prefilled(unit, features)))
                continue
            tokens, reason = self._apply(seq, *rounds[i], features, rolled_ahead=id(seq) in ahead)
            if seq.config.logprobs is not None:  # only then: a read and a softmax more
                tokens = with_logprobs(tokens, flight.out.logits_of(i), seq.config, unit.mask)
            results.append((unit, tokens, reason))
        return results

    def _prefilled(self, unit: _Unit, features: torch.Tensor | None) -> None:  # never finishes a sequence
        """A prefill chunk ran; once the whole prompt but its last token is in, the sequence decodes."""
        seq = unit.seq
        seq.prefilled += int(unit.tokens.shape[0])
        if features is not None:
            seq.drafter.observe(features)
        if not seq.prefilling:
            seq.pending = self._tensor(seq.prompt[-1:])

    def _apply(self, seq: _Sequence, verdict: Verdict, kept: list[int], next_token: torch.Tensor,
               features: torch.Tensor | None, rolled_ahead: bool = False) -> tuple[list[EmittedToken], str | None]:
        """Keep the verdict's prefix: roll the slot and the drafter back, emit, check for a stop.
        rolled_ahead: the next plain step is already queued; the slot holds its token too, and this
        plain round has nothing to forget."""
        if features is not None:  # the pending token and the kept drafts are now part of the text
            seq.drafter.observe(features[: verdict.num_accepted + 1])
        if not rolled_ahead:
            self._rollback(seq, len(seq.context) + verdict.num_accepted)
        seq.pending = next_token.reshape(1)
        origins = [Origin.ACCEPTED] * verdict.num_accepted + [
            Origin.BONUS if verdict.all_accepted else Origin.RECOVERED]
        stats, emitted, reason = seq.handle.stats, [], None
        tokens = kept + [verdict.next_token]
        if seq.constraint is not None:  # its matcher rolls back with the slot; the round ends with its grammar
            tokens = self._settle_constraint(seq, verdict, tokens)
        for token, origin in zip(tokens, origins):
            seq.context.append(token)
            emitted.append(EmittedToken(token, origin, stats.rounds))
            reason = self._finish_reason(seq)
            if reason:
                break
        if reason is None and seq.constraint is not None and seq.constraint.stopped:
            reason = "stop"
        stats.record_round(verdict, len(emitted))
        if verdict.num_drafted:
            self._acceptance.add(seq.drafter.name, verdict.num_accepted, verdict.num_judged)
            seq.evidence.add(verdict.num_accepted, verdict.num_judged)
        seq.text_checked = len(seq.context) - len(seq.prompt)
        return emitted, reason

    @staticmethod
    def _settle_constraint(seq: _Sequence, verdict: Verdict, tokens: list[int]) -> list[int]:
        """The constrained round's tokens to emit (SequenceConstraint.settle), its grammar counts recorded."""
        constraint = seq.constraint
        tokens = constraint.settle(verdict.num_drafted, verdict.num_accepted, tokens)
        seq.handle.stats.record_grammar(*constraint.grammar_counts(verdict.num_accepted),
                                        sum(constraint.single_rows[:len(tokens)]), constraint.take_seconds())
        return tokens

    def _rollback(self, seq: _Sequence, valid: int) -> None:
        """The slot and the drafter keep the first `valid` tokens of the text, forget the rest."""
        self.target.rollback(seq.slot, valid)
        seq.drafter.commit(valid)

    def _finish_reason(self, seq: _Sequence) -> str | None:
        generated = seq.context[len(seq.prompt):]
        if not seq.config.ignore_eos and generated[-1] in self.eos_token_ids:
            return "stop"
        if seq.config.stop:
            # Only text that the newest tokens could complete needs checking; decode a few tokens back.
            window = self.decode(generated[max(0, seq.text_checked - 8):])
            if any(s in window for s in seq.config.stop):
                return "stop"
        if len(generated) >= seq.config.max_new_tokens:
            return "length"
        return None

    @staticmethod
    def _charge(unit: _Unit, draft: float, verify: float, other: float) -> None:
        """Each sequence is charged the step's whole phases: the time it waited for the batch. Wall
        clock: on a GPU the step ends with its one read (the verdicts), so a step's total is exact
        and its split between the phases is where the host waited."""
        stats = unit.seq.handle.stats
        if unit.draft is None:
            stats.prefill_time += draft + verify + other
        else:
            stats.draft_time += draft
            stats.verify_time += verify
            stats.other_time += other

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        return token_tensor(ids, self.target.device)


class DeviceSpan:
    """Seconds between two points of the work queued on a device, read once the device is past the
    second without waiting there: CUDA events on a GPU (the host goes on queuing while the work
    runs), the host's clock on a CPU (its work has run by the time it is queued)."""

    def __init__(self, device: torch.device):
        self._marks = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
            if device.type == "cuda" else None
        self._started = self._seconds = 0.0

    def start(self) -> None:
        if self._marks is None:
            self._started = time.perf_counter()
        else:
            self._marks[0].record()

    def stop(self) -> None:
        if self._marks is None:
            self._seconds = time.perf_counter() - self._started
        else:
            self._marks[1].record()

    def seconds(self) -> float:
        if self._marks is None:
            return self._seconds
        self._marks[1].synchronize()  # at once where the device is past it already
        return self._marks[0].elapsed_time(self._marks[1]) / 1000.0


def _wait_for(device: torch.device) -> None:
    """Wait for what is queued on the device (on a CPU it has run already)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_request(prompt: list[int], config: GenerationConfig, max_length: int, decode) -> None:
    """The InvalidRequestError for a request the engine cannot serve, or nothing."""
    if not prompt:
        raise InvalidRequestError("the prompt is empty: give at least one token of text")
    if config.stop and decode is None:
        raise InvalidRequestError("stop strings need a decode function (pass the tokenizer's decode)")
    if len(prompt) + config.max_new_tokens > max_length:
        raise InvalidRequestError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({config.max_new_tokens}) exceeds the "
            f"target's context of {max_length} tokens; shorten the prompt or lower max_new_tokens"
        )
