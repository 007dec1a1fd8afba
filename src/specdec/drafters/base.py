"""What every drafter offers the engine: propose up to K tokens, then forget what was rejected."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specdec.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the distribution each was drawn from.

    tokens: [k] long, on the target's device (k may be smaller than asked, even 0).
    q: [k, V] fp32 probabilities the draft actually sampled from, or None when every token was
       chosen deterministically (argmax, lookup): then q is one-hot on the token (rule 1).
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(ABC):
    """Proposes tokens for the engine. One instance drafts for one sequence at a time."""

    name: str = "drafter"
    needs_target_features: bool = False  # True: the engine calls observe() with the target's features
    feature_layers: tuple[int, ...] = ()  # which layers' outputs come with them (CausalLM.forward_with_hidden)
    drafts_nothing: bool = False  # True: every round is one plain step (the engine may queue steps ahead)

    def begin(self, prompt: list[int]) -> None:
        """A new sequence starts with these prompt tokens."""

    @abstractmethod
    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """Propose up to k tokens to follow context (the whole text so far, prompt included)."""

    def commit(self, num_valid: int) -> None:
        """After a round: the first num_valid tokens of the text are final; forget the rest."""

    def observe(self, features: torch.Tensor) -> None:
        """The target's features [m, (len(feature_layers) + 1) * D] (the outputs of feature_layers,
        then the input of its LM head) of the next m tokens of the text that became final, in
        order: the prompt's after begin(), then each round's kept positions."""


def empty_draft(device: torch.device) -> Draft:
    return Draft(torch.empty(0, dtype=torch.long, device=device))
