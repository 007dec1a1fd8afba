"""What a draft head file records besides its weights: the target it was trained for, and how it drafts.

Both live in the head's safetensors metadata (keys "target" and "policy", JSON), so a head carries
its own policy wherever it is copied, and `auto` finds the shipped head for a target by what the
target is (its sizes and a sample of its embedding), not by what it is called.

A policy's limits are keyed by what a verify row costs on the target (`row_cost`):
- "dear-rows": every drafted row makes the verify pass dearer (fp32 matrices on a CPU);
- "cpu": a CPU where a few verify rows cost about one step (bf16 matrices on bf16 units);
- "cuda": a GPU.
A kind missing from a limit table drafts up to K there.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType
from typing import Mapping

import torch

ROW_COSTS = ("dear-rows", "cpu", "cuda")
SAMPLE = 256  # embedding values a TargetIdentity keeps
MATCH = 0.9  # cosine similarity of two samples above which they are the same model (unrelated: ~0 +- 0.06)


def row_cost(model) -> str:
    """Which of a policy's limits apply to this target (a CausalLM): see the module docstring."""
    return "dear-rows" if not model.cheap_verify_rows else model.device.type


def _frozen(limits: Mapping[str, int] | None) -> Mapping[str, int] | None:
    if limits is None:
        return None
    unknown = set(limits) - set(ROW_COSTS)
    if unknown:
        raise ValueError(f"head policy limits are keyed by {', '.join(ROW_COSTS)}, not {sorted(unknown)}")
    return MappingProxyType({k: int(v) for k, v in limits.items()})


@dataclass(frozen=True)
class HeadPolicy:
    """How a head drafts beside prompt lookup (`lookup+head:PATH`, `auto`).

    min_confidence: end a round once the head's estimate that all its drafts are kept falls below
        this (0: off). A spec's `:MIN_CONF` overrides it. While it is on, it ends rounds instead of
        the fixed limits below.
    greedy_head_max: the most head tokens a round when greedy, by row cost (missing: K).
    sampled_head_max: the same when sampling (None: the greedy limits).
    lookup_when_sampling: whether lookup drafts at all when sampling (False: the head alone).
    note: why these numbers (the measurements behind them).
    """

    min_confidence: float = 0.0
    greedy_head_max: Mapping[str, int] = field(default_factory=lambda: {"dear-rows": 2})
    sampled_head_max: Mapping[str, int] | None = None
    lookup_when_sampling: bool = True
    note: str = ""

    def __post_init__(self):
        if not 0.0 <= self.min_confidence < 1.0:
            raise ValueError(f"a head policy's min_confidence must be in [0, 1), got {self.min_confidence}")
        object.__setattr__(self, "greedy_head_max", _frozen(self.greedy_head_max))
        object.__setattr__(self, "sampled_head_max", _frozen(self.sampled_head_max))

    def head_max(self, model, greedy: bool, min_confidence: float) -> int | None:
        """The most head tokens a round on this target (None: K)."""
        if min_confidence > 0.0:
            return None
        limits = self.greedy_head_max if greedy or self.sampled_head_max is None else self.sampled_head_max
        return limits.get(row_cost(model))

    def to_json(self) -> str:
        limits = {"greedy_head_max": dict(self.greedy_head_max),
                  "sampled_head_max": None if self.sampled_head_max is None else dict(self.sampled_head_max)}
        return json.dumps({**{f.name: getattr(self, f.name) for f in fields(self)}, **limits})

    @classmethod
    def from_json(cls, text: str) -> "HeadPolicy":
        return cls(**json.loads(text))


@dataclass(frozen=True)
class TargetIdentity:
    """What a target is, cheaply: its sizes and SAMPLE values of its input embedding at fixed places.

    The sample survives a change of dtype, backend or device (and quantization, which moves values
    a little), and tells unrelated models apart: two samples match when their cosine similarity
    is at least MATCH.
    """

    vocab_size: int
    hidden: int
    num_layers: int
    embedding_sample: tuple[float, ...]

    @classmethod
    def of(cls, embed: torch.Tensor, num_layers: int) -> "TargetIdentity":
        """From the target's input embedding embed [V, D] and its decoder-layer count."""
        vocab, hidden = embed.shape
        i = torch.arange(SAMPLE)
        rows, cols = (1 + i * 7919) % vocab, (i * 37) % hidden  # spread over the table, fixed forever
        values = embed.detach()[rows.to(embed.device), cols.to(embed.device)].float().cpu()
        return cls(int(vocab), int(hidden), int(num_layers), tuple(round(float(v), 6) for v in values))

    def matches(self, other: "TargetIdentity") -> bool:
        if (self.vocab_size, self.hidden, self.num_layers) != (other.vocab_size, other.hidden, other.num_layers):
            return False
        a, b = self.embedding_sample, other.embedding_sample
        norm = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
        return len(a) == len(b) and norm > 0 and sum(x * y for x, y in zip(a, b)) / norm >= MATCH

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "TargetIdentity":
        d = json.loads(text)
        return cls(**{**d, "embedding_sample": tuple(d["embedding_sample"])})


@dataclass(frozen=True)
class HeadCard:
    """A head file's metadata beyond its config: the target it was made for (None: not recorded) and its policy."""

    target: TargetIdentity | None
    policy: HeadPolicy


def card_from_metadata(info: Mapping[str, str]) -> HeadCard:
    """Read a head's safetensors metadata; heads saved before policies were recorded get the default one."""
    target = TargetIdentity.from_json(info["target"]) if "target" in info else None
    policy = HeadPolicy.from_json(info["policy"]) if "policy" in info else HeadPolicy()
    return HeadCard(target, policy)


def card_metadata(card: HeadCard) -> dict[str, str]:
    """The metadata entries that record `card` (the inverse of card_from_metadata)."""
    info = {"policy": card.policy.to_json()}
    if card.target is not None:
        info["target"] = card.target.to_json()
    return info
