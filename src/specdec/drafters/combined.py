"""Prompt lookup first, the draft head when lookup finds nothing better than a one-token match.

Lookup is free and wins on text that copies the prompt (summaries, extraction, code edits); the
head wins on open text. A match of the last token alone is weak: on Spec-Bench answers of the
embedded model its first drafted token was kept 22% of the time (2 tokens: 45%, 3 tokens: 78%),
below the head's ~45%, so the head drafts then. Whichever drafts a round, the head keeps reading
the target's features, so it is ready for the next round.

How many tokens the head drafts a round, and whether lookup drafts when sampling, is the head's own
policy, recorded in its file (head_policy.py); `auto` picks the shipped head whose file records
this target.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.drafters.base import Draft, Drafter, empty_draft, propose_all
from specdec.drafters.head import HeadDrafter, load_head_drafter, read_head_card, target_identity
from specdec.drafters.lookup import LookupDrafter
from specdec.errors import DraftSpecError, ModelLoadError
from specdec.sampling import SamplingParams


class LookupThenHead(Drafter):
    needs_target_features = True

    def __init__(self, lookup: LookupDrafter, head: HeadDrafter, name: str | None = None, min_match: int = 2,
                 head_max: int | None = None, sampled: tuple[bool, int | None] | None = None):
        self.lookup, self.head = lookup, head
        self.min_match = min_match  # lookup drafts only after a match of at least this many tokens
        self.head_max = head_max  # the head drafts at most this many tokens a round (None: K, like lookup)
        # When sampling: (whether lookup drafts at all, the head's limit); default as when greedy.
        self.sampled = sampled or (True, head_max)
        self.name = name or f"lookup+{head.name}"
        self.feature_layers = head.feature_layers

    def begin(self, prompt: list[int]) -> None:
        self.lookup.begin(prompt)
        self.head.begin(prompt)

    def observe(self, features: torch.Tensor) -> None:
        self.head.observe(features)

    def commit(self, num_valid: int) -> None:
        self.lookup.commit(num_valid)
        self.head.commit(num_valid)

    def fork(self) -> "LookupThenHead":
        return LookupThenHead(self.lookup.fork(), self.head.fork(), self.name, self.min_match, self.head_max,
                              self.sampled)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        return self.propose_batch([self], [context], [k], [params], [generator])[0]

    @classmethod
    def propose_batch(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
        """Lookup per sequence; the sequences it leaves to the head draft together (head_batch.py)."""
        out: list[Draft | None] = []
        for drafter, context, k, sp in zip(drafters, contexts, ks, params):
            out.append(drafter._looked_up(context, k, sp))
        left = [i for i, draft in enumerate(out) if draft is None]
        heads = propose_all([drafters[i].head for i in left], [contexts[i] for i in left],
                            [drafters[i]._head_k(ks[i], params[i]) for i in left],
                            [params[i] for i in left], [generators[i] for i in left])
        for i, draft in zip(left, heads):
            out[i] = draft if draft is not None else empty_draft(drafters[i].lookup.device)
        return out

    def _looked_up(self, context: list[int], k: int, params: SamplingParams) -> Draft | None:
        """Lookup's draft when it found a match of min_match tokens or more (and may draft), else None."""
        if params.greedy or self.sampled[0]:
            matched, found = self.lookup.find(context, k)
            if matched >= self.min_match and found:
                return self.lookup.draft_of(found)
        return None

    def _head_k(self, k: int, params: SamplingParams) -> int:
        head_max = self.head_max if params.greedy else self.sampled[1]
        return min(k, head_max or k)


# --- the drafters that `head:PATH[:MIN_CONF]`, `lookup+head:PATH[:MIN_CONF]` and `auto` name (registry.py) ---

HEADS_DIR = Path(__file__).resolve().parent.parent / "data" / "heads"


def shipped_heads() -> list[Path]:
    """The heads shipped inside the package (data/heads/*.safetensors)."""
    return sorted(HEADS_DIR.glob("*.safetensors"))


def shipped_head_for(target) -> Path | None:
    """The shipped head whose card records this target (a LoadedModel), else None."""
    try:
        identity = target_identity(target.model)
    except ModelLoadError:  # not a Llama-like target: no head reads it
        return None
    for path in shipped_heads():
        made_for = read_head_card(path).target
        if made_for is not None and made_for.matches(identity):
            return path
    return None


def split_confidence(arg: str) -> tuple[str, float | None]:
    """`PATH` or `PATH:MIN_CONFIDENCE` (a number in [0, 1): stop a round once the head's estimate
    that all its drafts are kept falls below it) -> (path, min_confidence, None when not given)."""
    path, _, tail = arg.rpartition(":")
    if not path or Path(arg).exists():  # a file whose own name ends in ":<number>" is a path
        return arg, None
    try:
        min_confidence = float(tail)
    except ValueError:
        return arg, None
    if not 0.0 <= min_confidence < 1.0:
        raise DraftSpecError(f"the head's MIN_CONF in {arg!r} must be in [0, 1), got {tail}")
    return path, min_confidence


def head_drafter(target, arg: str, name: str | None = None) -> HeadDrafter:
    """`head:PATH[:MIN_CONF]`: the head alone, K tokens a round (or fewer, by its confidence)."""
    path, min_confidence = split_confidence(arg)
    return load_head_drafter(path, target.model, name=name or f"head:{arg}", min_confidence=min_confidence)


def lookup_head_drafter(target, arg: str, name: str | None = None) -> LookupThenHead:
    """`lookup+head:PATH[:MIN_CONF]`: lookup after a match of 2+ tokens, else the head, drafting
    by the policy its file records (HeadPolicy) for this target."""
    head = head_drafter(target, arg)
    policy, model, conf = head.policy, target.model, head.min_confidence
    sampled = (policy.lookup_when_sampling, policy.head_max(model, greedy=False, min_confidence=conf))
    return LookupThenHead(LookupDrafter(model.device), head, name=name,
                          head_max=policy.head_max(model, greedy=True, min_confidence=conf), sampled=sampled)


def auto_drafter(target) -> Drafter:
    """`auto`: lookup+head with the shipped head made for this target, else prompt lookup."""
    path = shipped_head_for(target)
    if path is None:
        return LookupDrafter(target.model.device)
    return lookup_head_drafter(target, str(path), name="lookup+head")
