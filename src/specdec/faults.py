"""The classic bugs of speculative decoding, injectable for tests and `bench exactness` only.

Each fault is a context manager that patches one function, so that the test suite (and the
exactness benchmark) can prove its checks would catch the bug. No user-facing option turns them on.

- resample-from-p: on rejection, draw the replacement from p instead of the residual max(0, p - q).
- skip-rollback:   never cut the caches back after a round, so rejected tokens stay in them.
- softmax-as-q:    draft greedily (argmax) but hand the softmax over as q, as if it had been sampled.
- unmapped-draft-ids: take a draft of another tokenizer for one of the target's: its ids go to the
                   target unmapped, the target's to it (a draft of a smaller vocabulary fails loudly).
- intersection-unnormalised-q: draft among the shared tokens of two vocabularies but pass the draft's
                   q restricted to them without renormalising it (the draft still samples the
                   renormalised one: sampling.sample normalises).
- constraint-unmasked-q: under a grammar, mask p but not q: cut a sampled draft where it leaves the
                   grammar and verify the rest against the draft's unmasked q.
- skip-matcher-rollback: never roll a sequence's grammar matcher back after a round, so it keeps the
                   rejected drafts.
- tree-no-sibling-residual: in a tree, test every sibling against the row's p (no residual update
                   after a rejected sibling).
- tree-recover-from-p: in a tree, draw the token after a row's rejected children from its p again.
- tree-parent-q:   in a tree, take a sampled node's q as its parent's row (the distribution one level up).
- tree-siblings-unconditioned-q: draw a node's children without replacement but judge each with the
                   node's whole distribution, not the one left after its earlier siblings were removed.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator
from unittest import mock


def _resample_from_p():
    return mock.patch("specdec.verify.residual", lambda p, q: p)


def _skip_rollback():
    return mock.patch("specdec.engine.batched.BatchedEngine._rollback", lambda self, seq, valid: None)


def _softmax_as_q():
    # The draft still records the warped softmax as q, but picks its argmax.
    return mock.patch("specdec.drafters.model.sample", lambda probs, generator=None: probs.argmax(-1))


def _unmapped_draft_ids():
    return mock.patch("specdec.models.loader.same_vocabulary", lambda target, draft: True)


def _intersection_unnormalised_q():
    return mock.patch("specdec.drafters.cross_tokenizer.restrict", lambda q, mask: q * mask)


def _unmasked_q(token, token_ok, q, allowed, generator):
    return (token, q, True) if token_ok else (None, None, False)


def _constraint_unmasked_q():
    return mock.patch("specdec.constraints.masking.settle_draft_row", _unmasked_q)


def _skip_matcher_rollback():
    return mock.patch("specdec.constraints.sequence.SequenceConstraint.rollback", lambda self, n: None)


def _tree_no_sibling_residual():
    return mock.patch("specdec.tree_rule.next_residual", lambda r, q: r)


def _tree_recover_from_p():
    return mock.patch("specdec.tree_rule.exhausted", lambda r, p: p)


def _tree_parent_q():
    return mock.patch("specdec.tree_rule.q_row_of", lambda parents: [p if p >= 0 else j for j, p in enumerate(parents)])


def _tree_siblings_unconditioned_q():
    return mock.patch("specdec.sampling.sibling_conditionals",
                      lambda probs, picks: probs.unsqueeze(1).expand(-1, picks.shape[1], -1))


FAULTS = {
    "resample-from-p": _resample_from_p,
    "skip-rollback": _skip_rollback,
    "softmax-as-q": _softmax_as_q,
    "unmapped-draft-ids": _unmapped_draft_ids,
    "intersection-unnormalised-q": _intersection_unnormalised_q,
    "constraint-unmasked-q": _constraint_unmasked_q,
    "skip-matcher-rollback": _skip_matcher_rollback,
    "tree-no-sibling-residual": _tree_no_sibling_residual,
    "tree-recover-from-p": _tree_recover_from_p,
    "tree-parent-q": _tree_parent_q,
    "tree-siblings-unconditioned-q": _tree_siblings_unconditioned_q,
}


@contextmanager
def inject(name: str | None) -> Iterator[None]:
    """Run the body with the named fault in place (None: no fault)."""
    if name is None:
        yield
        return
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    with FAULTS[name]():
        yield
