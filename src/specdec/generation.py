"""What a generation is made of, for every engine and surface: a request (GenerationConfig), the
tokens it emits (EmittedToken, with their Origin), its statistics (SpecStats), and a running
single-sequence generation (Generation)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Iterator

from specdec.constraints.spec import ConstraintSpec
from specdec.errors import InvalidRequestError
from specdec.sampling import SamplingParams
from specdec.verify import Verdict


class Origin(str, Enum):
    """Where an emitted token came from."""

    ACCEPTED = "accepted"  # a draft token the rule kept
    RECOVERED = "recovered"  # drawn from the residual at the first rejection (greedy: target argmax)
    BONUS = "bonus"  # drawn from p after every draft of the round was kept (plain decoding: every token)


@dataclass(frozen=True)
class EmittedToken:
    """One emitted token. logprob and top_logprobs are filled only when the request asked for them
    (GenerationConfig.logprobs; the batched engine): the token's log-probability under the target's
    p at its position, and the `logprobs` most likely tokens there as (id, log-probability). tree: on
    the first token a tree round emitted, the round's draft tree and the path it kept (a live view
    draws it), else None."""

    token_id: int
    origin: Origin
    round_index: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None
    tree: "RoundTree | None" = None


@dataclass(frozen=True)
class RoundTree:
    """A tree round's draft: node j's token and parent (-1: the root, the text's newest token), and the
    nodes the rule kept, root's child first."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    path: tuple[int, ...]


@dataclass(frozen=True)
class GenerationConfig:
    """One request: how many tokens, how many drafts per round, how to sample, when to stop."""

    max_new_tokens: int = 128
    k: int = 4
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; n >= 0: each token's log-probability and the n most likely
    constraint: ConstraintSpec | None = None  # structured output: a JSON schema, regex or grammar (docs/structured.md)

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
    judged: int = 0  # drafts the rule decided on (Verdict.num_judged)
    grammar_drafted: int = 0  # constrained: drafts the grammar dictated (one-hot, no draft cost)
    grammar_accepted: int = 0  # of those, kept
    forced: int = 0  # constrained: emitted tokens whose mask allowed that token alone
    constraint_time: float = 0.0  # constrained: host seconds of grammar work in the steps' critical path
    constraint_overlapped_time: float = 0.0  # constrained: seconds of verify masks computed beside the target's pass
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
        self.judged += verdict.num_judged
        self.generated += emitted
        grow = verdict.positions - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(verdict.positions):  # a tree's depths
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += int(i < verdict.num_accepted)

    def record_grammar(self, drafted: int, accepted: int, forced: int, seconds: float,
                       overlapped: float = 0.0) -> None:
        """A constrained round: its grammar drafts, how many were kept, its emitted forced tokens, and
        the grammar's host seconds since the last round (in the critical path; overlapped with the
        target's pass)."""
        self.grammar_drafted += drafted
        self.grammar_accepted += accepted
        self.forced += forced
        self.constraint_time += seconds
        self.constraint_overlapped_time += overlapped

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
