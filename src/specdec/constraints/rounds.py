"""The engine's constraint steps over a batch of decoding sequences (engine.batched.BatchedEngine._plan and
submit, _launch): start a sequence's matcher, draft what the grammar dictates, fit the drafters' proposals,
start the verify masks.

Each function acts on one sequence's own constraint and generator only, in batch order, so a
sequence's grammar drafts, masks and draws do not depend on its companions (rule 6).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.constraints.overlap import MaskJob
from specdec.constraints.sequence import SequenceConstraint
from specdec.drafters.base import Draft
from specdec.errors import InvalidRequestError
from specdec.generation import GenerationConfig


def start_constraint(grammars, config: GenerationConfig, vocab: int,
                     device: torch.device) -> SequenceConstraint | None:
    """The sequence's constraint (None when its config asks for none). grammars: a
    grammar.GrammarCompiler for the target's tokenizer, or None (then a constraint is refused)."""
    if config.constraint is None:
        return None
    if grammars is None:
        raise InvalidRequestError("this engine has no tokenizer for constraints: build it with "
                                  "grammars=GrammarCompiler(tokenizer) to serve JSON schemas, regexes and grammars")
    return SequenceConstraint(grammars.matcher(config.constraint), vocab, device, grammars.grammar_drafts,
                              grammars.mask_width, grammars.overlap_masks, grammars.ll_tokenizer)


def grammar_drafts(constraints: Sequence[SequenceConstraint | None], ks: Sequence[int],
                   caps: Sequence[int], rooms: Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """Per sequence: the grammar's drafts (at most max(ks[i], caps[i]) tokens, none when unconstrained)
    and how many its drafter may propose after them: its whole budget ks[i], within rooms[i] (the drafts
    the sequence may still verify). The grammar's drafts are free, so they do not take the drafter's
    budget: they cost no draft pass, and where one token alone is allowed they are always kept."""
    forced = [[] if c is None else c.grammar_draft(max(k, cap), k, room)
              for c, k, cap, room in zip(constraints, ks, caps, rooms)]
    return forced, [k if c is None else c.drafter_budget for c, k in zip(constraints, ks)]


def fit_drafts(constraints: Sequence[SequenceConstraint | None], drafts: Sequence[Draft | None],
               generators: Sequence[torch.Generator]) -> list[Draft | None]:
    """Per sequence: its round's draft (a constrained one: grammar drafts then the drafter's, fitted to
    the grammar; SequenceConstraint.fit_draft). Their verify masks come from start_masks."""
    return [draft if constraint is None else constraint.fit_draft(draft, generator)
            for constraint, draft, generator in zip(constraints, drafts, generators)]


def start_masks(constraints: Sequence[SequenceConstraint | None]) -> MaskJob:
    """The verify masks of a step's units (constraints: [B], a decoding unit's constraint or None),
    computed beside the target's pass unless the grammars say otherwise (GrammarCompiler.overlap_masks);
    MaskJob.result() after the pass gives them, bool [K_i + 1, V] or None a unit."""
    active = [c for c in constraints if c is not None]
    return MaskJob(constraints, overlap=all(c.overlap_masks for c in active))
