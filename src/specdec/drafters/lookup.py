"""Prompt lookup: copy what followed the last time the text's tail appeared (Saxena 2023)."""

from __future__ import annotations

import torch

from specdec.transfers import token_tensor
from specdec.drafters.base import Draft, Drafter
from specdec.sampling import SamplingParams


def lookup_match(seq: list[int], k: int, max_ngram: int = 3) -> tuple[int, list[int]]:
    """(n, up to k tokens that followed the most recent earlier occurrence of the last n tokens).

    n goes from max_ngram down to 1; the first n with a match wins. (0, []) when nothing matches.
    """
    length = len(seq)
    if k < 1:
        return 0, []
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = seq[length - n:]
        for start in range(length - n - 1, -1, -1):  # most recent first, and it must not be the tail itself
            if seq[start:start + n] == tail:
                return n, seq[start + n:start + n + k]
    return 0, []


def lookup_draft(seq: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens.

    n goes from max_ngram down to 1; the first n with a match wins. [] when nothing matches.

    >>> lookup_draft([5, 6, 7, 8, 9, 5, 6, 7], k=3)   # tail [5, 6, 7] appeared at 0, then 8 9 5
    [8, 9, 5]
    >>> lookup_draft([1, 2, 3, 4], k=2)
    []
    """
    return lookup_match(seq, k, max_ngram)[1]


def draft_length(matched: int, k: int, max_ngram: int) -> int:
    """How many of the found tokens to draft: a full max_ngram match earns all k, a shorter match of
    n tokens only n. A short match is weak evidence, and on a CPU every drafted row costs verify
    time (docs/measuring.md, "Prompt lookup: how much to draft")."""
    return k if matched >= max_ngram else min(k, matched)


class LookupDrafter(Drafter):
    """Drafts by prompt lookup. Its choice is deterministic, so q is one-hot (None).

    adaptive: draft only `draft_length(n, k)` tokens after an n-token match (default); False drafts
    all k found tokens whatever the match, as `lookup_draft` does.
    """

    name = "lookup"

    def __init__(self, device: torch.device, max_ngram: int = 3, adaptive: bool = True):
        self.device = device
        self.max_ngram = max_ngram
        self.adaptive = adaptive

    def find(self, context: list[int], k: int) -> tuple[int, list[int]]:
        """(length of the matched tail, the tokens this drafter would propose)."""
        matched, found = lookup_match(context, k, self.max_ngram)
        if self.adaptive:
            found = found[:draft_length(matched, k, self.max_ngram)]
        return matched, found

    def propose(self, context: list[int], k: int, params: SamplingParams, generator) -> Draft:
        return self.draft_of(self.find(context, k)[1])

    def fork(self) -> "LookupDrafter":
        return LookupDrafter(self.device, self.max_ngram, self.adaptive)  # it keeps no per-sequence state

    def draft_of(self, tokens: list[int]) -> Draft:
        return Draft(token_tensor(tokens, self.device))
