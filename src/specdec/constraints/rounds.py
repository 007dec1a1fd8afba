"""The engine's constraint steps over a batch of decoding sequences (engine.batched.BatchedEngine._plan and
submit): start a sequence's matcher, draft what the grammar dictates, fit the drafters' proposals.

Each function acts on one sequence's own constraint and generator only, in batch order, so a
sequence's grammar drafts, masks and draws do not depend on its companions (rule 6).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

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
                              grammars.mask_width)


def grammar_drafts(constraints: Sequence[SequenceConstraint | None], ks: Sequence[int],
                   caps: Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """Per sequence: the grammar's drafts (at most caps[i] tokens, none when unconstrained) and how many
    its drafter may still propose after them (ks[i] less the grammar's, at least 0)."""
    forced = [[] if c is None else c.grammar_draft(max(k, cap)) for c, k, cap in zip(constraints, ks, caps)]
    return forced, [max(0, k - len(f)) for k, f in zip(ks, forced)]


def fit_drafts(constraints: Sequence[SequenceConstraint | None], drafts: Sequence[Draft | None],
               generators: Sequence[torch.Generator]) -> tuple[list[Draft | None], list[torch.Tensor | None]]:
    """Per sequence: its round's draft (a constrained one: grammar drafts then the drafter's, fitted to
    the grammar; SequenceConstraint.fit_draft) and its masks bool [K + 1, V] (None: unconstrained)."""
    out, masks = [], []
    for constraint, draft, generator in zip(constraints, drafts, generators):
        if constraint is None:
            out.append(draft)
            masks.append(None)
        else:
            fitted, mask = constraint.fit_draft(draft, generator)
            out.append(fitted)
            masks.append(mask)
    return out, masks
