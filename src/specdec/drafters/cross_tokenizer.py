"""A draft model of another tokenizer drafts for the target, exactly (docs/drafts.md).

The draft reads and writes its own ids; the target's text is the truth. Each round the drafter
decodes the text so far (target ids) and encodes it with the draft's tokenizer, and the draft's
cache rolls back to the longest common prefix of those ids with what it holds (a retokenized tail
is fed again). Then one of two ways across the vocabularies:

- TextDrafter (`--draft MODEL`): the draft drafts freely; its new text is re-encoded with the
  target's tokenizer (reencode) and proposed as deterministic target ids, q None (one-hot), as
  lookup's are: exact at any temperature, whatever the draft sampled from.
- IntersectionDrafter (`--draft intersect:MODEL`, Timor et al., ICML 2025): the draft samples among
  the tokens both vocabularies share (SharedTokens), renormalised after warping, and proposes each
  as the target's id of the same string with that q pushed over the target's vocabulary.
"""

from __future__ import annotations

from typing import Callable

import torch

from specdec.drafters.base import Draft, Drafter, empty_draft
from specdec.drafters.model import CATCH_UP_TOKENS, DraftLease, DraftSlots
from specdec.drafters.shared_tokens import REPLACEMENT, SharedTokens, restrict, special_ids
from specdec.models.base import CausalLM
from specdec.sampling import SamplingParams, sample, warp_logits
from specdec.transfers import token_tensor

WINDOW = 16  # target tokens decoded before a boundary: enough for a tokenizer's merges to settle


def decode(tokenizer, ids: list[int]) -> str:
    """ids' text, special tokens included, without the clean-up that makes decoding non-concatenative."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def text_after(tokenizer, context: list[int], new: list[int], window: int = WINDOW) -> str:
    """The whole characters that ids `new` add after ids `context` of the same tokenizer: the text is
    cut at its first U+FFFD (a byte-level token that is half a character, or stray bytes); "" when
    the context's decoding changes with what follows it. E.g. after "a cat", GPT-2's ids of " sat 日"
    but the last (日 is three byte tokens) give " sat ": the two bytes of 日 go.
    """
    tail = context[-window:]
    before, after = decode(tokenizer, tail), decode(tokenizer, tail + new)
    if not after.startswith(before):
        return ""
    return after[len(before):].split(REPLACEMENT, 1)[0]


def reencode(tokenizer, context: list[int], text: str, window: int = WINDOW) -> list[int]:
    """Target ids that continue ids `context` with `text`, a strict continuation: encode(tail + text)
    minus encode(tail), tail the text of the context's last `window` ids (a safe point far enough
    back that merges at the boundary are seen). [] where none exists: the context ends mid-character,
    or its last token would merge with the text (the first re-encoded token would replace it, not
    extend it). Cut before the first special token (never proposed). E.g. GPT-2, after the ids of
    "a cat": " sat on" gives the ids of ' sat', ' on'; after "the hel", "lo" gives [] ('Ġhello').
    """
    tail = decode(tokenizer, context[-window:])
    if not text or tail.endswith(REPLACEMENT):
        return []
    base, ids = encode(tokenizer, tail), encode(tokenizer, tail + text)
    if ids[:len(base)] != base:
        return []
    new = ids[len(base):]
    special = special_ids(tokenizer)
    return new[:next((i for i, t in enumerate(new) if t in special), len(new))]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ForeignDraft:
    """One sequence's draft model of another tokenizer, its cache kept on the true text.

    model: a slot of a DraftSlots (one of its own when alone). fed: the draft ids its cache holds.
    """

    def __init__(self, pool: DraftSlots, draft_tokenizer, target_tokenizer):
        self.pool, self.draft_tokenizer, self.target_tokenizer = pool, draft_tokenizer, target_tokenizer
        self.lease = DraftLease(pool)
        self.fed: list[int] = []
        self.special = special_ids(draft_tokenizer)

    def begin(self) -> None:
        self.lease.begin([])
        self.fed = []

    def draft_ids(self, context: list[int]) -> list[int]:
        """The draft's ids of the text of target ids `context` (its BOS first, if it has one)."""
        ids = encode(self.draft_tokenizer, decode(self.target_tokenizer, context))
        bos = self.draft_tokenizer.bos_token_id
        return [bos] + ids if bos is not None and ids[:1] != [bos] else ids

    def run(self, context: list[int], k: int,
            choose: Callable[[torch.Tensor], int | None]) -> tuple[list[int], list[int]]:
        """(the draft's ids of the text, up to k draft ids chosen after them): choose(logits [V_draft])
        gives the next id, or None to stop. The cache rolls back to what it shares with the text's ids,
        reads the rest, and ends holding them and the chosen ids it read (all but the last unless the
        draft stopped early); `fed` says which."""
        ids = self.draft_ids(context)
        if not ids:  # no text yet and no BOS: nothing to draft after
            return ids, []
        keep = min(common_prefix(self.fed, ids), len(ids) - 1)  # one unseen token at least: its logits
        model, slot = self.pool.model, self.lease.slot
        model.rollback(slot, keep)
        self.fed, unseen = ids[:keep], ids[keep:]
        if len(unseen) > CATCH_UP_TOKENS:  # a long stretch goes in without logits (as catch_up)
            model.forward_ragged([slot], [token_tensor(unseen[:-1], model.device)], logits=[False])
            self.fed, unseen = ids[:-1], ids[-1:]
        chosen: list[int] = []
        while len(chosen) < k:
            logits = model.forward_ragged([slot], [token_tensor(unseen, model.device)]).logits[-1]
            self.fed += unseen
            token = choose(logits)
            if token is None or token in self.special:  # the draft's EOS, a chat marker: the draft ends
                break
            chosen.append(token)
            unseen = [token]
        return ids, chosen

    def end(self) -> None:
        self.lease.end()


class TextDrafter(Drafter):
    """A draft model of another tokenizer whose text is re-encoded into target ids (q None).

    Its own draft is greedy or sampled from its warped q; either way the target sees deterministic
    proposals, so the draft's q is never passed (it is over another vocabulary)."""

    def __init__(self, model: CausalLM, draft_tokenizer, target_tokenizer, name: str,
                 pool: DraftSlots | None = None):
        """pool: a batch's slot model of the draft's weights (for_batch), None: a slot of its own."""
        from specdec.models.slots import own_cache_slot

        self.model, self.name, self.batched = model, name, pool is not None
        pool = pool or DraftSlots(own_cache_slot(model))
        self.draft = ForeignDraft(pool, draft_tokenizer, target_tokenizer)
        self.device = pool.model.device

    def begin(self, prompt: list[int]) -> None:
        self.draft.begin()

    def warm_up(self) -> None:
        self.draft.pool.warm_up()  # a draft slot model's CUDA graphs

    def end(self) -> None:
        self.draft.end()

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        if k < 1:
            return empty_draft(self.device)

        def choose(logits: torch.Tensor) -> int:
            return int(logits.argmax() if params.greedy else sample(warp_logits(logits, params), generator))

        ids, chosen = self.draft.run(context, k, choose)
        text = text_after(self.draft.draft_tokenizer, ids, chosen)
        return Draft(token_tensor(reencode(self.draft.target_tokenizer, context, text)[:k], self.device))

    def for_batch(self, max_slots: int, max_length: int | None = None) -> "TextDrafter":
        """The prototype of a batch: the draft's weights as a slot model, a slot per sequence; each
        sequence drafts on its own (one draft pass a step, not one for the batch)."""
        from specdec.models.slots import slot_model_for

        return self._twin(DraftSlots(slot_model_for(self.model, max_slots, max_length)))

    def fork(self) -> "TextDrafter":
        """Another sequence's drafter on the same slot model (a batch prototype's only)."""
        if not self.batched:
            from specdec.errors import DraftSpecError

            raise DraftSpecError(f"the draft {self.name} holds one sequence's cache: for several sequences "
                                 "build it with for_batch")
        return self._twin(self.draft.pool)

    def _twin(self, pool: DraftSlots) -> "TextDrafter":
        return TextDrafter(self.model, self.draft.draft_tokenizer, self.draft.target_tokenizer, self.name, pool)


class IntersectionDrafter(TextDrafter):
    """Drafts among the tokens both tokenizers share (SharedTokens), with a real q over the target's
    vocabulary: zero outside the intersection, the draft's warped q restricted and renormalised on it."""

    def __init__(self, model: CausalLM, draft_tokenizer, target_tokenizer, name: str, shared: SharedTokens,
                 pool: DraftSlots | None = None):
        super().__init__(model, draft_tokenizer, target_tokenizer, name, pool)
        self.shared = shared

    def _twin(self, pool: DraftSlots) -> "IntersectionDrafter":
        return IntersectionDrafter(self.model, self.draft.draft_tokenizer, self.draft.target_tokenizer, self.name,
                                   self.shared, pool)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        if k < 1:
            return empty_draft(self.device)
        qs: list[torch.Tensor] = []

        def choose(logits: torch.Tensor) -> int | None:
            mask = self.shared.mask_for(logits)
            if params.greedy:
                masked = logits.masked_fill(~mask, float("-inf"))
                return int(masked.argmax()) if bool(mask.any()) else None
            q = restrict(warp_logits(logits, params), mask)  # [V_draft]
            if not bool(q.sum() > 0):
                return None  # all the draft's mass lies outside the intersection
            token = int(sample(q, generator))
            qs.append(self.shared.to_target(q))
            return token

        _, chosen = self.draft.run(context, k, choose)
        tokens = self.shared.target_ids(chosen, self.device)
        return Draft(tokens, torch.stack(qs[:len(chosen)]) if qs and chosen else None)
