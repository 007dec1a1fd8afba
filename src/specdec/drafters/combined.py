"""Prompt lookup first, the draft head when lookup finds nothing better than a one-token match.

Lookup is free and wins on text that copies the prompt (summaries, extraction, code edits); the
head wins on open text. A match of the last token alone is weak: on Spec-Bench answers of the
embedded model its first drafted token was kept 22% of the time (2 tokens: 45%, 3 tokens: 78%),
below the head's ~45%, so the head drafts then. Whichever drafts a round, the head keeps reading
the target's features, so it is ready for the next round.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.head import HeadDrafter
from specdec.drafters.lookup import LookupDrafter
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

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        use_lookup, head_max = (True, self.head_max) if params.greedy else self.sampled
        if use_lookup:
            matched, found = self.lookup.find(context, k)
            if matched >= self.min_match and found:
                return self.lookup.draft_of(found)
        return self.head.propose(context, min(k, head_max or k), params, generator)


# On a CPU every drafted row makes the verify pass dearer (a 3-row pass ~1.13 target steps, 5 rows
# ~1.33) and the shipped head's drafts are kept less than half the time: on Spec-Bench it paid best
# at K=2 (1.34x for lookup+head against 1.18x at K=4, docs/draft-head.md). Lookup keeps the full K.
# Re-checked after one-token steps got faster (CpuMatrix): head <= 2 1.37x, head <= 1 1.34x.
CPU_HEAD_MAX = 2


def _head_max(target, min_confidence: float) -> int | None:
    """Where verify rows are dear (fp32 on a CPU) the head drafts at most CPU_HEAD_MAX a round,
    unless its confidence decides."""
    return CPU_HEAD_MAX if not target.model.cheap_verify_rows and min_confidence == 0.0 else None


# --- registration: `head:PATH[:MIN_CONF]`, `lookup+head:PATH[:MIN_CONF]`, and `auto` (the shipped head
# for the embedded target) ---

def default_head_path():
    """The head shipped for the embedded default target (None when the package has none)."""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "data" / "heads" / "smollm2-135m-head.safetensors"
    return path if path.is_file() else None


def split_confidence(arg: str) -> tuple[str, float]:
    """`PATH` or `PATH:MIN_CONFIDENCE` (a number in [0, 1): stop a round once the head's estimate
    that all its drafts are kept falls below it) -> (path, min_confidence)."""
    from pathlib import Path

    path, _, tail = arg.rpartition(":")
    if not path or Path(arg).exists():  # a file whose own name ends in ":<number>" is a path
        return arg, 0.0
    try:
        min_confidence = float(tail)
    except ValueError:
        return arg, 0.0
    if not 0.0 <= min_confidence < 1.0:
        raise ValueError(f"the head's MIN_CONF in {arg!r} must be in [0, 1), got {tail}")
    return path, min_confidence


def _head(target, arg: str) -> HeadDrafter:
    from specdec.drafters.head import load_head_drafter

    path, min_confidence = split_confidence(arg)
    return load_head_drafter(path, target.model, name=f"head:{arg}", min_confidence=min_confidence)


def _combined(target, arg: str, name: str | None = None, sampled: tuple[bool, int | None] | None = None
              ) -> LookupThenHead:
    head = _head(target, arg)
    return LookupThenHead(LookupDrafter(target.model.device), head, name=name,
                          head_max=_head_max(target, head.min_confidence), sampled=sampled)


# The embedded model sampled at T=1 keeps lookup's copied tokens rarely (0.15 of them on Spec-Bench,
# 1.03x) and the head's first draft 0.43 of the time, its second less: on a CPU, head K=1 read 1.21x
# where lookup+head at K=4 (head at most 2) read 1.12x (docs/draft-head.md). So `auto`, when
# sampling, drafts with the head alone, one token a round where verify rows are dear. In bf16 on a
# CPU with bf16 units (rows nearly free) the head at T=1 read 1.30x / 1.31x / 1.34x / 1.25x at
# K = 1 / 2 / 3 / 4 (one run, Spec-Bench, 1 question per category): at most 3 there.
CPU_SAMPLED_HEAD_MAX = 3


def _sampled_head_max(target) -> int | None:
    if not target.model.cheap_verify_rows:
        return 1
    return CPU_SAMPLED_HEAD_MAX if target.model.device.type == "cpu" else None


def _auto(target) -> Drafter:
    """lookup+head with the shipped head when the target is the embedded default, else prompt lookup."""
    from specdec.models.default import DISPLAY_NAME

    path = default_head_path()
    if target.name == DISPLAY_NAME and path is not None:
        sampled = (False, _sampled_head_max(target))
        return _combined(target, str(path), name="lookup+head", sampled=sampled)
    return LookupDrafter(target.model.device)


def _register() -> None:
    from specdec.drafters import NAMED, PREFIXED

    PREFIXED["head"] = lambda target, arg, dtype=None: _head(target, arg)
    PREFIXED["lookup+head"] = lambda target, arg, dtype=None: _combined(target, arg)
    NAMED["auto"] = lambda target, dtype=None: _auto(target)


_register()
