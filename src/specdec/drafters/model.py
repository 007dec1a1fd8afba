"""A smaller model of the same tokenizer drafts K tokens, one forward step each."""

from __future__ import annotations

import torch

from specdec.transfers import token_tensor
from specdec.drafters.base import Draft, Drafter, empty_draft
from specdec.models.base import CausalLM
from specdec.sampling import SamplingParams, sample, warp_logits


class ModelDrafter(Drafter):
    """Drafts with its own model and KV cache.

    Greedy: argmax, q one-hot (None). Sampling: draws from the warped q and records exactly that q.
    `vocab_size` is the target's logit width: a draft with fewer logit rows (a smaller padded
    embedding) gets zero probability on the extra ids.
    """

    def __init__(self, model: CausalLM, vocab_size: int, name: str | None = None):
        self.model = model
        self.vocab_size = vocab_size
        self.name = name or model.name

    def begin(self, prompt: list[int]) -> None:
        self.model.reset()
        if len(prompt) > 1:
            self.model.extend(self._tensor(prompt[:-1]))

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        if k < 1:
            return empty_draft(self.model.device)
        fresh = self._tensor(context[self.model.cache_len:])  # the text its cache has not seen yet
        tokens, qs = [], []
        for _ in range(k):
            logits = self._fit(self.model.forward(fresh)[-1])  # [V]
            if params.greedy:
                token = logits.argmax(-1)
            else:
                q = warp_logits(logits, params)
                token = sample(q, generator)
                qs.append(q)
            tokens.append(token)
            fresh = token.reshape(1)
        # The last token was never fed: the cache covers context + tokens[:-1].
        return Draft(torch.stack(tokens), torch.stack(qs) if qs else None)

    def commit(self, num_valid: int) -> None:
        if self.model.cache_len > num_valid:
            self.model.rollback(num_valid)

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Pad or cut the draft's logits [V_draft] to the target's width."""
        extra = self.vocab_size - logits.shape[-1]
        if extra > 0:
            return torch.cat([logits, logits.new_full((extra,), float("-inf"))])
        return logits[: self.vocab_size]

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        return token_tensor(ids, self.model.device)
