"""What a rank builds a named target from (launch.open_tensor_parallel's recipe), as the CLI names it."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import ModelLoadError
from specdec.models.llama_config import arch_from_hf, unsupported_reason
from specdec.models.llama_net import LlamaNet
from specdec.models.native_llama import cache_slots, net_from_hf


@dataclass(frozen=True)
class NamedTarget:
    """A target as `--target` names it, loaded on the host in `dtype` by every rank (each then keeps
    its own share on its device; the whole copy is dropped)."""

    name: str
    dtype: str
    max_length: int = 4096

    def __call__(self) -> tuple[LlamaNet, str, int]:
        return self.build(self.load())

    def load(self):
        """The transformers model on the host, with its tokenizer (loader.LoadedModel)."""
        from specdec.models.loader import load_model

        return load_model(self.name, device="cpu", dtype=self.dtype, backend="hf")

    def build(self, loaded) -> tuple[LlamaNet, str, int]:
        """What __call__ returns, from what load() returned."""
        hf = loaded.model.model
        reason = unsupported_reason(hf.config)
        if reason:
            raise ModelLoadError(f"tensor parallelism runs the native Llama-family model, and {self.name!r} "
                                 f"is not one: {reason}")
        max_length = min(self.max_length, arch_from_hf(hf.config).max_position)
        return net_from_hf(hf, cache_slots(max_length, {})), loaded.name, max_length
