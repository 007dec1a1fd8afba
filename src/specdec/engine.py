"""The round loop: draft K tokens, verify them in one target pass, keep a prefix, emit one more.

Invariant between rounds: the target's cache holds the emitted text minus its last token (the
"pending" token, which the next round feeds first), and the drafter's cache holds a prefix of it.
Rejected tokens are forgotten by rolling both caches back, so p is always computed on the true
prefix (rule 2 of the design).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Iterator

import torch

from specdec.clock import PhaseClock
from specdec.transfers import HostRead, token_tensor
from specdec.drafters.base import Drafter, empty_draft
from specdec.errors import InvalidRequestError, UnsupportedHereError
from specdec.models.base import CausalLM
from specdec.sampling import SamplingParams, warp_logits
from specdec.verify import Verdict, greedy_outcome, read_round, sampled_outcome


class Origin(str, Enum):
    """Where an emitted token came from."""

    ACCEPTED = "accepted"  # a draft token the rule kept
    RECOVERED = "recovered"  # drawn from the residual at the first rejection (greedy: target argmax)
    BONUS = "bonus"  # drawn from p after every draft of the round was kept (plain decoding: every token)


@dataclass(frozen=True)
class EmittedToken:
    """One emitted token. logprob and top_logprobs are filled only when the request asked for them
    (GenerationConfig.logprobs; the batched engine): the token's log-probability under the target's
    p at its position, and the `logprobs` most likely tokens there as (id, log-probability)."""

    token_id: int
    origin: Origin
    round_index: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None


@dataclass(frozen=True)
class GenerationConfig:
    """One request: how many tokens, how many drafts per round, how to sample, when to stop."""

    max_new_tokens: int = 128
    k: int = 4
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; n >= 0: each token's log-probability and the n most likely

    def __post_init__(self) -> None:
        if self.logprobs is not None and self.logprobs < 0:
            raise InvalidRequestError(f"logprobs must be >= 0 (or None), got {self.logprobs}")
        if self.max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.k < 1:
            raise InvalidRequestError(f"K (draft tokens per round) must be >= 1, got {self.k}")


@dataclass
class SpecStats:
    """Honest counts and times of one generation. Times are seconds of wall clock."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    prefill_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    other_time: float = 0.0

    @property
    def decode_time(self) -> float:
        return self.draft_time + self.verify_time + self.other_time

    @property
    def acceptance_rate(self) -> float:
        """alpha: share of drafted tokens that were kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        """tau: mean tokens emitted per round (kept drafts plus the recovered or bonus token)."""
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over decode time (prefill excluded; it is the same with or without a draft)."""
        return self.generated / self.decode_time if self.decode_time > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def record_round(self, verdict: Verdict, emitted: int) -> None:
        self.rounds += 1
        self.drafted += verdict.num_drafted
        self.accepted += min(verdict.num_accepted, emitted)
        self.generated += emitted
        grow = verdict.num_drafted - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(verdict.num_drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += int(i < verdict.num_accepted)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_round=self.tokens_per_round,
            tokens_per_second=self.tokens_per_second,
            acceptance_by_position=self.acceptance_by_position,
            decode_time=self.decode_time,
        )
        return out


class Generation:
    """A running generation: iterate it for EmittedTokens; stats and tokens fill in as it goes.

    Stopping the iteration early (break, close()) stops generation at the next round.
    """

    def __init__(self, tokens: Iterator[EmittedToken], stats: SpecStats):
        self._tokens = tokens
        self.stats = stats
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"

    def __iter__(self) -> Iterator[EmittedToken]:
        for emitted in self._tokens:
            self.token_ids.append(emitted.token_id)
            yield emitted

    def close(self) -> None:
        self._tokens.close()

    def run(self) -> "Generation":
        """Drain the iterator; returns self."""
        for _ in self:
            pass
        return self


class Engine:
    """Speculative decoding of one sequence at a time with a target and any drafter."""

    def __init__(self, target: CausalLM, drafter: Drafter, eos_token_ids=(), decode=None,
                 overlap: bool | None = None):
        """eos_token_ids: ids that end generation. decode: list[int] -> str, needed for stop strings.
        overlap: with a drafter that drafts nothing, queue each plain step before reading the token of
        the one before (default: on CUDA, where the GPU then stays busy while the host checks it)."""
        if not target.verify_rows_match_steps:
            raise UnsupportedHereError(f"{target.name!r} cannot be a target: its single-token steps give other "
                                       "logits than its verify passes (e.g. the megakernel); use it as a draft only")
        self.target = target
        self.drafter = drafter
        self.eos_token_ids = frozenset(eos_token_ids)
        self.decode = decode
        self.overlap = target.device.type == "cuda" if overlap is None else overlap

    def generate(self, prompt: list[int], config: GenerationConfig) -> Generation:
        """Run to the end and return the finished Generation."""
        return self.stream(prompt, config).run()

    def stream(self, prompt: list[int], config: GenerationConfig) -> Generation:
        self._check_request(prompt, config)
        stats = SpecStats()
        generation = Generation(iter(()), stats)
        generation._tokens = self._rounds(list(prompt), config, stats, generation)
        return generation

    def _check_request(self, prompt: list[int], config: GenerationConfig) -> None:
        if not prompt:
            raise InvalidRequestError("the prompt is empty: give at least one token of text")
        if config.stop and self.decode is None:
            raise InvalidRequestError("stop strings need a decode function (pass the tokenizer's decode)")
        if config.logprobs is not None:
            raise InvalidRequestError("logprobs are computed by the batched engine only (BatchedEngine)")
        limit = self.target.max_length
        if len(prompt) + config.max_new_tokens > limit:
            raise InvalidRequestError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({config.max_new_tokens}) exceeds the "
                f"target's context of {limit} tokens; shorten the prompt or lower max_new_tokens"
            )

    def _rounds(
        self, context: list[int], config: GenerationConfig, stats: SpecStats, generation: Generation
    ) -> Iterator[EmittedToken]:
        generator = config.sampling.make_generator(self.target.device)
        clock = PhaseClock(self.target.device, stats)
        try:
            self.target.reset()
            features = self._prefill(self._tensor(context[:-1])) if len(context) > 1 else None
            self.drafter.begin(context)
            if features is not None:
                self.drafter.observe(features)
            clock.lap("prefill_time")
            plain = self.overlap and self.drafter.drafts_nothing and not self.drafter.needs_target_features
            rounds = self._plain_steps if plain else self._spec_rounds
            yield from rounds(context, config, stats, generation, clock, generator)
        finally:
            clock.settle(wait=True)

    def _spec_rounds(self, context: list[int], config: GenerationConfig, stats: SpecStats,
                     generation: Generation, clock: PhaseClock, generator) -> Iterator[EmittedToken]:
        """Draft, verify, keep a prefix: the host waits for the GPU once a round, for the verdict."""
        params = config.sampling
        prompt_len = len(context)
        text_checked = 0
        pending = self._tensor(context[-1:])  # stays on the device: the verdict's token feeds the next round
        while True:
            remaining = config.max_new_tokens - (len(context) - prompt_len)
            k = max(0, min(config.k, remaining - 1))  # a round emits up to k + 1 tokens
            draft = self.drafter.propose(context, k, params, generator) if k else None
            clock.lap("draft_time")
            draft_tokens = draft.tokens if draft is not None else empty_draft(self.target.device).tokens
            verdict, kept, pending = self._verify(pending, draft_tokens, draft.q if draft is not None else None,
                                                  params, generator)
            self._rollback(len(context) + verdict.num_accepted)
            clock.lap("verify_time")
            new = kept + [verdict.next_token]
            origins = [Origin.ACCEPTED] * verdict.num_accepted + [
                Origin.BONUS if verdict.all_accepted else Origin.RECOVERED
            ]
            emitted = 0
            for token, origin in zip(new, origins):
                context.append(token)
                emitted += 1
                reason = self._finish_reason(context, prompt_len, config, text_checked)
                if reason:
                    break
            stats.record_round(verdict, emitted)
            clock.lap("other_time")
            for token, origin in zip(new[:emitted], origins):
                yield EmittedToken(token, origin, stats.rounds - 1)
            if reason:
                generation.finish_reason = reason
                return
            text_checked = len(context) - prompt_len
            clock.lap(None)  # time spent by the consumer between rounds is not ours

    def _plain_steps(self, context: list[int], config: GenerationConfig, stats: SpecStats,
                     generation: Generation, clock: PhaseClock, generator) -> Iterator[EmittedToken]:
        """Plain decoding one step ahead: step t + 1 is queued, fed with token t while that is still
        on the device, before the host reads token t and checks it for a stop; a stop rolls the
        extra token back out of the cache. The same steps as one at a time, so the same tokens."""
        params = config.sampling
        prompt_len = len(context)
        text_checked = 0
        no_drafts = empty_draft(self.target.device).tokens
        token = self._plain_step(self._tensor(context[-1:]), no_drafts, params, generator)
        read = HostRead(token.reshape(1))
        while True:
            last = len(context) + 1 - prompt_len >= config.max_new_tokens  # no step may follow this token
            if not last:
                ahead = self._plain_step(token.reshape(1), no_drafts, params, generator)
                ahead_read = HostRead(ahead.reshape(1))
            context.append(read.values()[0])
            clock.lap("verify_time")
            reason = self._finish_reason(context, prompt_len, config, text_checked)
            if reason and not last:
                self.target.rollback(len(context) - 1)  # the step queued ahead was fed this token
            stats.record_round(Verdict(num_accepted=0, next_token=context[-1], num_drafted=0), 1)
            clock.lap("other_time")
            yield EmittedToken(context[-1], Origin.BONUS, stats.rounds - 1)
            if reason:
                generation.finish_reason = reason
                return
            text_checked = len(context) - prompt_len
            clock.lap(None)  # time spent by the consumer is not ours
            token, read = ahead, ahead_read

    def _plain_step(self, pending: torch.Tensor, no_drafts: torch.Tensor, params: SamplingParams,
                    generator) -> torch.Tensor:
        """Queue one target step on pending [1]; the token it picks, 0-d, on the device."""
        logits, _ = self._target_pass(pending)
        return self._outcome(logits, no_drafts, None, params, generator)[1]

    def _verify(self, pending: torch.Tensor, draft_tokens, q, params: SamplingParams,
                generator) -> tuple[Verdict, list[int], torch.Tensor]:
        """One target pass over [pending, drafts...] and the rejection rule. Read on the host, in the
        round's one wait for the GPU: the verdict and the kept drafts; left on the device: the next
        token [1], the next round's pending token."""
        logits, features = self._target_pass(torch.cat([pending, draft_tokens]))  # [k+1, V]
        num_accepted, next_token = self._outcome(logits, draft_tokens, q, params, generator)
        verdict, kept = read_round(num_accepted, next_token, draft_tokens)
        if features is not None:  # the pending token and the kept drafts are now part of the text
            self.drafter.observe(features[: verdict.num_accepted + 1])
        return verdict, kept, next_token.reshape(1)

    @staticmethod
    def _outcome(logits, draft_tokens, q, params: SamplingParams, generator):
        """The rule for this round's sampling, on the device: (num_accepted, next_token)."""
        if params.greedy:
            return greedy_outcome(logits.argmax(-1), draft_tokens)
        return sampled_outcome(warp_logits(logits, params), draft_tokens, q, generator)

    def _prefill(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Run the prompt minus its last token into the target's cache; features only if the drafter reads them."""
        if self.drafter.needs_target_features:
            return self.target.forward_with_hidden(tokens, self.drafter.feature_layers)[1]
        self.target.extend(tokens)
        return None

    def _target_pass(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Target forward over tokens [n]: logits [n, V], and features [n, D] if the drafter reads them."""
        if self.drafter.needs_target_features:
            return self.target.forward_with_hidden(tokens, self.drafter.feature_layers)
        return self.target.forward(tokens), None

    def _rollback(self, kept: int) -> None:
        """Forget rejected tokens: both caches keep the first `kept` tokens (the text minus its newest token)."""
        self.target.rollback(kept)
        self.drafter.commit(kept)

    def _finish_reason(self, context: list[int], prompt_len: int, config: GenerationConfig,
                       text_checked: int) -> str | None:
        if not config.ignore_eos and context[-1] in self.eos_token_ids:
            return "stop"
        if config.stop and self._hit_stop_string(context[prompt_len:], config.stop, text_checked):
            return "stop"
        if len(context) - prompt_len >= config.max_new_tokens:
            return "length"
        return None

    def _hit_stop_string(self, generated: list[int], stop: tuple[str, ...], text_checked: int) -> bool:
        # Only text that the newest tokens could complete needs checking; decode a few tokens back.
        window = self.decode(generated[max(0, text_checked - 8):])
        return any(s in window for s in stop)

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        return token_tensor(ids, self.target.device)
