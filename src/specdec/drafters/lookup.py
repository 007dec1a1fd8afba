"""Prompt lookup: copy what followed the last time the text's tail appeared (Saxena 2023)."""

from __future__ import annotations

import torch

from specdec.transfers import token_tensor
from specdec.drafters.base import Draft, Drafter
from specdec.drafters.tree_shape import GrownTree, TreeShape, keep_best
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


def lookup_continuations(seq: list[int], length: int, branches: int,
                         max_ngram: int = 3) -> tuple[int, list[list[int]]]:
    """(n, what followed the earlier occurrences of the last n tokens, up to `length` tokens each),
    most recent first, until `branches` distinct continuations are found (repeats of one are kept:
    they count as evidence). n as in lookup_match: the longest tail with an earlier occurrence.

    >>> lookup_continuations([1, 2, 7, 1, 2, 8, 9, 1, 2], length=2, branches=3)
    (2, [[8, 9], [7, 1]])
    """
    matched, _ = lookup_match(seq, 1, max_ngram)
    found: list[list[int]] = []
    if matched == 0:
        return 0, found
    end, tail = len(seq), seq[len(seq) - matched:]
    for start in range(end - matched - 1, -1, -1):
        if seq[start:start + matched] == tail:
            found.append(seq[start + matched:start + matched + length])
            if len({tuple(c) for c in found}) == branches:
                break
    return matched, found


def continuation_trie(continuations: list[list[int]], budget: int) -> GrownTree:
    """The continuations merged into a trie (a shared prefix is one path), its best `budget` nodes:
    a node's score is how many continuations pass through it (ties: the shallower, then the more
    recent), so siblings are tried most frequent first."""
    at: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    tokens: list[int] = []
    parents: list[int] = []
    counts: list[float] = []
    for continuation in continuations:
        parent = -1
        for token in continuation:
            if (parent, token) not in at:
                at[parent, token] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                counts.append(0.0)
            parent = at[parent, token]
            counts[parent] += 1.0
    return keep_best(tokens, parents, counts, budget)


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

    def find_tree(self, context: list[int], k: int) -> tuple[int, GrownTree]:
        """(length of the matched tail, the trie of up to k nodes this drafter would propose): up to
        tree.branch continuations of up to tree.depth tokens each (adaptive: as draft_length says)."""
        shape = self.tree or TreeShape()
        matched, found = lookup_continuations(context, shape.depth, shape.branch, self.max_ngram)
        if self.adaptive:
            found = [c[:draft_length(matched, shape.depth, self.max_ngram)] for c in found]
        return matched, continuation_trie(found, k)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator) -> Draft:
        if self.tree is not None:
            return self.tree_draft(self.find_tree(context, k)[1])
        return self.draft_of(self.find(context, k)[1])

    def fork(self) -> "LookupDrafter":
        twin = LookupDrafter(self.device, self.max_ngram, self.adaptive)  # it keeps no per-sequence state
        twin.tree = self.tree
        return twin

    def with_tree(self, shape: TreeShape) -> "LookupDrafter":
        """Lookup drafting several matched continuations as branches of a trie (find_tree)."""
        twin = self.fork()
        twin.tree, twin.name = shape, f"tree:{shape}:{self.name}"
        return twin

    def tree_draft(self, tree: GrownTree) -> Draft:
        return Draft(token_tensor(list(tree.tokens), self.device), tree.q, tree.parents)

    def draft_of(self, tokens: list[int]) -> Draft:
        return Draft(token_tensor(tokens, self.device))
