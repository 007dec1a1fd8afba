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
whenever it arrived (rule 6 of the design). A single sequence is a batch of one (single.Engine).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from specdec.batch_rule import StepRule, queue_rule, with_logprobs
from specdec.constraints.rounds import fit_drafts, grammar_drafts, start_constraint, start_masks
from specdec.constraints.sequence import SequenceConstraint
from specdec.engine.controller import Hook, Plan, RequestK, SequenceView, Speculation, StepRecord, StepTrace
from specdec.drafters.base import Draft, Drafter, DrafterFactory, empty_draft, propose_all
from specdec.generation import EmittedToken, GenerationConfig, Origin, RoundTree, SpecStats
from specdec.errors import InvalidRequestError
from specdec.models.slots import RaggedOutput, SlotModel
from specdec.stops import TextStream
from specdec.transfers import token_tensor
from specdec.tree_rule import TreeVerdict
from specdec.verify import Verdict


@dataclass(frozen=True)
class BatchConfig:
    """How the engine schedules: prefill_chunk is the most prompt tokens a sequence runs in one step;
    speculation: the controller of how many drafts each sequence verifies per step (controller.py;
    default: its request's k).

    pipeline: while every running sequence decodes plainly (a drafter that drafts nothing, no
    features, no logprobs), queue each step before reading the tokens of the one before, so that the
    GPU runs a step while the host reads and checks the last one. None: on for a CUDA target, off
    elsewhere (on a CPU the work is synchronous: there is nothing to overlap, and a finishing
    sequence would only cost its extra row)."""

    prefill_chunk: int = 256
    speculation: Speculation = RequestK()
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
    stats and finish_reason fill in as the engine steps. text: the answer's text as far as it is
    final (stops.TextStream: stop strings cut, nothing shown that may be taken back), kept by the
    engine where someone reads it: the sequence has stop strings (the engine finds them there) or a
    listener (which reads `text.shown` after each step), and the engine a decode function; else None. Iterate handles, or call result(), only from the
    thread that steps the engine."""

    def __init__(self, engine: "BatchedEngine", request_id: int, listener: Listener | None,
                 text: TextStream | None = None):
        self.request_id = request_id
        self.text = text
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
        if self.text is not None:
            self.text.update(self.token_ids, final=finished)
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
    running: bool = False  # holds a slot (admitted, not yet left)
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
    def view(self) -> SequenceView:
        """What the speculation controller sees of it (as a decoding sequence)."""
        sampling = self.config.sampling
        return SequenceView(self.handle.request_id, self.config.k, self.remaining - 1,
                            not self.drafter.drafts_nothing, not sampling.greedy and sampling.seed is not None,
                            self.drafter.tree is not None)

    @property
    def next_is_last(self) -> bool:
        """Whether the token of the step in flight is its last by length (context lags that step)."""
        return self.remaining <= 1

    @property
    def remaining(self) -> int:
        """Tokens it may still generate."""
        return self.config.max_new_tokens - (len(self.context) - len(self.prompt))


@dataclass(frozen=True)
class _Unit:
    """A sequence's share of a step: tokens [n] for its slot; draft None for a prefill chunk; mask:
    a constrained verify's allowed tokens, int32 [n, W] packed (constraints/; set once the step is launched),
    else None."""

    seq: _Sequence
    tokens: torch.Tensor
    draft: Draft | None
    mask: torch.Tensor | None = None


@dataclass(frozen=True)
class _Flight:
    """A step queued on the device: its units, the forward's output, the rule's outcome on its way
    to the host (None when every unit was a prefill chunk), and the plan its drafts came from (the
    decoding units' views, the load it was planned at)."""

    units: list[_Unit]
    out: RaggedOutput
    rule: StepRule | None
    plan: Plan
    views: tuple[SequenceView, ...]
    load: int

    @property
    def plain(self) -> bool:
        """Every unit a plain step (a verify of no drafts) of a sequence that settles plainly."""
        return all(u.draft is not None and len(u.draft) == 0 and u.seq.settles_plainly for u in self.units)

    @functools.cached_property
    def ks(self) -> tuple[int, ...]:
        """The drafts each decoding unit verifies, in batch order."""
        return tuple(len(u.draft) for u in self.units if u.draft is not None)

    @functools.cached_property
    def prefill_rows(self) -> int:
        """The rows of its prefill chunks (they share the pass with the verifies)."""
        return sum(int(u.tokens.shape[0]) for u in self.units if u.draft is None)


class BatchedEngine:
    """Speculative decoding of many sequences at once over a slot model (continuous batching).

    drafter_factory: () -> a fresh Drafter for each sequence submitted without its own.
    eos_token_ids: ids that end a sequence. decode: list[int] -> str, needed for stop strings.
    on_step: called with each step's StepTrace (what the speculation controller planned and why,
    what happened) once the step has settled; last_step holds the latest. grammars: a
    constraints.grammar.GrammarCompiler for the target's tokenizer, needed to serve
    GenerationConfig.constraint (None: constrained requests are refused).
    Not thread-safe: call submit() and step() from one thread (a server: its engine thread).
    """

    def __init__(self, target: SlotModel, drafter_factory: DrafterFactory, eos_token_ids=(), decode=None,
                 config: BatchConfig = BatchConfig(), on_step: Hook | None = None, grammars=None):
        self.target = target
        self.grammars = grammars
        self.drafter_factory = drafter_factory
        self.eos_token_ids = frozenset(eos_token_ids)
        self.decode = decode
        self.config = config
        self.controller = config.speculation.controller()
        self.on_step = on_step
        self.last_step: StepTrace | None = None
        self._free = list(range(target.max_slots))  # a heap: the lowest free slot goes first
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._ids = itertools.count()
        self._pipeline = target.device.type == "cuda" if config.pipeline is None else config.pipeline
        self._ahead: _Flight | None = None  # a plain step queued before the one before it was read
        self._no_draft = empty_draft(target.device)

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
        wanted = self.decode is not None and (config.stop or listener is not None)  # no decoding nobody reads
        text = TextStream(self.decode, config.stop) if wanted else None
        handle = SequenceHandle(self, next(self._ids), listener, text)
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
        """Admit, run every running sequence's next unit in one forward, settle, emit, and tell the
        controller. Returns whether any sequence is still running or waiting. With pipelining a plain
        step may already be queued: then this call queues the one after it (while the batch stays
        plain) and settles it."""
        self._drop_cancelled()
        self._admit()
        if not self._running:
            return self.busy
        start = time.perf_counter()
        flight, self._ahead = self._still_ahead(), None
        drafted = start
        if flight is None:
            flight, drafted = self._plan_and_launch()
        if self._may_pipeline(flight):
            self._ahead = self._launch_ahead(flight)
        emitted = self._settle(flight)
        settled = time.perf_counter()
        self._leave([unit.seq for unit, _, reason in emitted if reason])
        phases = (drafted - start, settled - drafted, time.perf_counter() - settled)
        for unit, tokens, reason in emitted:
            self._charge(unit, *phases)
            unit.seq.handle.finish_reason = reason
            unit.seq.handle._emit(tokens, finished=reason is not None)  # listeners' time is not ours
        self._tell_controller(flight, emitted, drafted - start, time.perf_counter() - start)
        return self.busy

    def _tell_controller(self, flight: _Flight, emitted: list, draft_seconds: float, seconds: float) -> None:
        """The step's record to the controller, the hook and last_step."""
        accepted = {id(unit.seq): sum(t.origin is Origin.ACCEPTED for t in tokens) for unit, tokens, _ in emitted}
        decoding = [u for u in flight.units if u.draft is not None]
        record = StepRecord(flight.load, flight.views, flight.ks, tuple(accepted.get(id(u.seq), 0) for u in decoding),
                            sum(len(tokens) for _, tokens, _ in emitted), flight.prefill_rows, draft_seconds, seconds)
        self.last_step = StepTrace(flight.plan, record)
        self.controller.record(self.last_step)
        if self.on_step is not None:
            self.on_step(self.last_step)

    @property
    def _load(self) -> int:
        """The sequences the engine holds now: decoding, prefilling, waiting for a slot."""
        return len(self._running) + len(self._waiting)

    def _launch(self, units: list[_Unit], plan: Plan, views: tuple[SequenceView, ...], load: int) -> _Flight:
        """Queue a step: one forward over every unit, then the rule over its verifies. The constrained
        verifies' masks are computed while the forward runs (constraints.overlap), read before the rule."""
        trees = [None if u.draft is None else u.draft.row_parents for u in units]
        job = start_masks([u.seq.constraint if u.draft is not None else None for u in units])
        try:
            out = self.target.forward_ragged([u.seq.slot for u in units], [u.tokens for u in units],
                                             logits=[u.draft is not None for u in units],
                                             features=[u.seq.layers for u in units], trees=trees)
        finally:  # the matchers are the worker's until then
            masks = job.result()
        units = [u if m is None else dataclasses.replace(u, mask=m) for u, m in zip(units, masks)]
        rule = queue_rule([u.draft for u in units], [u.seq.config.sampling for u in units],
                          [u.seq.generator for u in units], out, [u.mask for u in units])
        return _Flight(units, out, rule, plan, views, load)

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
        # The views as the step will see them: each sequence a token further on.
        views = tuple(dataclasses.replace(v, room=v.room - 1) for v in (seq.view for _, seq in running))
        planned = self.controller.plan(views, self._load)  # plain: _next_step_is_plain said so
        return self._launch(units, Plan((0,) * len(views), planned.reason, planned.key), views, self._load)

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

    def _plan_and_launch(self) -> tuple[_Flight, float]:
        """Every running sequence's unit, in batch order: prefill chunks, and verifies of the drafts
        the controller's plan budgets; then the step queued. Returns it and when drafting ended."""
        decoding = [s for s in self._running if not s.prefilling]
        views, load = tuple(s.view for s in decoding), self._load
        plan = self.controller.plan(views, load)
        constraints = [s.constraint for s in decoding]  # the grammar's drafts go first, free (constraints/)
        forced, ks = grammar_drafts(constraints, plan.budgets, [max(0, min(s.config.k, s.remaining - 1))
                                                                 for s in decoding],
                                    [max(0, s.remaining - 1) for s in decoding])
        drafts = propose_all([s.drafter for s in decoding], [s.context + f for s, f in zip(decoding, forced)], ks,
                             [s.config.sampling for s in decoding], [s.generator for s in decoding])
        drafted_at = time.perf_counter()
        # A grammar walks chains: a constrained sequence verifies its tree's first path.
        drafts = [d if c is None or d is None else d.first_path() for c, d in zip(constraints, drafts)]
        drafts = fit_drafts(constraints, drafts, [s.generator for s in decoding])
        draft_of = {id(s): d or empty_draft(self.target.device) for s, d in zip(decoding, drafts)}
        units = []
        for seq in self._running:
            if seq.prefilling:
                end = min(seq.prefilled + self.config.prefill_chunk, len(seq.prompt) - 1)
                units.append(_Unit(seq, self._tensor(seq.prompt[seq.prefilled:end]), None))
            else:
                draft = draft_of[id(seq)]
                units.append(_Unit(seq, torch.cat([seq.pending, draft.tokens]), draft))
        return self._launch(units, plan, views, load), drafted_at

    def _next_step_is_plain(self) -> bool:
        """Whether the step after the one in flight will be plain for every running sequence: always
        for those that draft nothing, else when the controller plans no drafts for them now (a plain
        step's record can change its mind only at the end of a window, and then the step queued ahead
        is a switch's first step, which it does not count)."""
        if all(s.drafter.drafts_nothing for s in self._running):
            return True
        return self.controller.plan(tuple(s.view for s in self._running), self._load).plain

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
                logits = flight.out.logits_of(i)
                if isinstance(rounds[i][0], TreeVerdict):  # emitted token j came from the path's row j
                    logits = logits[rounds[i][0].rows]
                tokens = with_logprobs(tokens, logits, seq.config, unit.mask)
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
        if isinstance(verdict, TreeVerdict):  # the slot keeps the path's rows; the drafter forgets the tree
            self.target.keep_rows(seq.slot, len(seq.context) - 1, verdict.rows)
            seq.drafter.commit(len(seq.context))  # then observes the path (Drafter.commit)
            if features is not None:
                seq.drafter.observe(features[verdict.rows])
        else:
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
        tree = RoundTree(verdict.nodes, verdict.parents, verdict.path) if isinstance(verdict, TreeVerdict) else None
        for token, origin in zip(tokens, origins):
            seq.context.append(token)
            emitted.append(EmittedToken(token, origin, stats.rounds, tree=None if emitted else tree))
            reason = self._finish_reason(seq)
            if reason:
                break
        if reason is None and seq.constraint is not None and seq.constraint.stopped:
            reason = "stop"
        stats.record_round(verdict, len(emitted))
        return emitted, reason

    @staticmethod
    def _settle_constraint(seq: _Sequence, verdict: Verdict, tokens: list[int]) -> list[int]:
        """The constrained round's tokens to emit (SequenceConstraint.settle), its grammar counts recorded."""
        constraint = seq.constraint
        tokens = constraint.settle(verdict.num_drafted, verdict.num_accepted, tokens)
        seq.handle.stats.record_grammar(*constraint.grammar_counts(verdict.num_accepted),
                                        sum(constraint.single_rows[:len(tokens)]), *constraint.take_seconds())
        return tokens

    def _rollback(self, seq: _Sequence, valid: int) -> None:
        """The slot and the drafter keep the first `valid` tokens of the text, forget the rest."""
        self.target.rollback(seq.slot, valid)
        seq.drafter.commit(valid)

    def _finish_reason(self, seq: _Sequence) -> str | None:
        generated = seq.context[len(seq.prompt):]
        if not seq.config.ignore_eos and generated[-1] in self.eos_token_ids:
            return "stop"
        if seq.config.stop and self._holds_stop(seq, generated):
            return "stop"
        if len(generated) >= seq.config.max_new_tokens:
            return "length"
        return None

    @staticmethod
    def _holds_stop(seq: _Sequence, generated: list[int]) -> bool:
        """Whether the answer so far holds a stop string: its text (the handle's, which a listener
        reads too) grows with it (stops.TextStream: a few tokens' decoding and constant work a new
        character, however many stop strings)."""
        seq.handle.text.update(generated, final=False)
        return seq.handle.text.stopped

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
