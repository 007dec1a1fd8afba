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
from specdec.drafters.head import HeadDrafter, read_head_card, target_identity
from specdec.drafters.head_loading import load_head_drafter
from specdec.drafters.eagle3 import is_eagle3_dir, resolve_head_path
from specdec.drafters.head_batch import head_trees
from specdec.drafters.lookup import LookupDrafter
from specdec.drafters.tree_shape import GrownTree, TreeShape, append_tree, merge_trees
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
        twin = LookupThenHead(self.lookup.fork(), self.head.fork(), self.name, self.min_match, self.head_max,
                              self.sampled)
        twin.tree = self.tree
        return twin

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        return self.propose_batch([self], [context], [k], [params], [generator])[0]

    def with_tree(self, shape: TreeShape) -> "LookupThenHead":
        """Trees of `shape`: lookup's trie of matched continuations (after a match of min_match
        tokens) first, then the head's EAGLE-2 tree merged into it (a path both hold is one path),
        at most k nodes in all; the head's chain limits (head_max) do not apply, k is the budget."""
        twin = LookupThenHead(self.lookup.with_tree(shape), self.head.with_tree(shape), f"tree:{shape}:{self.name}",
                              self.min_match, self.head_max, self.sampled)
        twin.tree = shape
        return twin

    @classmethod
    def propose_batch(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
        """Chains and trees, each kind together (a batch may hold both)."""
        out: list[Draft | None] = [None] * len(drafters)
        for how, trees in ((cls._chains, False), (cls._trees, True)):
            members = [i for i, d in enumerate(drafters) if (d.tree is not None) == trees]
            if members:
                drafts = how([drafters[i] for i in members], [contexts[i] for i in members], [ks[i] for i in members],
                             [params[i] for i in members], [generators[i] for i in members])
                for i, draft in zip(members, drafts):
                    out[i] = draft
        return out

    @classmethod
    def _trees(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
        """Each sequence's lookup trie (when it matched enough) and its head's tree (all the heads'
        trees grown together, head_batch.py) as one tree of at most ks[i] nodes: greedy, merged (a
        path both hold is one path); sampling, the head's drawn tree in the nodes lookup left, every
        draw kept beside lookup's (append_tree)."""
        found = [d._looked_up_tree(c, k, sp) for d, c, k, sp in zip(drafters, contexts, ks, params)]
        left = [i for i, tree in enumerate(found) if len(tree.tokens) < ks[i]]
        budgets = [ks[i] if params[i].greedy else ks[i] - len(found[i].tokens) for i in left]
        heads = head_trees([drafters[i].head for i in left], [contexts[i] for i in left], budgets,
                           [params[i] for i in left], [generators[i] for i in left])
        for i, tree in zip(left, heads):
            found[i] = merge_trees(found[i], tree, ks[i]) if params[i].greedy else append_tree(found[i], tree)
        return [d.lookup.tree_draft(tree) for d, tree in zip(drafters, found)]

    def _looked_up_tree(self, context: list[int], k: int, params: SamplingParams) -> GrownTree:
        """Lookup's trie when it matched min_match tokens or more (and may draft), else an empty tree."""
        if params.greedy or self.sampled[0]:
            matched, tree = self.lookup.find_tree(context, k)
            if matched >= self.min_match:
                return tree
        return GrownTree((), (), ())

    @classmethod
    def _chains(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
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
    """The heads shipped inside the package: data/heads/*.safetensors and EAGLE-3 directories."""
    return sorted([*HEADS_DIR.glob("*.safetensors"), *(p.parent for p in HEADS_DIR.glob("*/config.json"))])


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


def eagle3_drafter(target, arg: str) -> HeadDrafter:
    """`eagle3:PATH[:MIN_CONF]`: an EAGLE-3 checkpoint directory (or hub id) alone; `head:PATH` takes one too."""
    path, min_confidence = split_confidence(arg)
    where = resolve_head_path(path)  # once: a hub id's snapshot is looked up here, not again below
    if not where.exists():
        raise DraftSpecError(f"`eagle3:{arg}`: {path} does not exist (a directory, or a hub id in the hub cache)")
    if not is_eagle3_dir(where):
        raise DraftSpecError(f"`eagle3:{arg}`: {path} is not an EAGLE-3 checkpoint directory (a config.json naming "
                             "LlamaForCausalLMEagle3 beside its weights); for a specdec head file use head:PATH")
    return load_head_drafter(str(where), target.model, name=f"eagle3:{arg}", min_confidence=min_confidence)


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
