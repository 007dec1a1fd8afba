"""Generic backend: any Hugging Face causal LM, with a DynamicCache cropped on rollback."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel

from specdec.models.base import CausalLM, check_feature_layers


class HFCausalLM(CausalLM):
    def __init__(self, model: PreTrainedModel, name: str):
        self.model = model.eval()
        self.name = name
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device
        # transformers renamed `past_key_values` to `cache` in 5.x; accept both.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._can_skip_logits = "logits_to_keep" in params
        self._cache = DynamicCache()

    def with_own_cache(self) -> "HFCausalLM":
        """Another backend over the same weights, with an empty cache of its own (one per sequence)."""
        return HFCausalLM(self.model, self.name)

    @property
    def cache_len(self) -> int:
        return self._cache.get_seq_length()

    def rollback(self, length: int) -> None:
        extra = self.cache_len - length
        if extra < 0:
            raise ValueError(f"cannot roll back to {length}: the cache holds only {self.cache_len}")
        if length == 0:
            self._cache = DynamicCache()
        elif extra > 0:
            self._cache.crop(-extra)  # negative: remove that many (the form every version accepts)

    @torch.inference_mode()
    def _run(self, tokens: torch.Tensor, hidden: bool, **extra):
        return self.model(
            input_ids=tokens[None],
            use_cache=True,
            output_hidden_states=hidden,
            **{self._cache_kwarg: self._cache},
            **extra,
        )

    def extend(self, tokens: torch.Tensor) -> None:
        # logits for the last position only: the LM head over a whole prompt is wasted work.
        self._run(tokens, hidden=False, **({"logits_to_keep": 1} if self._can_skip_logits else {}))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._run(tokens, hidden=False).logits[0].float()

    def forward_with_hidden(self, tokens: torch.Tensor, layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        layers = check_feature_layers(layers, self.model.config.num_hidden_layers) if layers else ()
        out = self._run(tokens, hidden=True)
        # hidden_states: the embeddings, then each layer's output; the last one after the final norm.
        states = [out.hidden_states[i + 1][0] for i in layers] + [out.hidden_states[-1][0]]
        return out.logits[0].float(), torch.cat(states, dim=-1) if layers else states[0]
