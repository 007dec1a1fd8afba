"""Generic backend: any Hugging Face causal LM, with a DynamicCache cropped on rollback.

A tree pass gives the model a custom 4D additive mask [1, 1, n, start + n] (the cache and each row's
own path visible) and explicit position_ids start + depth; transformers (5.x: masking_utils) takes
a 4D mask as it is, and the cache appends every row. keep_rows moves the kept path's entries of each
layer to start.. and crops the rest."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel

from specdec.models.base import CausalLM, check_feature_layers
from specdec.models.tree_rows import causal_or_tree, row_positions, sees
from specdec.trees import check_kept_rows


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
    def keep_rows(self, start: int, rows) -> None:
        """CausalLM.keep_rows: each layer's kept entries copied to start.., then the rest cropped."""
        check_kept_rows(rows, start, self.cache_len)
        if list(rows) != list(range(len(rows))):
            src = torch.tensor([start + r for r in rows], device=self.device)
            for layer in self._full_layers():
                layer.keys[..., start:start + len(rows), :] = layer.keys.index_select(-2, src)
                layer.values[..., start:start + len(rows), :] = layer.values.index_select(-2, src)
        self.rollback(start + len(rows))

    def _full_layers(self) -> list:
        """The cache's layers, each holding every token (no sliding window: the only kind whose
        entries sit at their own index), or a NotImplementedError."""
        layers = self._cache.layers
        if any(layer.keys is None or layer.keys.shape[-2] != self.cache_len for layer in layers):
            raise NotImplementedError(f"{self.name}: its cache does not hold every token in every layer "
                                      "(a sliding window?), so a tree's path cannot be kept")
        return layers

    def _tree_inputs(self, tree: tuple[int, ...] | None, n: int) -> dict:
        """The model's extra inputs for a tree pass over n tokens (none for causal rows): a 4D
        additive mask [1, 1, n, start + n] and position_ids [1, n] = start + depth."""
        tree = causal_or_tree(tree, n)
        if tree is None:
            return {}
        self._check_full_attention()
        start = self.cache_len
        visible = torch.cat([torch.ones(n, start, dtype=torch.bool), sees(tree)], dim=1)  # [n, start + n]
        dtype = self.model.get_input_embeddings().weight.dtype
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
        return {"attention_mask": mask[None, None].to(self.device),
                "position_ids": row_positions(start, n, tree)[None].to(self.device)}

    def _check_full_attention(self) -> None:
        """A NotImplementedError where a sliding window would need a mask of its own."""
        config = self.model.config
        kinds = getattr(config, "layer_types", None) or (["sliding_attention"] if getattr(config, "sliding_window", None)
                                                         else ["full_attention"])
        if any(kind != "full_attention" for kind in kinds):
            raise NotImplementedError(f"{self.name} has sliding-window attention layers: its tree passes "
                                      "are not implemented (draft chains for it)")

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

    def forward(self, tokens: torch.Tensor, tree: tuple[int, ...] | None = None) -> torch.Tensor:
        extra = self._tree_inputs(tree, tokens.shape[0])
        return self._run(tokens, hidden=False, **extra).logits[0].float()

    def forward_with_hidden(self, tokens: torch.Tensor, layers: tuple[int, ...] = (),
                            tree: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        layers = check_feature_layers(layers, self.model.config.num_hidden_layers) if layers else ()
        out = self._run(tokens, hidden=True, **self._tree_inputs(tree, tokens.shape[0]))
        # hidden_states: the embeddings, then each layer's output; the last one after the final norm.
        states = [out.hidden_states[i + 1][0] for i in layers] + [out.hidden_states[-1][0]]
        return out.logits[0].float(), torch.cat(states, dim=-1) if layers else states[0]
