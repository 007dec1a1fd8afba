"""What every drafter offers the engine: propose up to K tokens, then forget what was rejected."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from specdec.drafters.tree_shape import TreeShape
from specdec.sampling import SamplingParams
from specdec.trees import check_parents, children_of, is_chain, rows_of


@dataclass(frozen=True)
class Draft:
    """Proposed tokens (the nodes of a tree, a chain by default) and the distribution each was drawn from.

    tokens: [k] long, on the target's device (k may be smaller than asked, even 0).
    q: [k, V] fp32 probabilities the draft actually sampled from, or None when every token was
       chosen deterministically (argmax, top-k, lookup): then q is one-hot on the token (rule 1).
       With q given, node j was drawn from q[j] given its earlier siblings: equal rows for siblings
       drawn with replacement, each the one before less its token for siblings drawn without.
    parents: [k] host ints, node j's parent: -1 for the root (the text's newest token), else an
       earlier node (parents[j] < j, so a parent comes before its children). None: a chain, node j's
       parent is node j - 1. Siblings are judged in node order (tree_rule).
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None
    parents: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.parents is not None:
            check_parents(self.parents, len(self))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def is_chain(self) -> bool:
        return is_chain(self.parents)  # node j's parent j - 1: the same test as on row parents

    @property
    def node_parents(self) -> tuple[int, ...]:
        """parents, a chain's included."""
        return tuple(range(-1, len(self) - 1)) if self.parents is None else self.parents

    def first_path(self) -> "Draft":
        """The chain down each row's first child from the root: what a drafter would have drafted as a
        chain (its nodes keep their q rows), for a verify that takes chains only."""
        if self.is_chain:
            return self
        kids, path, row = children_of(self.parents), [], 0
        while kids[row]:  # row 0 the root, row j + 1 node j
            path.append(kids[row][0])
            row = path[-1] + 1
        at = torch.tensor(path, dtype=torch.long, device=self.tokens.device)
        return Draft(self.tokens.index_select(0, at), None if self.q is None else self.q.index_select(0, at))

    @property
    def row_parents(self) -> tuple[int, ...] | None:
        """The verify pass's tree over its rows (row 0 the root, row j + 1 node j), as
        SlotModel.forward_ragged takes it; None for a chain (its rows are causal)."""
        return None if self.is_chain else rows_of(self.parents)


class Drafter(ABC):
    """Proposes tokens for the engine. One instance drafts for one sequence at a time: a batch of
    sequences has one drafter each (made by a DrafterFactory), and propose_batch drafts for all."""

    name: str = "drafter"
    needs_target_features: bool = False  # True: the engine calls observe() with the target's features
    feature_layers: tuple[int, ...] = ()  # which layers' outputs come with them (CausalLM.forward_with_hidden)
    drafts_nothing: bool = False  # True: every round is one plain step (the engine may queue steps ahead)
    tree: TreeShape | None = None  # None: it drafts chains; else trees of this shape (k: the node budget)

    def begin(self, prompt: list[int]) -> None:
        """A new sequence starts with these prompt tokens."""

    @abstractmethod
    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """Propose up to k tokens to follow context (the whole text so far, prompt included)."""

    @classmethod
    def propose_batch(cls, drafters: Sequence["Drafter"], contexts: Sequence[list[int]], ks: Sequence[int],
                      params: Sequence[SamplingParams], generators: Sequence[torch.Generator]) -> list[Draft]:
        """Drafts for several sequences whose drafters are all of this class: drafters[i] proposes up
        to ks[i] >= 1 tokens after contexts[i] with its sequence's params[i] and generators[i]. A loop
        here; a class that can draft many sequences in one pass overrides it, with the same drafts
        as one at a time (a sequence's draft must not depend on its companions)."""
        return [d.propose(c, k, p, g) for d, c, k, p, g in zip(drafters, contexts, ks, params, generators)]

    def commit(self, num_valid: int) -> None:
        """After a round: the first num_valid tokens of the text are final; forget the rest. After a
        tree round num_valid is the text's length before it (every node is forgotten, the kept path
        included): the next propose's context brings the path, and observe its features."""

    def end(self) -> None:
        """Its sequence is done (the batched engine calls this as the sequence leaves): give back
        whatever it holds for the sequence, e.g. a slot of a shared draft cache."""

    def for_batch(self, max_slots: int, max_length: int | None = None) -> "Drafter":
        """This kind made to draft for up to max_slots sequences at once, as the prototype that
        fork() copies for each (a draft model moves onto a slot model of its weights, each slot
        max_length positions: no more than the target's slots hold; None: the model's); most kinds
        are that already."""
        return self

    def fork(self) -> "Drafter":
        """A fresh drafter of the same kind for another sequence: it shares what was loaded (weights,
        tables) but none of this one's per-sequence state. A kind that cannot say so refuses."""
        from specdec.errors import DraftSpecError

        raise DraftSpecError(f"the {self.name} draft cannot draft for several sequences at once "
                                   "(it holds one sequence's state): choose lookup, a head or a draft model")

    def with_tree(self, shape: TreeShape) -> "Drafter":
        """A drafter of this kind that drafts trees of `shape` (its `tree`), sharing what was loaded
        but none of this one's per-sequence state; a kind that drafts chains only refuses."""
        from specdec.errors import DraftSpecError

        raise DraftSpecError(f"the {self.name} draft drafts chains only: draft trees with lookup, a head, "
                             "lookup+head or a draft model")

    def warm_up(self) -> None:
        """Prepare what its first drafts would otherwise prepare mid-run (a draft slot model's CUDA
        graphs); nothing for most kinds."""

    def observe(self, features: torch.Tensor) -> None:
        """The target's features [m, (len(feature_layers) + 1) * D] (the outputs of feature_layers,
        then the input of its LM head) of the next m tokens of the text that became final, in
        order: the prompt's after begin(), then each round's kept positions."""


DrafterFactory = Callable[[], Drafter]  # a fresh drafter for one more sequence


def empty_draft(device: torch.device) -> Draft:
    return Draft(torch.empty(0, dtype=torch.long, device=device))


def propose_all(drafters: Sequence[Drafter], contexts: Sequence[list[int]], ks: Sequence[int],
                params: Sequence[SamplingParams], generators: Sequence[torch.Generator]) -> list[Draft | None]:
    """One round's drafts for a batch: drafters[i] proposes up to ks[i] tokens for sequence i (None
    where ks[i] is 0). Drafters of one class draft together through their class's propose_batch."""
    out: list[Draft | None] = [None] * len(drafters)
    groups: dict[type, list[int]] = {}
    for i, (drafter, k) in enumerate(zip(drafters, ks)):
        if k > 0:
            groups.setdefault(type(drafter), []).append(i)
    for cls, members in groups.items():
        drafts = cls.propose_batch([drafters[i] for i in members], [contexts[i] for i in members],
                                   [ks[i] for i in members], [params[i] for i in members],
                                   [generators[i] for i in members])
        for i, draft in zip(members, drafts):
            out[i] = draft
    return out


def fit_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Pad or cut a draft's logits [..., V_draft] to the target's width vocab_size."""
    extra = vocab_size - logits.shape[-1]
    if extra > 0:
        return torch.cat([logits, logits.new_full((*logits.shape[:-1], extra), float("-inf"))], dim=-1)
    return logits[..., :vocab_size]
