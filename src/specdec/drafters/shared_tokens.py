"""The tokens two vocabularies share, for drafting across tokenizers by intersection (Timor et al. 2025).

A token's surface is the text it adds after an ordinary token (so SentencePiece's `▁the` and
byte-level BPE's `Ġthe` both read " the", and a word-level token its joining space); tokens of one
surface in both vocabularies, neither special, none half a character, are shared. Drafting only
among them gives a q over the target's vocabulary: zero outside, the draft's restricted mass inside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.transfers import token_tensor

REPLACEMENT = "\ufffd"  # what decoding gives for the bytes of an incomplete UTF-8 character


def special_ids(tokenizer) -> set[int]:
    """The tokenizer's special ids: BOS, EOS, UNK, PAD and every added token marked special (a chat
    template's markers). Never proposed, never shared."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if getattr(token, "special", False)}


def restrict(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [V] restricted to mask [V] (bool) and renormalised: the distribution the draft samples from
    and the one it passes on (all zero when q has no mass on mask)."""
    kept = q * mask
    total = kept.sum()
    return kept / total if bool(total > 0) else kept


def surfaces(tokenizer, size: int) -> dict[str, int]:
    """{surface: id} of the tokenizer's first `size` ids that are not special and decode to whole
    characters (the first id of a surface wins)."""
    special = special_ids(tokenizer)
    anchor = next(i for i in range(size) if i not in special)
    before = tokenizer.decode([anchor], clean_up_tokenization_spaces=False)
    texts = tokenizer.batch_decode([[anchor, i] for i in range(size)], clean_up_tokenization_spaces=False)
    out: dict[str, int] = {}
    for i, text in enumerate(texts):
        surface = text[len(before):] if text.startswith(before) else ""
        if i not in special and surface and REPLACEMENT not in surface:
            out.setdefault(surface, i)
    return out


@dataclass(frozen=True)
class SharedTokens:
    """target_of: [V_draft] long, the target id of each draft id of a shared surface, -1 elsewhere."""

    target_of: torch.Tensor
    target_vocab: int  # the target's logit width: q rows are this wide

    @classmethod
    def between(cls, draft_tokenizer, target_tokenizer, draft_vocab: int, target_vocab: int,
                device: torch.device) -> "SharedTokens":
        """The table for a draft of draft_vocab logits and a target of target_vocab logits."""
        target = surfaces(target_tokenizer, min(len(target_tokenizer), target_vocab))
        target_of = torch.full((draft_vocab,), -1, dtype=torch.long)
        for surface, i in surfaces(draft_tokenizer, min(len(draft_tokenizer), draft_vocab)).items():
            target_of[i] = target.get(surface, -1)
        return cls(target_of.to(device), target_vocab)

    @property
    def size(self) -> int:
        return int((self.target_of >= 0).sum())

    def mask_for(self, logits: torch.Tensor) -> torch.Tensor:
        """[V_draft] bool: which of the draft's logits [V_draft] are shared tokens."""
        return self.target_of[:logits.shape[-1]] >= 0

    def to_target(self, q: torch.Tensor) -> torch.Tensor:
        """The draft's q [V_draft] (zero outside the intersection) over the target's ids [V_target]."""
        mask = self.mask_for(q)
        out = q.new_zeros(self.target_vocab)
        return out.index_add_(0, self.target_of[:q.shape[-1]][mask], q[mask])

    def target_ids(self, draft_ids: list[int], device: torch.device) -> torch.Tensor:
        """[n] long: the target's ids of shared draft ids."""
        return self.target_of[token_tensor(draft_ids, self.target_of.device)].to(device)  # one gather, no host reads
